"""libremax's native CPU kernels: a small C library compiled on first use (see ``build.py``).

``lib()`` returns the process's library (``None`` when it is disabled or cannot be built), which the
backend policy (``max.engine.backend``) reads once to decide; kernels never ask it: the native lowering
writes the variant to run into each node and the kernel takes :func:`library` of it.  The wrappers here
take torch tensors and call the C functions through ctypes with raw pointers (on the library passed as
``so``, the process's by default); they do not check shapes beyond what the C code needs -- the graph
ops' type rules did that.
"""

from __future__ import annotations

import ctypes
import threading
import warnings
from fractions import Fraction
from typing import Sequence

import torch

from max.engine.native.build import NativeBuildError, choose, library_path, runnable
from max.graph.quantization.codec import register_quantizer
from max.graph.quantization.formats import FORMATS, by_ggml_id, quantizable_on_load

__all__ = ["ACT_REFINE_DEFAULT", "ACT_REFINE_THRESHOLD_DEFAULT", "GGML_KINDS", "MatmulPlan", "NativeBuildError",
           "act_refine", "act_refine_stats", "act_refine_threshold", "available", "dense_kind", "glu", "isa", "lib",
           "library", "pack", "packable", "packed_nbytes", "packed_row", "qmatmul", "rmsnorm", "runnable",
           "set_act_refine", "set_act_refine_threshold"]

# gguf GGMLQuantizationType values of the kinds the kernels read (every loadable row of the format table).
GGML_KINDS = {f.name: f.ggml_id for f in FORMATS if f.loadable and f.ggml_id is not None}

_lock = threading.Lock()
_libs: dict[str, ctypes.CDLL | None] = {}
_errors: dict[str, str] = {}

_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_INT = ctypes.c_int


_F = ctypes.c_float


class PackedPlan(ctypes.Structure):
    """One packed-weights call of a :class:`MatmulPlan` bound for ``lmx_packed_call`` (``csrc/qpacked.c``):
    ``act`` -1 plain (a residual may be passed per call), 0 / 1 the gate (silu / gelu tanh) of [gate | up]."""

    _fields_ = [("K", _I64), ("nw", _I64), ("w", _P), ("kinds", _P), ("N", _P), ("bias", _P), ("norm_w", _P),
                ("norm_eps", _F), ("act", ctypes.c_int32)]


class QkvAttention(ctypes.Structure):
    """A layer's settings of ``lmx_qkv_attention`` (``csrc/attention.c``), bound once."""

    _fields_ = [("H", _I64), ("Hkv", _I64), ("D", _I64), ("freqs", _P), ("max_pos", _I64), ("R", _I64),
                ("interleaved", _I64), ("q_gamma", _P), ("k_gamma", _P), ("eps", _F), ("scale", _F),
                ("kv_kind", _I64), ("s_page", _I64), ("s_kv", _I64), ("s_layer", _I64), ("s_off", _I64),
                ("layer", _I64), ("page_size", _I64), ("window", _I64), ("chunk", _I64), ("causal", _I64)]


