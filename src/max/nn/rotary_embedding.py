"""Rotary position embeddings (RoPE) and their long-context scalings.

``freqs_cis_base()`` is a float32 table of ``(cos, sin)`` pairs, shape
``(positions, rope_dim // 2, 2)``; row ``p``, column ``i`` holds
``cos(p * inv_freq[i]), sin(p * inv_freq[i])``.  The inverse frequencies are
computed on the host in float64 (``inv_freq[i] = theta ** (-2i / rope_dim)``,
adjusted by each scaling) and the table enters the graph as a constant.

Calling a rotary embedding on ``x`` of shape ``(..., seq_len, n_heads,
head_dim)`` rotates each pair of features by its position's angle:
``(a, b) -> (a cos - b sin, a sin + b cos)``.  With ``interleaved=True`` the
pairs are adjacent features ``(x[2i], x[2i+1])``; with ``False`` they are
``(x[i], x[i + head_dim/2])`` (the Hugging Face "rotate_half" layout).
Positions start at ``start_pos`` (default 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from max.dtype import DType
from max.graph import DeviceRef, Dim, Graph, TensorValue, ops
from max.graph.graph import NoGraphError
from max.graph.rope import rope_inv_freq
from max.nn.layer import Module, check_input

__all__ = [
    "DeepseekYarnRopeScalingParams",
    "DeepseekYarnRotaryEmbedding",
    "DynamicRotaryEmbedding",
    "FreqFactorsRotaryEmbedding",
    "LinearScalingParams",
    "Llama3RopeScalingParams",
    "Llama3RotaryEmbedding",
    "LongRoPERotaryEmbedding",
    "LongRoPEScalingParams",
    "RotaryEmbedding",
    "YarnRotaryEmbedding",
    "YarnScalingParams",
    "LinearScalingRotaryEmbedding",
    "ProportionalRotaryEmbedding",
    "rope_from_hf",
]


# --------------------------------------------------------------------- scaling parameters
@dataclass
class LinearScalingParams:
    """Linear (position-interpolation) scaling: positions are divided by ``factor``."""

    factor: float


@dataclass
class Llama3RopeScalingParams:
    """Llama 3.1 frequency-dependent scaling."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    orig_max_position: int


@dataclass
class YarnScalingParams:
    """Generic YaRN scaling.

    libremax extension: ``attention_factor`` (the table's scale; default ``0.1 ln(factor) + 1``), or
    ``mscale`` with ``mscale_all_dim`` (scale ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)``),
    as Hugging Face configs give them."""

    factor: float
    beta_fast: float
    beta_slow: float
    original_max_position_embeddings: int
    truncate: bool
    attention_factor: Optional[float] = None
    mscale: Optional[float] = None
    mscale_all_dim: Optional[float] = None

    def table_scale(self) -> float:
        if self.attention_factor is not None:
            return float(self.attention_factor)
        if self.mscale and self.mscale_all_dim:
            return _yarn_mscale(self.factor, self.mscale) / _yarn_mscale(self.factor, self.mscale_all_dim)
        return _yarn_mscale(self.factor)


@dataclass
class DeepseekYarnRopeScalingParams:
    """DeepSeek's YaRN scaling (with ``mscale``/``mscale_all_dim`` attention factors)."""

    scaling_factor: float
    original_max_position_embeddings: int
    beta_fast: int
    beta_slow: int
    mscale: float
    mscale_all_dim: float


@dataclass
class LongRoPEScalingParams:
    """LongRoPE (Phi-3.5) per-frequency factors for short and long contexts.

    libremax extension: ``factor`` and ``attention_factor`` override the derived scale
    (``max_position_embeddings / original_max_position``) and attention factor, as Hugging Face
    configs may give them."""

    short_factor: list[float]
    long_factor: list[float]
    original_max_position: int
    max_position_embeddings: int
    factor: Optional[float] = None
    attention_factor: Optional[float] = None

    def attention(self) -> float:
        """``attention_factor``, else ``sqrt(1 + ln(s) / ln(original_max_position))`` (1 for s <= 1)."""
        if self.attention_factor is not None:
            return float(self.attention_factor)
        s = self.factor or self.max_position_embeddings / self.original_max_position
        return 1.0 if s <= 1.0 else math.sqrt(1 + math.log(s) / math.log(self.original_max_position))


# --------------------------------------------------------------------- helpers
def _base_inv_freq(theta: float, rope_dim: int) -> np.ndarray:
    return rope_inv_freq(theta, rope_dim)


