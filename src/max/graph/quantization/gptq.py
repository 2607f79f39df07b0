"""GPTQ / AWQ int4 checkpoints: their packed groups read as GGML ``Q4_0`` / ``Q4_1`` blocks.

A GPTQ or AWQ projection ``[out N, in K]`` stores 4-bit codes ``q``, per-group float16 scales ``s``
(``[K / group, N]``) and 4-bit zero points ``z`` (``[K / group, N / 8]`` packed); a weight is
``w[n, k] = s[g, n] * (q[k, n] - z[g, n])`` with ``g`` the group of input ``k``.  Every 32 inputs
inside one group share ``s`` and ``z``, so a group of a multiple of 32 values is a run of GGML blocks:

- symmetric (``z == 8`` everywhere): ``Q4_0`` (``d * (q - 8)``, ``d = s``) -- the same values exactly;
- otherwise ``Q4_1`` (``d * q + m``, ``d = s``, ``m = -s * z`` rounded to float16): ``s * z`` needs up to
  15 significant bits, so ``m`` may differ from the exact product by up to ``|s z| * 2**-11`` (at most
  ``s / 128``, under 1 % of one quantisation step); every other value is exact.

The native CPU kernels run those blocks as they run a GGUF file's (no float copy of the weight).

Packings (facts of the two formats):

- GPTQ (AutoGPTQ / optimum ``checkpoint_format`` ``"gptq"``): ``qweight`` int32 ``[K / 8, N]``, code of
  input ``8 i + j`` in bits ``4 j`` of row ``i``; ``qzeros`` int32 ``[K / group, N / 8]``, zero of output
  ``8 c + j`` in bits ``4 j``, stored minus one (``"gptq_v2"`` stores it as is); ``g_idx`` ``[K]``: each
  input's group (``k // group`` unless ``desc_act`` reordered them: then the inputs are sorted by group
  once at load and the activations gathered in that order, ``perm_idx``).
- AWQ (AutoAWQ ``version`` ``"gemm"``): ``qweight`` int32 ``[K, N / 8]`` packed along the outputs, nibble
  ``i`` holding output ``8 c + (0, 2, 4, 6, 1, 3, 5, 7)[i]``; ``qzeros`` packed the same way; zeros as is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch

__all__ = ["Int4Config", "act_order_perm", "gptq_row_bytes", "gptq_row_inputs", "gptq_rows_to_q4_0", "int4_config",
           "pack_gptq_rows", "to_ggml_blocks", "unpack_gptq", "unpack_zeros"]

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""AWQ's GEMM packing: nibble ``i`` of a word holds output column ``8 c + AWQ_ORDER[i]``."""


@dataclass(frozen=True)
class Int4Config:
    """The supported part of a checkpoint's ``quantization_config``."""

    method: str  # "gptq" or "awq"
    group_size: int  # -1: one group over the whole input
    zero_offset: int  # added to stored zeros (GPTQ v1 stores z - 1)


def int4_config(qc: Mapping[str, Any]) -> Int4Config:
    """The :class:`Int4Config` of a Hugging Face ``quantization_config``; ValueError naming what is not
    supported (other bit widths, group sizes not a multiple of 32, other packings)."""
    method = str(qc.get("quant_method", "")).lower()
    if method not in ("gptq", "awq"):
        raise ValueError(f"int4 checkpoint: quant_method {qc.get('quant_method')!r} is not gptq or awq")
    bits = int(qc.get("bits", qc.get("w_bit", 4)))
    if bits != 4:
        raise ValueError(f"{method} checkpoint: {bits}-bit weights are not supported (4-bit only)")
    group = int(qc.get("group_size", qc.get("q_group_size", 128)))
    if group != -1 and (group <= 0 or group % 32):
        raise ValueError(f"{method} checkpoint: group_size {group} is not supported (a multiple of 32, or -1)")
    if method == "gptq":
        fmt = str(qc.get("checkpoint_format", "gptq")).lower()
        if fmt not in ("gptq", "gptq_v2"):
            raise ValueError(f"gptq checkpoint: checkpoint_format {fmt!r} is not supported (gptq, gptq_v2)")
        return Int4Config("gptq", group, 1 if fmt == "gptq" else 0)
    version = str(qc.get("version", "gemm")).lower()
    if version != "gemm":
        raise ValueError(f"awq checkpoint: version {version!r} is not supported (gemm packing only)")
    if not qc.get("zero_point", True):
        raise ValueError("awq checkpoint: zero_point false is not supported")
    return Int4Config("awq", group, 0)