def _declare(so: ctypes.CDLL) -> None:
    for name in ("lmx_qmatmul", "lmx_dense_matmul"):
        fn = getattr(so, name)
        fn.argtypes = [_I64, _I64, _P, _I64, _INT, _P, _P, _P, _P, _P, _P, _I64, _INT, _P, _F]
        fn.restype = _INT
    so.lmx_gather_rows.argtypes = [_INT, _P, _I64, _I64, _I64, _P, _I64, _P]
    so.lmx_gather_rows.restype = _INT
    so.lmx_dequant_row.argtypes = [_INT, _P, _P, _I64]
    so.lmx_dequant_row.restype = _INT
    so.lmx_rmsnorm.argtypes = [_P, _I64, _I64, _I64, _P, _F, _P, _I64]
    so.lmx_rmsnorm.restype = None
    so.lmx_glu.argtypes = [_P, _I64, _I64, _I64, _INT, _P, _I64]
    so.lmx_glu.restype = None
    so.lmx_qkv_rope_store.argtypes = [_P, _I64, _I64, _I64, _I64, _I64, _P, _P, _I64, _I64, _INT, _P, _P, _F, _P,
                                      _P, _INT, _I64, _I64, _I64, _I64, _I64, _P, _P]
    so.lmx_qkv_rope_store.restype = _INT
    so.lmx_paged_attention.argtypes = [_P, _I64, _I64, _I64, _I64, _I64, _P, _P, _P, _I64, _I64, _P, _INT,
                                       _I64, _I64, _I64, _I64, _I64, _F, _I64, _I64, _INT, _P]
    so.lmx_paged_attention.restype = _INT
    so.lmx_qkv_attention.argtypes = [_P, _P, _I64, _I64, _P, _P, _P, _I64, _P, _P, _P, _I64, _P, _P]
    so.lmx_qkv_attention.restype = _INT
    so.lmx_quantize.argtypes = [_INT, _P, _I64, _I64, _I64, _P]
    so.lmx_quantize.restype = _INT
    so.lmx_packed_bytes.argtypes = [_INT, _I64, _I64]
    so.lmx_packed_bytes.restype = _I64
    so.lmx_pack.argtypes = [_INT, _P, _I64, _I64, _I64, _P]
    so.lmx_pack.restype = _INT
    so.lmx_packed_row.argtypes = [_INT, _P, _I64, _I64, _I64, _P]
    so.lmx_packed_row.restype = _INT
    so.lmx_packed_matmul.argtypes = [_I64, _I64, _P, _I64, _INT, _P, _P, _P, _P, _P, _I64, _INT, _P, _F]
    so.lmx_packed_matmul.restype = _INT
    so.lmx_packed_matmul_res.argtypes = [_I64, _I64, _P, _I64, _INT, _P, _P, _P, _P, _P, _I64, _INT, _P, _F, _P, _I64]
    so.lmx_packed_matmul_res.restype = _INT
    so.lmx_packed_matmul_glu.argtypes = [_I64, _I64, _P, _I64, _INT, _P, _P, _P, _P, _P, _I64, _INT, _P, _F, _INT]
    so.lmx_packed_matmul_glu.restype = _INT
    so.lmx_packed_call.argtypes = [_P, _I64, _P, _I64, _P, _I64, _P, _I64]
    so.lmx_packed_call.restype = _INT
    so.lmx_packed_rows_f32.argtypes = [_INT, _P, _I64, _I64, _I64, _I64, _P]
    so.lmx_packed_rows_f32.restype = _INT
    so.lmx_conv1d_decode.argtypes = [_I64, _I64, _I64, _P, _I64, _P, _P, _P, _P, _I64, _INT, _P]
    so.lmx_conv1d_decode.restype = _INT
    so.lmx_ssd_decode.argtypes = [_I64, _I64, _I64, _I64, _I64, _P, _I64, _P, _I64, _P, _P, _P, _I64, _P, _P, _INT, _F,
                                  _F, _P, _P, _I64, _P]
    so.lmx_ssd_decode.restype = _INT
    so.lmx_gdr_decode.argtypes = [_I64, _I64, _I64, _I64, _I64, _P, _I64, _P, _I64, _P, _I64, _P, _P, _I64, _P, _P,
                                  _INT, _INT, _F, _P, _P, _I64, _P]
    so.lmx_gdr_decode.restype = _INT
    so.lmx_gated_rmsnorm.argtypes = [_P, _I64, _I64, _I64, _P, _I64, _P, _I64, _F, _INT, _P]
    so.lmx_gated_rmsnorm.restype = None
    so.lmx_moe_ffn.argtypes = [_I64, _I64, _I64, _I64, _I64, _P, _I64, _P, _P, _P, _P, _P, _P, _P, _P, _INT, _F, _F,
                               _P, _P]
    so.lmx_moe_ffn.restype = _INT
    so.lmx_simd.argtypes = []
    so.lmx_simd.restype = ctypes.c_char_p
    so.lmx_pack_layout.argtypes = []
    so.lmx_pack_layout.restype = ctypes.c_char_p
    so.lmx_checksum.argtypes = [_P, _I64]
    so.lmx_checksum.restype = ctypes.c_uint64
    so.lmx_set_act_refine_threshold.argtypes = [_F]
    so.lmx_set_act_refine_threshold.restype = None
    so.lmx_act_refine_threshold.argtypes = []
    so.lmx_act_refine_threshold.restype = _F
    so.lmx_act_refine_stats.argtypes = [_P, _INT]
    so.lmx_act_refine_stats.restype = None
    so.lmx_set_act_refine.argtypes = [_INT, _INT]
    so.lmx_set_act_refine.restype = None
    so.lmx_act_refine_fraction.argtypes = []
    so.lmx_act_refine_fraction.restype = ctypes.c_double


