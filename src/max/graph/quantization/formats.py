"""Every weight format libremax knows, one row each: the single table the rest derives from.

A row says what a GGML tensor type (or a float storage) is: its GGML id, its block layout,
whether :class:`~max.graph.quantization.QuantizationEncoding` names it, whether float weights
can be quantised to it on load, and the unit the native kernels repack it in.  Encoding
lists, CLI choices and help texts, registry entries, GGUF type names and the native kernels'
kind codes are all computed from :data:`FORMATS`; the C kernels (``engine/native/csrc``) hold
the byte layouts themselves.

Adding a block format = one row here + its codec functions (``codec.py``) (+ C kernels).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = [
    "FILE_TYPE_TO_GGML",
    "FORMATS",
    "Format",
    "GGML_TYPE_NAMES",
    "block_formats",
    "by_ggml_id",
    "encoding_formats",
    "encoding_help",
    "by_name",
    "encoding_names",
    "float_formats",
    "quantizable_on_load",
]

QK_K = 256


@dataclass(frozen=True)
class Format:
    """One weight format.

    ``name``: GGML's spelling (``"Q4_K"``, ``"F32"``); ``ggml_id``: its ``ggml_type`` number;
    ``elements_per_block`` values are stored in ``block_size`` bytes (floats: one value);
    ``encoding``: a weight encoding users can ask for (``--quantization-encoding``), spelled
    ``user_name``; ``quantize_on_load``: float weights can be quantised to it at load;
    ``packed_unit``: ``(elements, bytes)`` of the native kernels' interleaved layout, per 16 rows;
    ``loadable``: libremax reads tensors of this type at all; ``ggml_id`` None: not a GGML type
    (float8 storage, GPTQ).
    """

    name: str
    ggml_id: Optional[int]
    elements_per_block: int = 1
    block_size: int = 0
    encoding: bool = False
    user_name: Optional[str] = None
    quantize_on_load: bool = False
    packed_unit: Optional[tuple[int, int]] = None
    loadable: bool = False
    is_float: bool = False

    @property
    def is_block(self) -> bool:
        """A block-quantised GGML kind (``Q*``) libremax loads."""
        return not self.is_float and self.loadable and self.ggml_id is not None


def _blk(name: str, gid: int, epb: int, nbytes: int, *, on_load: bool = False,
         packed: Optional[tuple[int, int]] = None) -> Format:
    return Format(name, gid, epb, nbytes, encoding=True, user_name=name.lower(), quantize_on_load=on_load,
                  packed_unit=packed, loadable=True)


def _flt(name: str, gid: int, nbytes: int, user: str) -> Format:
    return Format(name, gid, 1, nbytes, encoding=False, user_name=user, loadable=True, is_float=True)


def _other(name: str, gid: int) -> Format:  # a GGML type libremax names but does not load
    return Format(name, gid)


FORMATS: tuple[Format, ...] = (
    _flt("F32", 0, 4, "float32"),
    _flt("BF16", 30, 2, "bfloat16"),
    _flt("F16", 1, 2, "float16"),
    Format("F8_E4M3", None, 1, 1, user_name="float8_e4m3fn", loadable=True, is_float=True),
    _blk("Q4_0", 2, 32, 2 + 16, on_load=True, packed=(32, 288)),
    _blk("Q4_1", 3, 32, 2 + 2 + 16, on_load=True, packed=(32, 320)),
    _blk("Q5_0", 6, 32, 2 + 4 + 16, on_load=True, packed=(32, 352)),
    _blk("Q5_1", 7, 32, 2 + 2 + 4 + 16, on_load=True, packed=(32, 384)),
    _blk("Q8_0", 8, 32, 2 + 32, on_load=True, packed=(32, 544)),
    _blk("Q4_K", 12, QK_K, 2 + 2 + 12 + QK_K // 2, packed=(256, 2368)),
    _blk("Q5_K", 13, QK_K, 2 + 2 + 12 + QK_K // 8 + QK_K // 2, packed=(256, 2880)),
    _blk("Q6_K", 14, QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2, packed=(256, 3360)),
    _blk("Q2_K", 10, QK_K, QK_K // 16 + QK_K // 4 + 2 + 2),
    _blk("Q3_K", 11, QK_K, QK_K // 8 + QK_K // 4 + 12 + 2),
    # GPTQ packs 4-bit values, 32 in 16 bytes; the graph's GPTQ rows end with their float16 group scales and
    # GPTQ / AWQ checkpoints are repacked to Q4_0 / Q4_1 blocks at load (``gptq.py``).
    Format("GPTQ", None, 32, 16, encoding=True, user_name="gptq", loadable=True),
    _other("Q8_1", 9), _other("Q8_K", 15), _other("IQ2_XXS", 16), _other("IQ2_XS", 17), _other("IQ3_XXS", 18),
    _other("IQ1_S", 19), _other("IQ4_NL", 20), _other("IQ3_S", 21), _other("IQ2_S", 22), _other("IQ4_XS", 23),
    _other("I8", 24), _other("I16", 25), _other("I32", 26), _other("I64", 27), _other("F64", 28),
    _other("IQ1_M", 29),
)

_BY_NAME = {f.name: f for f in FORMATS}
_BY_ID = {f.ggml_id: f for f in FORMATS if f.ggml_id is not None}

GGML_TYPE_NAMES: dict[int, str] = {i: _BY_ID[i].name for i in sorted(_BY_ID)}
"""``ggml_type`` number -> GGML name, for every type a GGUF file may contain."""

FILE_TYPE_TO_GGML: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K",
    12: "Q3_K", 13: "Q3_K", 14: "Q4_K", 15: "Q4_K", 16: "Q5_K", 17: "Q5_K", 18: "Q6_K", 32: "BF16",
}
"""llama.cpp's ``general.file_type`` (``LLAMA_FTYPE_*``) -> the dominant GGML type of such a file."""