def _cis_table(positions: np.ndarray, inv_freq: np.ndarray, scale: float = 1.0) -> np.ndarray:
    ang = np.outer(positions.astype(np.float64), inv_freq)
    return (np.stack([np.cos(ang), np.sin(ang)], axis=-1) * scale).astype(np.float32)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(theta: float, rope_dim: int, factor: float, beta_fast: float, beta_slow: float,
                   original_max: int, truncate: bool) -> np.ndarray:
    """YaRN: blend interpolated (``/factor``) and original frequencies with a linear ramp over dims."""
    base_freq = _base_inv_freq(theta, rope_dim)

    def correction_dim(rotations: float) -> float:
        return rope_dim * math.log(original_max / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rope_dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(rope_dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    keep = 1.0 - ramp  # 1 -> original (extrapolated) frequency, 0 -> interpolated
    return base_freq / factor * (1.0 - keep) + base_freq * keep


def _concrete_ints(v: Any, what: str) -> np.ndarray:
    """Host values of ``v`` (array-like, driver buffer, or a constant graph value)."""
    if isinstance(v, TensorValue):
        node = v._node
        if node.op == "constant":
            return np.asarray(node.attrs.get("value"))
        raise TypeError(
            f"{what}: position_ids must be known on the host (numpy array, list, int or driver Buffer); "
            f"a graph value computed at run time ({v.type}) cannot change the table while building the graph"
        )
    if hasattr(v, "to_numpy"):
        return np.asarray(v.to_numpy())
    return np.asarray(v)


# --------------------------------------------------------------------- RotaryEmbedding
class RotaryEmbedding(Module):
    """Computes the RoPE frequency table and applies it to query/key tensors."""

    def __init__(self, dim: int, n_heads: int, theta: float, max_seq_len: int, device: DeviceRef,
                 head_dim: int | None = None, _freqs_cis: Any = None, interleaved: bool = True) -> None:
        super().__init__()
        self.dim = dim
        self.n_heads = n_heads
        self.theta = theta
        self.max_seq_len = max_seq_len
        self.device = device if device is not None else DeviceRef.CPU()
        self.head_dim = head_dim if head_dim is not None else dim // n_heads
        self._freqs_cis = _freqs_cis
        self.interleaved = interleaved
        self._max_nn_cache: tuple[Any, TensorValue] | None = None
        if self._rope_dim() % 2:
            raise ValueError(f"{type(self).__name__}: the rotary dim must be even, got {self._rope_dim()}")

    # -- tables (host) -------------------------------------------------------
    def _rope_dim(self) -> int:
        return self.head_dim

    def _num_positions(self) -> int:
        return self.max_seq_len * 2

    def _inv_freq(self) -> np.ndarray:
        return _base_inv_freq(self.theta, self._rope_dim())

    def _table(self) -> np.ndarray:
        return _cis_table(np.arange(self._num_positions()), self._inv_freq())

    # -- graph values ----------------------------------------------------------
    def freqs_cis_base(self) -> TensorValue:
        """The ``(max_seq_len * 2, head_dim // 2, 2)`` float32 (cos, sin) table as a graph constant."""
        return ops.constant(self._table(), DType.float32, self.device)

    @property
    def freqs_cis(self) -> TensorValue:
        """The table flattened to ``(positions, rope_dim)`` (cos/sin interleaved), in the current graph."""
        if self._freqs_cis is not None:
            from max.graph.ops._common import as_tensor

            return as_tensor(self._freqs_cis, op=type(self).__name__, arg="_freqs_cis")
        try:
            g = Graph.current
        except NoGraphError:
            raise NoGraphError(f"{type(self).__name__}.freqs_cis: no graph is being built") from None
        if self._max_nn_cache is not None and self._max_nn_cache[0] is g:
            return self._max_nn_cache[1]
        base = self.freqs_cis_base()
        table = ops.reshape(base, [base.shape[0], self._rope_dim()])
        self._max_nn_cache = (g, table)
        return table

    def compute_scale(self, user_scale: float | None = None) -> float:
        """The attention softmax scale: ``user_scale`` or ``1 / sqrt(head_dim)``."""
        return float(user_scale) if user_scale is not None else 1.0 / math.sqrt(self.head_dim)

    def __call__(self, x: Any, start_pos: Any = None, seq_len: Any = None) -> TensorValue:
        """Rotate ``x`` ``(..., seq_len, n_heads, head_dim)`` by the angles of positions ``start_pos...``."""
        rd = self._rope_dim()
        v = check_input(self, x, min_rank=3, last_dim=rd)
        if not v.dtype.is_float() or v.dtype.is_float8():
            raise TypeError(f"{self._layer_name}: input must be a floating-point tensor, got {v.dtype}")
        half = rd // 2
        seq = v.shape[-3] if seq_len is None else Dim(seq_len)
        freqs = self.freqs_cis
        start = 0 if start_pos is None else start_pos
        if isinstance(start, int) and int(start) == 0:
            sliced = ops.slice_tensor(freqs, [(slice(0, seq), seq)])
        else:
            sliced = ops.slice_tensor(freqs, [(slice(start, Dim(start) + seq), seq)])
        pairs = ops.reshape(sliced, [seq, half, 2])
        cos = ops.unsqueeze(pairs[:, :, 0], 1)  # (seq, 1, half): broadcasts over heads
        sin = ops.unsqueeze(pairs[:, :, 1], 1)
        compute = DType.float64 if v.dtype == DType.float64 else DType.float32
        xf = v.cast(compute)
        cos, sin = cos.cast(compute), sin.cast(compute)
        if v.device != cos.device:
            cos, sin = cos.to(v.device), sin.to(v.device)
        if self.interleaved:
            xp = ops.reshape(xf, list(v.shape[:-1]) + [half, 2])
            a, b = xp[..., 0], xp[..., 1]
        else:
            a, b = xf[..., :half], xf[..., half:]
        re = a * cos - b * sin
        im = a * sin + b * cos
        if self.interleaved:
            out = ops.reshape(ops.stack([re, im], axis=-1), list(v.shape))
        else:
            out = ops.concat([re, im], axis=-1)
        return out.cast(v.dtype)


class Llama3RotaryEmbedding(RotaryEmbedding):
    """RoPE with Llama 3.1 scaling: low frequencies divided by ``factor``, a smooth blend in between."""

    def __init__(self, dim: int, n_heads: int, theta: float, max_seq_len: int, device: DeviceRef,
                 head_dim: int | None = None, _freqs_cis: Any = None, interleaved: bool = True,
                 scaling_params: Llama3RopeScalingParams | None = None) -> None:
        super().__init__(dim, n_heads, theta, max_seq_len, device, head_dim, _freqs_cis, interleaved)
        self.scaling_params = scaling_params

    def _inv_freq(self) -> np.ndarray:
        inv = super()._inv_freq()
        p = self.scaling_params
        if p is None:
            return inv
        low_wavelen = p.orig_max_position / p.low_freq_factor
        high_wavelen = p.orig_max_position / p.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wavelen, inv / p.factor, inv)
        smooth = (p.orig_max_position / wavelen - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor)
        blended = (1 - smooth) * scaled / p.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, blended, scaled)