_UNSET = object()
_default: object = _UNSET


def lib(isa: str | None = None) -> ctypes.CDLL | None:
    """The native library of variant ``isa`` (see ``build.VARIANTS``), or None if disabled/unbuildable.

    The default (``LIBREMAX_NATIVE=0`` disables it; ``LIBREMAX_NATIVE_ISA`` forces a variant, else the
    best this CPU runs; both read by ``max.engine.backend.environment``) is resolved once per process.
    A forced variant this CPU cannot run raises :class:`NativeBuildError` naming the ones it can."""
    global _default
    if isa is None:
        if _default is not _UNSET:
            return _default  # type: ignore[return-value]
        from max.engine.backend import environment

        env = environment()
        if not env.native:
            _default = None
            return None
        _default = lib(choose(env.isa))
        return _default  # type: ignore[return-value]
    isa = choose(isa)
    so = _libs.get(isa, False)
    if so is not False:
        return so  # type: ignore[return-value]
    with _lock:
        if isa in _libs:
            return _libs[isa]
        try:
            path = library_path(isa)
            so = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
            _declare(so)
        except (NativeBuildError, OSError) as e:
            _errors[isa] = str(e)
            warnings.warn(f"libremax: native CPU kernels ({isa}) unavailable ({e}); using torch kernels",
                          RuntimeWarning, stacklevel=2)
            so = None
        if so is not None:
            so.lmx_set_act_refine(*_act_refine)
            so.lmx_set_act_refine_threshold(_act_refine_thr)
        _libs[isa] = so
        return so


def library(variant: str) -> ctypes.CDLL:
    """The loaded library of ``variant``, the kernel variant a node's ``native`` attribute names (the
    backend policy chose it at lowering); :class:`NativeBuildError` when it cannot be loaded."""
    so = _libs.get(variant)
    if so is not None:
        return so
    so = lib(variant)
    if so is None:
        raise NativeBuildError(f"the {variant} native kernels the backend policy chose cannot be loaded: "
                               f"{_errors.get(variant, 'unknown error')}")
    return so


ACT_REFINE_DEFAULT = Fraction(1, 4)


def _parse_act_refine(value: "str | float | Fraction") -> tuple[int, int]:
    try:
        f = Fraction(value.strip() if isinstance(value, str) else value).limit_denominator(1024)
    except (ValueError, ZeroDivisionError, TypeError):
        f = None
    if f is None or not 0 <= f <= 1:
        raise ValueError(f"LIBREMAX_ACT_REFINE={value!r}: give the fraction of each activation row's 32-value blocks "
                         "that get a second set of 8-bit codes, between 0 (off: 8-bit codes only, as llama.cpp) and 1, "
                         f"e.g. 0.25 or 1/4 (default {ACT_REFINE_DEFAULT})")
    return f.numerator, f.denominator


def _act_refine_from_environment() -> tuple[int, int]:
    from max.engine.backend import environment

    return _parse_act_refine(environment().act_refine or ACT_REFINE_DEFAULT)


_act_refine = _act_refine_from_environment()


def act_refine() -> Fraction:
    """The largest fraction of each activation row's 32-value blocks (those with the largest scales) whose
    quantisation residual gets a second set of 8-bit codes in the quantised matmuls (``LIBREMAX_ACT_REFINE``;
    0: off); :func:`act_refine_threshold` picks which of them (by default only the outlier blocks)."""
    return Fraction(*_act_refine)


def set_act_refine(value: "str | float | Fraction") -> None:
    """Set :func:`act_refine` for every loaded kernel variant and those loaded later (see csrc/qmatmul.c)."""
    global _act_refine
    _act_refine = _parse_act_refine(value)
    for so in _libs.values():
        if so is not None:
            so.lmx_set_act_refine(*_act_refine)
            so.lmx_set_act_refine_threshold(_act_refine_thr)


ACT_REFINE_THRESHOLD_DEFAULT = 2.0


def _parse_act_refine_threshold(value: "str | float") -> float:
    try:
        t = float(value.strip() if isinstance(value, str) else value)
    except (ValueError, TypeError):
        t = float("nan")
    if not (t >= 0 and t < float("inf")):
        raise ValueError(f"LIBREMAX_ACT_REFINE_THRESHOLD={value!r}: give a number >= 0: a row refines only its blocks "
                         "whose squared scale is at least that many times the row's mean (0: the fixed fraction "
                         f"LIBREMAX_ACT_REFINE of every row; default {ACT_REFINE_THRESHOLD_DEFAULT})")
    return t


