"""RoPE scaling that llama.cpp's GGUF files carry as tensors instead of metadata, as Hugging Face RoPE parameters.

* ``rope_freqs.weight`` (Llama 3.1+, EXAONE, ... converted with llama3-style scaling): one factor per rotated
  pair; llama.cpp divides pair ``i``'s frequency ``theta ** (-2i / d)`` by factor ``i``.  When the factors
  are exactly those of a ``llama3`` scaling they become that ``rope_parameters`` entry (what the original
  ``config.json`` said, up to the one free parameter of the llama3 formula); otherwise they are kept as
  libremax's ``freq_factors`` kind (:class:`max.nn.rotary_embedding.FreqFactorsRotaryEmbedding`), which
  applies them as they are.
* ``rope_factors_long.weight`` / ``rope_factors_short.weight`` (Phi-3 128k and other LongRoPE models): the
  ``long_factor`` / ``short_factor`` lists of a ``longrope`` entry; the original context is the file's
  ``rope.scaling.original_context_length``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["FREQ_FACTORS", "LONGROPE_FACTORS", "llama3_factors", "rope_from_freq_factors", "rope_from_gguf_tensors"]

FREQ_FACTORS = "rope_freqs.weight"
LONGROPE_FACTORS = ("rope_factors_long.weight", "rope_factors_short.weight")

_RTOL = 1e-5
"""How close (relative) stored factors must be to a llama3 scaling's to be read as it (they are float32)."""


def llama3_factors(theta: float, dim: int, factor: float, low_freq_factor: float, high_freq_factor: float,
                   original_max_position_embeddings: int) -> np.ndarray:
    """The per-pair divisors of a ``llama3`` scaling (``dim`` rotated dims): 1 for wavelengths below
    ``original / high_freq_factor``, ``factor`` above ``original / low_freq_factor``, the smooth blend
    ``1 / ((1 - s) / factor + s)`` in between."""
    freq = theta ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    wavelen = 2 * math.pi / freq
    old = float(original_max_position_embeddings)
    s = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blend = 1.0 / ((1.0 - s) / factor + s)
    return np.where(wavelen < old / high_freq_factor, 1.0, np.where(wavelen > old / low_freq_factor, factor, blend))


def _llama3_candidates(f: np.ndarray, theta: float, dim: int) -> list[tuple[float, float, int]]:
    """``(low_freq_factor, high_freq_factor, original)`` settings that may give the factors ``f`` (with
    ``factor = max(f)``): Llama 3's own (1, 4, 8192), and the one fitted to the blended pairs with
    ``low_freq_factor = 1`` (the formula fixes only two of the three values)."""
    out: list[tuple[float, float, int]] = [(1.0, 4.0, 8192)]
    factor = float(f.max())
    inv_wavelen = theta ** (-np.arange(0, dim, 2, dtype=np.float64) / dim) / (2 * math.pi)
    mid = (f > 1.0 + _RTOL) & (f < factor * (1.0 - _RTOL))
    if mid.sum() >= 2:  # s = old / ((hi - lo) wavelen) - lo / (hi - lo), linear in 1 / wavelen
        s = (1.0 / f[mid] - 1.0 / factor) / (1.0 - 1.0 / factor)
        a, b = np.polyfit(inv_wavelen[mid], s, 1)
        if b < 0 and a > 0:
            hi = 1.0 - 1.0 / b
            out.append((1.0, float(round(hi, 6)), int(round(-a / b))))
    return out


def rope_from_freq_factors(factors: np.ndarray, rope: dict[str, Any]) -> dict[str, Any]:
    """``rope`` (Hugging Face ``rope_parameters`` with ``rope_theta``, no scaling yet) with the scaling
    the per-pair divisors ``factors`` describe: unchanged when all are 1, a ``llama3`` entry when they
    match one, else ``{"rope_type": "freq_factors", "freq_factors": [...]}``."""
    f = np.asarray(factors, np.float64).reshape(-1)
    if f.size == 0 or not np.all(np.isfinite(f)) or np.any(f <= 0):
        raise ValueError(f"GGUF {FREQ_FACTORS}: factors must be positive and finite (got {f.tolist()[:8]}...)")
    if rope.get("rope_type", "default") != "default":
        raise NotImplementedError(f"GGUF with both {FREQ_FACTORS} and RoPE scaling {rope['rope_type']!r} "
                                  "is not supported")
    out = dict(rope)
    if np.allclose(f, 1.0, rtol=0, atol=_RTOL):
        return out
    theta = float(rope.get("rope_theta", 10000.0))
    dim = 2 * f.size
    factor = float(f.max())
    for lo, hi, old in _llama3_candidates(f, theta, dim):
        if hi > lo and old > 0 and np.allclose(llama3_factors(theta, dim, factor, lo, hi, old), f, rtol=_RTOL, atol=0):
            out.update(rope_type="llama3", factor=factor, low_freq_factor=lo,
                       high_freq_factor=hi, original_max_position_embeddings=old)
            return out
    out.update(rope_type="freq_factors", freq_factors=[float(x) for x in f])
    return out


def rope_from_gguf_tensors(meta: Any, rope: dict[str, Any], max_position_embeddings: Any) -> dict[str, Any]:
    """``rope`` completed with the RoPE scaling the GGUF file ``meta`` stores as tensors (see the module
    docstring); unchanged when it has none."""
    names = {t.name for t in meta.tensors}
    if FREQ_FACTORS in names:
        return rope_from_freq_factors(meta.small_tensor(FREQ_FACTORS), rope)
    have = [n for n in LONGROPE_FACTORS if n in names]
    if not have:
        return rope
    if len(have) != 2:
        raise ValueError(f"{meta.path}: LongRoPE GGUF needs both {' and '.join(LONGROPE_FACTORS)} (has {have})")
    long_f, short_f = (meta.small_tensor(n).reshape(-1) for n in LONGROPE_FACTORS)
    if long_f.shape != short_f.shape:
        raise ValueError(f"{meta.path}: LongRoPE factor tensors differ in length ({long_f.size} vs {short_f.size})")
    orig = meta.arch_get("rope.scaling.original_context_length")
    if not orig:
        raise ValueError(f"{meta.path}: LongRoPE factor tensors without {meta.architecture}."
                         "rope.scaling.original_context_length")
    out = dict(rope, rope_type="longrope", long_factor=[float(x) for x in long_f],
               short_factor=[float(x) for x in short_f], original_max_position_embeddings=int(orig))
    attn = meta.arch_get("rope.scaling.attn_factor")
    if attn is not None and max_position_embeddings:
        s = int(max_position_embeddings) / int(orig)
        default = math.sqrt(1 + math.log(s) / math.log(int(orig))) if s > 1 else 1.0
        if not math.isclose(float(attn), default, rel_tol=1e-6):  # the converter writes the default
            out["attention_factor"] = float(attn)
    return out