class DynamicRotaryEmbedding(RotaryEmbedding):
    """RoPE with dynamic NTK scaling.

    ``maybe_update_freqs(position_ids)`` grows the base (``theta * (L /
    max_seq_len) ** (d / (d - 2))`` for ``L = max(position_ids) + 1``) when
    ``L`` exceeds the longest length seen so far, and restores the original
    frequencies once ``L`` fits in ``max_seq_len`` again.  Tables built after
    an update use the current ``inv_freq``.
    """

    def __init__(self, dim: int, n_heads: int, theta: float, max_seq_len: int, device: DeviceRef,
                 head_dim: int | None = None, _freqs_cis: Any = None, interleaved: bool = True) -> None:
        super().__init__(dim, n_heads, theta, max_seq_len, device, head_dim, _freqs_cis, interleaved)
        self.original_max_seq_len = max_seq_len
        self.max_seq_len_cached = max_seq_len
        self.original_inv_freq = _base_inv_freq(theta, self._rope_dim())
        self.inv_freq = self.original_inv_freq.copy()

    def _inv_freq(self) -> np.ndarray:
        return self.inv_freq

    def _num_positions(self) -> int:
        return max(self.max_seq_len, self.max_seq_len_cached) * 2

    def freqs_cis_base(self) -> TensorValue:
        """The (cos, sin) table for the current ``inv_freq``."""
        return super().freqs_cis_base()

    def maybe_update_freqs(self, position_ids: Any) -> None:
        """Rescale ``inv_freq`` for the sequence length implied by ``position_ids`` (host values)."""
        pos = _concrete_ints(position_ids, f"{type(self).__name__}.maybe_update_freqs")
        seq_len = int(pos.max()) + 1 if pos.size else 0
        d = self._rope_dim()
        if seq_len > self.max_seq_len_cached:
            base = self.theta * (seq_len / self.original_max_seq_len) ** (d / (d - 2))
            self.inv_freq = _base_inv_freq(base, d)
            self.max_seq_len_cached = seq_len
            self._max_nn_cache = None
        elif seq_len < self.original_max_seq_len < self.max_seq_len_cached:
            self.inv_freq = self.original_inv_freq.copy()
            self.max_seq_len_cached = self.original_max_seq_len
            self._max_nn_cache = None