def _act_refine_threshold_from_environment() -> float:
    from max.engine.backend import environment

    return _parse_act_refine_threshold(environment().act_refine_threshold or ACT_REFINE_THRESHOLD_DEFAULT)


_act_refine_thr = _act_refine_threshold_from_environment()


def act_refine_threshold() -> float:
    """Which blocks of a row get refined codes (``LIBREMAX_ACT_REFINE_THRESHOLD``): with t > 0 only those whose
    squared scale is at least t times the mean over the row's blocks -- those that hold most of the row's
    8-bit quantisation error -- and at most :func:`act_refine` of them (the largest); 0: always that fraction.
    Ignored when the fraction is 1 (every block refined)."""
    return _act_refine_thr


def set_act_refine_threshold(value: "str | float") -> None:
    """Set :func:`act_refine_threshold` for every loaded kernel variant and those loaded later."""
    global _act_refine_thr
    _act_refine_thr = _parse_act_refine_threshold(value)
    for so in _libs.values():
        if so is not None:
            so.lmx_set_act_refine_threshold(_act_refine_thr)


def act_refine_stats(reset: bool = False) -> tuple[int, int]:
    """``(refined, seen)``: activation blocks that got refined codes, of those quantised for the packed
    matmuls, since the last reset (this process, the default kernel variant; approximate when several
    threads run matmuls at once)."""
    so = lib()
    if so is None:
        return 0, 0
    out = (ctypes.c_int64 * 2)()
    so.lmx_act_refine_stats(out, int(reset))
    return int(out[0]), int(out[1])


def isa() -> str:
    """The kernel variant this process runs ('avx512', 'avx2', 'neon', ...), or 'torch' when the native
    kernels are disabled or could not be built."""
    so = lib()
    if so is None:
        return "torch"
    return next(name for name, s in _libs.items() if s is so)


def available(isa: str | None = None) -> bool:
    return lib(isa) is not None


def error(isa: str | None = None) -> str | None:
    """Why the library could not be loaded (None if it loaded or was not tried)."""
    return _errors.get(choose(isa))


_DENSE_KINDS = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 30}


def dense_kind(dtype: torch.dtype) -> int | None:
    """The kernels' kind code for a dense weight dtype (None if they do not read it)."""
    return _DENSE_KINDS.get(dtype)


def _ptr_array(values: Sequence[int]) -> ctypes.Array:
    return (ctypes.c_void_p * len(values))(*values)


# Kinds that lmx_pack repacks into the 16-row interleaved layout: (values per unit, bytes per unit per 16 rows).
_PACK_UNITS = {f.ggml_id: f.packed_unit for f in FORMATS if f.packed_unit is not None}


def packable(kind: int) -> bool:
    return kind in _PACK_UNITS