def _nibbles(words: torch.Tensor) -> torch.Tensor:
    """int32 ``[..., W]`` -> uint8 ``[..., W, 8]``: nibble ``i`` of each word at index ``i``."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(0, 32, 4, dtype=torch.int64, device=words.device)
    return ((w.unsqueeze(-1) >> shifts) & 0xF).to(torch.uint8)


def _columns(words: torch.Tensor, cfg: Int4Config) -> torch.Tensor:
    """Words packed along the last (output) axis -> codes ``[..., 8 W]`` in output order."""
    nib = _nibbles(words)
    if cfg.method == "awq":
        out = torch.empty_like(nib)
        out[..., list(AWQ_ORDER)] = nib
        nib = out
    return nib.reshape(*words.shape[:-1], words.shape[-1] * 8)


def unpack_zeros(qzeros: torch.Tensor, cfg: Int4Config) -> torch.Tensor:
    """Packed ``qzeros`` ``[K / group, N / 8]`` -> the zero points ``[K / group, N]`` (int16, offset applied)."""
    return _columns(qzeros, cfg).to(torch.int16) + cfg.zero_offset


def unpack_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, cfg: Int4Config,
                g_idx: Optional[torch.Tensor] = None, name: str = "weight"
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(codes [N, K] uint8, zeros [N, K / G] int16, scales [N, K / G] float16)`` with ``G`` the group size;
    with act-order (``g_idx`` not ``k // G``) the code columns are in :func:`act_order_perm`'s order (column
    ``j`` is input ``perm[j]``).  ValueError for shapes that do not fit."""
    if cfg.method == "gptq":
        if qweight.dim() != 2:
            raise ValueError(f"{name}: gptq qweight must be 2-D, got {list(qweight.shape)}")
        k, n = qweight.shape[0] * 8, qweight.shape[1]
        codes = _nibbles(qweight).permute(1, 0, 2).reshape(n, k)
    else:
        k, n = qweight.shape[0], qweight.shape[1] * 8
        codes = _columns(qweight, cfg).t()
    group = k if cfg.group_size == -1 else cfg.group_size
    if k % group or k % 32:
        raise ValueError(f"{name}: input size {k} is not a multiple of the group size {group} and of 32")
    ng = k // group
    if list(scales.shape) != [ng, n]:
        raise ValueError(f"{name}: scales have shape {list(scales.shape)}, expected {[ng, n]}")
    if list(qzeros.shape) != [ng, n // 8]:
        raise ValueError(f"{name}: qzeros have shape {list(qzeros.shape)}, expected {[ng, n // 8]}")
    perm = act_order_perm(g_idx, k, group, name) if g_idx is not None else None
    if perm is not None:
        codes = codes[:, perm]
    zeros = unpack_zeros(qzeros, cfg)
    return codes.contiguous(), zeros.t().contiguous(), scales.to(torch.float16).t().contiguous()


def act_order_perm(g_idx: torch.Tensor, k: int, group: int, name: str = "weight") -> Optional[torch.Tensor]:
    """None when ``g_idx`` is the plain ``k // group``; else (act-order / ``desc_act``) the int32 permutation
    ``perm`` that sorts the inputs by group (column ``j`` of the repacked weight is input ``perm[j]``, so the
    activations are gathered by it).  ValueError when the groups do not all hold ``group`` inputs."""
    g = g_idx.to(torch.int64).reshape(-1)
    if g.numel() != k:
        raise ValueError(f"{name}: g_idx has {g.numel()} entries, the weight has {k} inputs")
    if torch.equal(g, torch.arange(k, dtype=torch.int64, device=g.device) // group):
        return None
    if g.min() < 0 or g.max() >= k // group or not bool((torch.bincount(g, minlength=k // group) == group).all()):
        raise ValueError(f"{name}: g_idx does not put {group} inputs in each of the {k // group} groups")
    return torch.sort(g, stable=True).indices.to(torch.int32)


def to_ggml_blocks(codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor) -> tuple[str, torch.Tensor]:
    """``(kind, blocks [N, K / 32 * bytes])``: ``Q4_0`` when every zero is 8, else ``Q4_1`` (module doc)."""
    n, k = codes.shape
    per = k // zeros.shape[1] // 32  # blocks per group
    d = scales.repeat_interleave(per, dim=1).reshape(-1, 1)
    q = codes.reshape(-1, 32)
    qs = (q[:, :16] & 0x0F) | (q[:, 16:] << 4)
    dbytes = d.contiguous().view(torch.uint8).reshape(-1, 2)
    if bool((zeros == 8).all()):
        return "Q4_0", torch.cat([dbytes, qs], dim=1).reshape(n, -1)
    z = zeros.repeat_interleave(per, dim=1).reshape(-1, 1)
    m = (-(d.to(torch.float32) * z.to(torch.float32))).to(torch.float16)
    mbytes = m.contiguous().view(torch.uint8).reshape(-1, 2)
    return "Q4_1", torch.cat([dbytes, mbytes, qs], dim=1).reshape(n, -1)


# ------------------------------------------------------------------ the graph's GPTQ encoding
# ``QuantizationEncoding.GPTQ`` tensors, as ``ops.qmatmul(GPTQ, config, x, w)`` and ``GPTQLinear`` take
# them: symmetric 4-bit (zero 8), one uint8 row per output feature = the ``K / 2`` bytes of its codes
# (``qweight.T``'s bytes: byte ``b`` holds code ``2 b`` in its low nibble, ``2 b + 1`` in its high one),
# then its ``K / group`` float16 scales.  ``w[n, k] = s[n, k // group] * (q[n, k] - 8)``: exactly Q4_0.


def _group(k: int, group_size: int) -> int:
    return k if group_size == -1 else group_size


def gptq_row_bytes(k: int, group_size: int) -> int:
    """Bytes of one GPTQ row of ``k`` inputs (codes, then float16 scales)."""
    return k // 2 + 2 * (k // _group(k, group_size))


def gptq_row_inputs(nbytes: int, group_size: int) -> int | None:
    """The ``k`` whose GPTQ rows hold ``nbytes`` bytes (None: no valid ``k``)."""
    k = 2 * (nbytes - 2) if group_size == -1 else (2 * group_size * nbytes) // (group_size + 4)
    if k <= 0 or k % 32 or (group_size != -1 and k % group_size) or gptq_row_bytes(k, group_size) != nbytes:
        return None
    return k


def pack_gptq_rows(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Codes ``[N, K]`` (0..15, zero 8) and float16 scales ``[N, K / group]`` -> GPTQ rows ``[N, bytes]``."""
    c = codes.to(torch.uint8)
    qs = (c[:, 0::2] & 0x0F) | (c[:, 1::2] << 4)
    return torch.cat([qs, scales.to(torch.float16).contiguous().view(torch.uint8)], dim=1)


def gptq_rows_to_q4_0(rows: torch.Tensor, k: int, group_size: int) -> torch.Tensor:
    """GPTQ rows ``[N, bytes]`` -> Q4_0 blocks ``[N, K / 32 * 18]`` holding the same values."""
    n = rows.shape[0]
    qs = rows[:, : k // 2]
    codes = torch.stack([qs & 0x0F, qs >> 4], dim=-1).reshape(n, k)
    scales = rows[:, k // 2:].contiguous().view(torch.float16)
    zeros = torch.full(scales.shape, 8, dtype=torch.int16, device=rows.device)
    kind, blocks = to_ggml_blocks(codes, zeros, scales)
    return blocks