class YarnRotaryEmbedding(RotaryEmbedding):
    """Generic YaRN RoPE; the table carries the attention factor ``0.1 * ln(factor) + 1``."""

    def __init__(self, dim: int, n_heads: int, theta: float, max_seq_len: int, device: DeviceRef,
                 head_dim: int | None = None, _freqs_cis: Any = None, interleaved: bool = True,
                 scaling_params: YarnScalingParams | None = None) -> None:
        super().__init__(dim, n_heads, theta, max_seq_len, device, head_dim, _freqs_cis, interleaved)
        self.scaling_params = scaling_params

    def _inv_freq(self) -> np.ndarray:
        p = self.scaling_params
        if p is None:
            return super()._inv_freq()
        return _yarn_inv_freq(self.theta, self._rope_dim(), p.factor, p.beta_fast, p.beta_slow,
                              p.original_max_position_embeddings, p.truncate)

    def _table(self) -> np.ndarray:
        scale = self.scaling_params.table_scale() if self.scaling_params is not None else 1.0
        return _cis_table(np.arange(self._num_positions()), self._inv_freq(), scale)

    def freqs_cis_base(self) -> TensorValue:
        """The YaRN-scaled (cos, sin) table, shape ``(max_seq_len * 2, head_dim // 2, 2)``."""
        return super().freqs_cis_base()


class DeepseekYarnRotaryEmbedding(RotaryEmbedding):
    """DeepSeek's YaRN RoPE over ``dim`` rotary features (``dim`` is the rope dim, not the hidden size).

    The table, shape ``(max_seq_len, dim // 2, 2)``, carries
    ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)``; the
    softmax scale (``compute_scale``) carries ``mscale(factor, mscale_all_dim) ** 2``,
    where ``mscale(s, m) = 0.1 * m * ln(s) + 1``.
    """

    def __init__(self, dim: int, n_heads: int, theta: float, max_seq_len: int, device: DeviceRef,
                 head_dim: int | None = None, _freqs_cis: Any = None, interleaved: bool = True,
                 scaling_params: DeepseekYarnRopeScalingParams | None = None) -> None:
        super().__init__(dim, n_heads, theta, max_seq_len, device, head_dim, _freqs_cis, interleaved)
        self.scaling_params = scaling_params

    def _rope_dim(self) -> int:
        return self.dim

    def _num_positions(self) -> int:
        return self.max_seq_len

    def _inv_freq(self) -> np.ndarray:
        p = self.scaling_params
        if p is None:
            return super()._inv_freq()
        return _yarn_inv_freq(self.theta, self.dim, p.scaling_factor, p.beta_fast, p.beta_slow,
                              p.original_max_position_embeddings, True)

    def _table(self) -> np.ndarray:
        p = self.scaling_params
        scale = 1.0
        if p is not None:
            scale = _yarn_mscale(p.scaling_factor, p.mscale) / _yarn_mscale(p.scaling_factor, p.mscale_all_dim)
        return _cis_table(np.arange(self._num_positions()), self._inv_freq(), scale)

    def freqs_cis_base(self) -> TensorValue:
        """The (cos, sin) table, shape ``(max_seq_len, rope_dim // 2, 2)``."""
        return super().freqs_cis_base()

    def compute_scale(self, user_scale: float | None = None) -> float:
        """``(user_scale or 1/sqrt(head_dim)) * mscale(factor, mscale_all_dim) ** 2``."""
        base = super().compute_scale(user_scale)
        p = self.scaling_params
        if p is None or not p.mscale_all_dim:
            return base
        m = _yarn_mscale(p.scaling_factor, p.mscale_all_dim)
        return base * m * m