def packed_nbytes(kind: int, n: int, k: int) -> int:
    """Bytes of an ``[n, k]`` weight of GGML ``kind`` in the packed layout (see csrc/qpacked.c)."""
    ue, ub = _PACK_UNITS[kind]
    if k % ue:
        raise ValueError(f"packed_nbytes: K={k} is not a multiple of {ue}")
    return -(-n // 16) * (k // ue) * ub


PACK_CHUNK_BYTES = 4 << 20
"""Source bytes packed per call when the blocks view a mapped checkpoint: its pages are dropped after
each chunk, so a large weight (a 50k-row embedding) never has all of its file pages resident beside its
packed copy."""


_HUGE = 2 << 20


def huge_empty(nbytes: int) -> torch.Tensor:
    """A 1-D uint8 tensor of ``nbytes`` in private anonymous memory advised to be backed by 2 MiB pages
    (``MADV_HUGEPAGE``; the kernel's ``transparent_hugepage`` setting decides), 2 MiB-aligned.

    Packed weights live here: a decode step streams every one of them once, and with 4 KiB pages that
    stream also walks a page table entry per 4 KiB (about 4 % of the 1.5B model's decode time on an AVX2
    host, bench/qmatmul.py --working-set).  Small buffers, and systems without the advice, get torch's
    allocator."""
    import mmap

    if nbytes < _HUGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(nbytes, dtype=torch.uint8)
    mm = mmap.mmap(-1, nbytes + _HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = torch.frombuffer(mm, dtype=torch.uint8)  # keeps the mapping alive
    off = (-base.data_ptr()) % _HUGE
    span = nbytes // _HUGE * _HUGE  # whole huge pages only: the tail keeps 4 KiB pages (no 2 MiB page mostly unused)
    try:
        mm.madvise(mmap.MADV_HUGEPAGE, off, span)
    except OSError:  # advice refused: ordinary pages
        pass
    return base[off:off + nbytes]


def pack(blocks: torch.Tensor, kind: int, n: int, k: int, so: ctypes.CDLL | None = None) -> torch.Tensor:
    """Repack GGML blocks ``[n, row_bytes]`` (uint8) into the interleaved layout (a new 1-D uint8 tensor).

    Blocks that view a mapped checkpoint are packed a few MB of rows at a time (whole 16-row groups: the
    packed layout is group-major), each chunk's file pages dropped from the resident set once packed.
    Those of a whole-file mapping registered with its file (a GGUF checkpoint's) go through the
    packed-weight cache (``pack_cache``): the packing of a previous load is mapped from disk when the
    file, the tensor and the layout are the same (``LIBREMAX_PACK_CACHE=0``: off)."""
    from max.graph.weights import mapped

    from max.engine.native import pack_cache

    so = so or lib()
    assert so is not None
    src = blocks if blocks.is_contiguous() else blocks.contiguous()
    nbytes = packed_nbytes(kind, n, k)
    row_bytes = int(src.shape[-1]) if src.dim() == 2 else src.numel() // n
    ptr = src.data_ptr()
    in_file = src.data_ptr() == blocks.data_ptr() and mapped.contains(ptr, n * row_bytes)
    cached, store = pack_cache.lookup(ptr, kind, n, k, row_bytes, nbytes) if in_file else (None, None)
    if cached is not None:
        return cached
    out = huge_empty(nbytes)
    dst = out.data_ptr()
    rows = n if not in_file else max(16, PACK_CHUNK_BYTES // max(row_bytes, 1) // 16 * 16)
    group_bytes = packed_nbytes(kind, 16, k)
    for r0 in range(0, n, rows):
        m = min(rows, n - r0)
        rc = so.lmx_pack(kind, ptr + r0 * row_bytes, m, k, row_bytes, dst + r0 // 16 * group_bytes)
        if rc != 0:
            raise RuntimeError(f"native pack failed with code {rc} (kind {kind}, shape {n}x{k})")
        if in_file:  # done with these pages of the mapped checkpoint
            mapped.drop_pages(ptr + r0 * row_bytes, m * row_bytes)
    if store is not None:
        store(out)
    return out


QUANTIZABLE = {f.name: f.ggml_id for f in quantizable_on_load()}


def quantize(x: torch.Tensor, kind: int) -> torch.Tensor:
    """float ``x [N, K]`` -> GGML blocks ``[N, K / 32 * block_bytes]`` of kind (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0),
    bit-identical to ggml's reference quantizer (gguf.quants.quantize)."""
    so = lib()
    assert so is not None
    x = x.detach().to(torch.float32)
    x = x if x.is_contiguous() else x.contiguous()
    n, k = x.shape
    bb = by_ggml_id(kind).block_size
    out = torch.empty((n, k // 32 * bb), dtype=torch.uint8)
    rc = so.lmx_quantize(kind, x.data_ptr(), n, k, k, out.data_ptr())
    if rc != 0:
        raise ValueError(f"quantize: kind {kind} with K={k} is not supported (code {rc})")
    return out


def _codec_quantize(x: torch.Tensor, name: str) -> torch.Tensor | None:
    """The native quantiser as the codec's fast path (None when no native library loads)."""
    return quantize(x, QUANTIZABLE[name]) if name in QUANTIZABLE and lib() is not None else None


register_quantizer(_codec_quantize)


def packed_rows_f32(packed: torch.Tensor, kind: int, n: int, k: int, r0: int, r1: int,
                    out: torch.Tensor | None = None, so: ctypes.CDLL | None = None) -> torch.Tensor:
    """Rows ``r0:r1`` of a packed weight as float32 ``[r1 - r0, K]`` (exactly the GGML dequantisation),
    into ``out`` when given (a reused buffer of at least that many elements)."""
    rows = r1 - r0
    out = torch.empty((rows, k), dtype=torch.float32) if out is None else out[: rows * k].view(rows, k)
    if (so or lib()).lmx_packed_rows_f32(kind, packed.data_ptr(), n, k, r0, r1, out.data_ptr()) != 0:
        raise ValueError(f"packed_rows_f32: bad rows {r0}:{r1} of {n} or kind {kind}")
    return out


def packed_row(packed: torch.Tensor, kind: int, n: int, k: int, row: int, so: ctypes.CDLL | None = None
               ) -> torch.Tensor:
    """Row ``row`` of a packed weight as float32 (exactly the GGML dequantisation)."""
    out = torch.empty(k, dtype=torch.float32)
    if (so or lib()).lmx_packed_row(kind, packed.data_ptr(), n, k, row, out.data_ptr()) != 0:
        raise ValueError(f"packed_row: bad row {row} or kind {kind}")
    return out


class MatmulPlan:
    """``x [M, K] @ concat(W_i)^T (+ b_i)`` over weights bound once (their pointers are kept).

    Each weight is ``(tensor, kind, mode)``: mode ``"dense"`` (float32/float16/bfloat16 ``[N_i, K]``),
    ``"ggml"`` (uint8 GGML blocks ``[N_i, row_bytes]``) or ``"packed"`` (1-D uint8 from :func:`pack`;
    its ``N_i`` comes from ``ns``).  Weights of one mode run as one native call writing their columns
    of the output; the plan keeps references to every tensor it points at.  ``norm``: ``(weight, eps)``
    of an RMSNorm applied to ``x`` first (the norm feeding the projection, fused into the call).
    """

    __slots__ = ("so", "n_out", "k", "calls", "keep", "norm", "res_fns", "packed_args")

    def __init__(self, weights: Sequence[torch.Tensor], kinds: Sequence[int], modes: Sequence[str],
                 ns: Sequence[int], k: int, biases: Sequence[torch.Tensor | None] | None = None,
                 so: ctypes.CDLL | None = None, norm: tuple[torch.Tensor, float] | None = None) -> None:
        self.so = so or lib()
        assert self.so is not None
        self.k = k
        self.n_out = sum(ns)
        self.keep: list[torch.Tensor] = []
        self.norm = (0, 0.0)
        if norm is not None:
            nw_t = norm[0].detach().to(torch.float32).contiguous()
            self.keep.append(nw_t)
            self.norm = (nw_t.data_ptr(), float(norm[1]))
        biases = list(biases) if biases is not None else [None] * len(weights)
        groups: dict[str, list[int]] = {}
        for i, m in enumerate(modes):
            groups.setdefault(m, []).append(i)
        offs = [0]
        for n in ns:
            offs.append(offs[-1] + n)
        self.calls = []
        self.res_fns = []  # per call: its variant adding a residual (packed weights only), else None
        self.packed_args: list = []  # per call: its (nw, w, kinds, N, bias) for a PackedPlan, packed weights only
        for mode, idx in groups.items():
            # columns of one call must be contiguous in the output: split into runs
            runs: list[list[int]] = []
            for i in idx:
                if runs and runs[-1][-1] == i - 1:
                    runs[-1].append(i)
                else:
                    runs.append([i])
            for run in runs:
                ws = [weights[i] if weights[i].is_contiguous() else weights[i].contiguous() for i in run]
                bs = [None if biases[i] is None else biases[i].detach().to(torch.float32).contiguous() for i in run]
                self.keep += ws + [b for b in bs if b is not None]
                nw = len(run)
                wp = _ptr_array([w.data_ptr() for w in ws])
                kd = (ctypes.c_int * nw)(*[kinds[i] for i in run])
                nn = (ctypes.c_int64 * nw)(*[ns[i] for i in run])
                bp = _ptr_array([0 if b is None else b.data_ptr() for b in bs]) if any(b is not None for b in bs) else None
                if mode == "packed":
                    fn = self.so.lmx_packed_matmul
                    args = (nw, wp, kd, nn, bp)
                else:
                    fn = self.so.lmx_qmatmul if mode == "ggml" else self.so.lmx_dense_matmul
                    rb = (ctypes.c_int64 * nw)(*[int(w.stride(0) * w.element_size()) for w in ws])
                    args = (nw, wp, kd, nn, rb, bp)
                self.calls.append((fn, args, offs[run[0]]))
                self.res_fns.append(self.so.lmx_packed_matmul_res if mode == "packed" else None)
                self.packed_args.append(args if mode == "packed" else None)

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None, scalar: bool = False,
                 residual: torch.Tensor | None = None) -> torch.Tensor:
        """``x``: float32 ``[M, K]`` with unit stride in K.  Returns float32 ``[M, n_out]``; plus ``residual``
        (float32 ``[M, n_out]``, unit stride in N, not overlapping ``out``) when given, added in the kernels'
        epilogue: ``(x @ W^T + b) + residual``, exactly the separate add (packed weights only)."""
        M = x.shape[0]
        if out is None:
            out = torch.empty((M, self.n_out), dtype=torch.float32)
        xp, xs, yp, ys = x.data_ptr(), x.stride(0), out.data_ptr(), out.stride(0)
        nwp, eps = self.norm
        if residual is not None:
            if any(f is None for f in self.res_fns) or residual.stride(1) != 1:
                raise ValueError("MatmulPlan: a residual is added only to packed weights' results (unit stride)")
            rp, rs = residual.data_ptr(), residual.stride(0)
            for (_, args, col), fn in zip(self.calls, self.res_fns):
                rc = fn(M, self.k, xp, xs, *args, yp + 4 * col, ys, int(scalar), nwp, eps, rp + 4 * col, rs)
                if rc != 0:
                    raise RuntimeError(f"native matmul failed with code {rc} (K={self.k})")
            return out
        for fn, args, col in self.calls:
            rc = fn(M, self.k, xp, xs, *args, yp + 4 * col, ys, int(scalar), nwp, eps)
            if rc != 0:
                raise RuntimeError(f"native matmul failed with code {rc} (K={self.k})")
        return out


def packed_plan(plan: MatmulPlan, act: int = -1) -> tuple[PackedPlan, int] | None:
    """The single packed-weights call of ``plan`` bound for ``lmx_packed_call`` (None when ``plan`` makes
    another kind of call or several): the struct (keep it alive) and its address."""
    if len(plan.calls) != 1 or plan.packed_args[0] is None:
        return None
    nw, wp, kd, nn, bp = plan.packed_args[0]
    nwp, eps = plan.norm
    p = PackedPlan(K=plan.k, nw=nw, w=ctypes.cast(wp, _P), kinds=ctypes.cast(kd, _P), N=ctypes.cast(nn, _P),
                   bias=None if bp is None else ctypes.cast(bp, _P), norm_w=nwp or None, norm_eps=eps, act=act)
    return p, ctypes.addressof(p)


def qmatmul(x: torch.Tensor, weights: Sequence[torch.Tensor], kinds: Sequence[int],
            biases: Sequence[torch.Tensor | None] | None = None, *, out: torch.Tensor | None = None,
            scalar: bool = False, so: ctypes.CDLL | None = None) -> torch.Tensor:
    """One-off ``x [M, K] float32 @ concat(W_i)^T (+ b_i)`` (see :class:`MatmulPlan`)."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    modes = ["dense" if k in (0, 1, 30) else "ggml" for k in kinds]
    return MatmulPlan(weights, kinds, modes, [int(w.shape[0]) for w in weights], int(x.shape[1]), biases,
                      so=so)(x, out, scalar)


def rmsnorm(x: torch.Tensor, w: torch.Tensor | None, eps: float, out: torch.Tensor | None = None,
            so: ctypes.CDLL | None = None) -> torch.Tensor:
    """Row-wise RMSNorm of a float32 ``[M, K]`` tensor (unit stride in K)."""
    M, K = x.shape
    if out is None:
        out = torch.empty((M, K), dtype=torch.float32)
    (so or lib()).lmx_rmsnorm(x.data_ptr(), M, K, x.stride(0), 0 if w is None else w.data_ptr(), eps, out.data_ptr(),
                      out.stride(0))
    return out


def glu(gu: torch.Tensor, act: int, out: torch.Tensor | None = None, so: ctypes.CDLL | None = None) -> torch.Tensor:
    """``act(gu[:, :I]) * gu[:, I:]`` for float32 ``gu [M, 2I]``; act 0 = silu, 1 = gelu (tanh)."""
    M, I2 = gu.shape
    i = I2 // 2
    if out is None:
        out = torch.empty((M, i), dtype=torch.float32)
    (so or lib()).lmx_glu(gu.data_ptr(), M, i, gu.stride(0), act, out.data_ptr(), out.stride(0))
    return out