def by_name(name: str) -> Format:
    """The row of a GGML name or a user encoding name (``"Q4_K"``, ``"q4_k"``, ``"bfloat16"``)."""
    f = _BY_NAME.get(name.upper())
    if f is None:
        f = next((r for r in FORMATS if r.user_name == name.lower()), None)
    if f is None:
        raise KeyError(f"unknown weight format {name!r}; known: {', '.join(encoding_names())}")
    return f


def by_ggml_id(ggml_id: int) -> Format:
    """The row of a ``ggml_type`` number."""
    return _BY_ID[int(ggml_id)]


def block_formats() -> list[Format]:
    """The GGML block kinds libremax loads (the ``QuantizationEncoding`` members besides GPTQ)."""
    return [f for f in FORMATS if f.is_block]


def encoding_formats() -> list[Format]:
    """The rows :class:`~max.graph.quantization.QuantizationEncoding` names (GGML blocks, then GPTQ)."""
    return [f for f in FORMATS if f.encoding]


def float_formats(*, ggml: bool = False) -> list[Format]:
    """The float storages (float32, bfloat16, float16, float8); ``ggml``: only those GGUF stores."""
    return [f for f in FORMATS if f.is_float and (f.ggml_id is not None or not ggml)]


def quantizable_on_load() -> list[Format]:
    """Block kinds float weights can be quantised to when loaded."""
    return [f for f in FORMATS if f.quantize_on_load]


def encoding_names(*, ggml_only: bool = False) -> list[str]:
    """User-facing encoding names in table order (``float32`` ... ``q3_k``, ``gptq``);
    ``ggml_only``: those a GGUF file can hold (no float8, no GPTQ)."""
    return [f.user_name for f in FORMATS
            if f.loadable and f.user_name and (f.ggml_id is not None or not ggml_only)]


def encoding_help() -> str:
    """The help text of ``--quantization-encoding`` (CLI and ``PipelineConfig``)."""
    on_load = ", ".join(f.user_name or f.name for f in quantizable_on_load())
    floats = ", ".join(f.user_name or f.name for f in float_formats(ggml=True))
    return (f"Weight encoding to run: {', '.join(encoding_names())}.  Default: the weights' own (a quantised "
            f"GGUF stays quantised on the CPU).  A quantised GGUF can also be dequantised on load ({floats}); "
            f"float weights can be quantised on load ({on_load}).")