class LongRoPERotaryEmbedding(RotaryEmbedding):
    """LongRoPE (Phi-3.5): per-frequency factors, ``short_factor`` below ``original_max_position``, ``long_factor`` beyond.

    The table is unscaled; the attention factor
    ``sqrt(1 + ln(s) / ln(original_max_position))`` with
    ``s = max_position_embeddings / original_max_position`` enters the softmax
    scale squared (``compute_scale``), which equals scaling both q and k by it.
    """

    def __init__(self, dim: int, n_heads: int, theta: float, max_seq_len: int, device: DeviceRef,
                 head_dim: int | None = None, _freqs_cis: Any = None, interleaved: bool = True,
                 scaling_params: LongRoPEScalingParams | None = None, factors: Optional[str] = None) -> None:
        super().__init__(dim, n_heads, theta, max_seq_len, device, head_dim, _freqs_cis, interleaved)
        self.scaling_params = scaling_params
        if factors not in (None, "short", "long"):
            raise ValueError(f"LongRoPERotaryEmbedding: factors must be None, 'short' or 'long', got {factors!r}")
        self.factors = factors
        """libremax extension: None (the reference's table: short factors below ``original_max_position``,
        long beyond, attention factor in ``compute_scale``); ``"short"`` / ``"long"``: one factor set for
        every position with the attention factor folded into the table, for models that choose the
        factors by each sequence's length (as transformers does)."""
        if scaling_params is not None:
            half = self._rope_dim() // 2
            for what in ("short_factor", "long_factor"):
                n = len(getattr(scaling_params, what))
                if n != half:
                    raise ValueError(f"LongRoPERotaryEmbedding: {what} has {n} entries, expected rope_dim/2 = {half}")

    def _attention_factor(self) -> float:
        p = self.scaling_params
        return 1.0 if p is None else p.attention()

    def _table(self) -> np.ndarray:
        p = self.scaling_params
        pos = np.arange(self._num_positions())
        base = super()._inv_freq()
        if p is None:
            return _cis_table(pos, base)
        if self.factors is not None:
            ext = np.asarray(p.long_factor if self.factors == "long" else p.short_factor, dtype=np.float64)
            return _cis_table(pos, base / ext, self._attention_factor())
        short = _cis_table(pos, base / np.asarray(p.short_factor, dtype=np.float64))
        long = _cis_table(pos, base / np.asarray(p.long_factor, dtype=np.float64))
        return np.where((pos < p.original_max_position)[:, None, None], short, long)

    def freqs_cis_base(self) -> TensorValue:
        """The stitched (cos, sin) table, shape ``(max_seq_len * 2, head_dim // 2, 2)``."""
        return super().freqs_cis_base()

    def compute_scale(self, user_scale: float | None = None) -> float:
        """``(user_scale or 1/sqrt(head_dim)) * attention_factor ** 2`` (not with ``factors``: then the
        table carries the attention factor)."""
        if self.factors is not None:
            return super().compute_scale(user_scale)
        m = self._attention_factor()
        return super().compute_scale(user_scale) * m * m


class LinearScalingRotaryEmbedding(RotaryEmbedding):
    """Position interpolation (libremax extension): every frequency divided by ``scaling_params.factor``."""

    def __init__(self, dim: int, n_heads: int, theta: float, max_seq_len: int, device: DeviceRef,
                 head_dim: int | None = None, _freqs_cis: Any = None, interleaved: bool = True,
                 scaling_params: LinearScalingParams | None = None) -> None:
        super().__init__(dim, n_heads, theta, max_seq_len, device, head_dim, _freqs_cis, interleaved)
        self.scaling_params = scaling_params

    def _inv_freq(self) -> np.ndarray:
        base = super()._inv_freq()
        return base if self.scaling_params is None else base / self.scaling_params.factor


class ProportionalRotaryEmbedding(RotaryEmbedding):
    """Proportional RoPE (Gemma 4's global layers): the table covers the whole head (pairs ``i`` and
    ``i + head_dim / 2``), but only the first ``partial_rotary_factor * head_dim / 2`` frequencies are
    the usual ``theta ** (-2i / head_dim)`` -- the others are 0 (those pairs are not rotated); every
    frequency is divided by ``factor``."""

    def __init__(self, dim: int, n_heads: int, theta: float, max_seq_len: int, device: DeviceRef,
                 head_dim: int | None = None, _freqs_cis: Any = None, interleaved: bool = True,
                 partial_rotary_factor: float = 1.0, factor: float = 1.0) -> None:
        super().__init__(dim, n_heads, theta, max_seq_len, device, head_dim, _freqs_cis, interleaved)
        self.partial_rotary_factor, self.factor = float(partial_rotary_factor), float(factor)

    def _inv_freq(self) -> np.ndarray:
        d = self._rope_dim()
        rotated = int(self.partial_rotary_factor * d // 2)
        inv = np.zeros(d // 2, np.float64)
        inv[:rotated] = rope_inv_freq(self.theta, d)[:rotated]
        return inv / self.factor


class FreqFactorsRotaryEmbedding(RotaryEmbedding):
    """RoPE whose pair ``i`` frequency is divided by ``freq_factors[i]`` (llama.cpp's ``rope_freqs`` tensor of
    GGUF files whose factors are no ``llama3`` scaling; libremax's ``freq_factors`` kind)."""

    def __init__(self, dim: int, n_heads: int, theta: float, max_seq_len: int, device: DeviceRef,
                 freq_factors: Any, **kw: Any) -> None:
        super().__init__(dim, n_heads, theta, max_seq_len, device, **kw)
        self.freq_factors = np.asarray(freq_factors, np.float64).reshape(-1)
        if self.freq_factors.size != self._rope_dim() // 2:
            raise ValueError(f"RoPE freq_factors: {self.freq_factors.size} factors for {self._rope_dim()} rotated "
                             f"dims (expected {self._rope_dim() // 2})")
        if not np.all(np.isfinite(self.freq_factors)) or np.any(self.freq_factors <= 0):
            raise ValueError("RoPE freq_factors must be positive and finite")

    def _inv_freq(self) -> np.ndarray:
        return super()._inv_freq() / self.freq_factors


ROPE_SCALINGS = ("default", "freq_factors", "linear", "llama3", "longrope", "proportional", "yarn")
"""The ``rope_scaling`` kinds of Hugging Face configs :func:`rope_from_hf` builds."""


def rope_from_hf(rope_scaling: Optional[dict], *, max_position_embeddings: int, longrope_factors: Optional[str] = None,
                 **common: Any) -> RotaryEmbedding:
    """The RoPE layer a Hugging Face ``rope_scaling`` dict describes (None: plain RoPE); ``common``: the
    :class:`RotaryEmbedding` arguments (``dim``, ``n_heads``, ``theta``, ``max_seq_len``, ``device``,
    ``head_dim``, ``interleaved``).  ``longrope_factors``: see :class:`LongRoPERotaryEmbedding` ``factors``.
    Raises NotImplementedError for another kind (``ROPE_SCALINGS`` lists the supported ones)."""
    sc = rope_scaling or {}
    kind = sc.get("rope_type") or sc.get("type") or "default"
    if kind == "default":
        return RotaryEmbedding(**common)
    if kind == "llama3":
        return Llama3RotaryEmbedding(**common, scaling_params=Llama3RopeScalingParams(
            factor=float(sc["factor"]), low_freq_factor=float(sc.get("low_freq_factor", 1.0)),
            high_freq_factor=float(sc.get("high_freq_factor", 4.0)),
            orig_max_position=int(sc.get("original_max_position_embeddings", 8192))))
    if kind == "freq_factors":
        return FreqFactorsRotaryEmbedding(**common, freq_factors=sc["freq_factors"])
    if kind == "proportional":
        return ProportionalRotaryEmbedding(**common, partial_rotary_factor=float(sc.get("partial_rotary_factor", 1.0)),
                                           factor=float(sc.get("factor", 1.0)))
    if kind == "linear":
        return LinearScalingRotaryEmbedding(**common, scaling_params=LinearScalingParams(factor=float(sc["factor"])))
    if kind == "longrope":
        return LongRoPERotaryEmbedding(**common, factors=longrope_factors, scaling_params=LongRoPEScalingParams(
            short_factor=list(sc["short_factor"]), long_factor=list(sc["long_factor"]),
            original_max_position=int(sc["original_max_position_embeddings"]),
            max_position_embeddings=int(max_position_embeddings), factor=sc.get("factor"),
            attention_factor=sc.get("attention_factor")))
    if kind == "yarn":
        orig = int(sc.get("original_max_position_embeddings") or max_position_embeddings)
        factor = float(sc.get("factor") or max_position_embeddings / orig)
        return YarnRotaryEmbedding(**common, scaling_params=YarnScalingParams(
            factor=factor, beta_fast=float(sc.get("beta_fast") or 32), beta_slow=float(sc.get("beta_slow") or 1),
            original_max_position_embeddings=orig, truncate=bool(sc.get("truncate", True)),
            attention_factor=sc.get("attention_factor"), mscale=sc.get("mscale"),
            mscale_all_dim=sc.get("mscale_all_dim")))
    raise NotImplementedError(f"RoPE scaling {kind!r} is not supported yet (supported: {', '.join(ROPE_SCALINGS)})")
