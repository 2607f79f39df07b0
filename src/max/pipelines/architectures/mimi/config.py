"""Mimi's settings, read from a ``MimiConfig.to_dict()`` (or a saved ``config.json``), and the sizes derived
from them (frame rate, hop, the latent stride of the down/upsampling convolutions)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["MimiSettings", "settings_from_dict"]

WHO = "Mimi"


@dataclass(frozen=True)
class MimiSettings:
    sampling_rate: int
    audio_channels: int
    hidden_size: int
    num_filters: int
    num_residual_layers: int
    upsampling_ratios: tuple[int, ...]
    kernel_size: int
    last_kernel_size: int
    residual_kernel_size: int
    dilation_growth_rate: int
    compress: int
    trim_right_ratio: float
    pad_mode: str
    use_conv_shortcut: bool
    codebook_size: int
    codebook_dim: int
    num_quantizers: int
    num_semantic_quantizers: int
    vq_dim: int
    upsample_groups: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_act: str
    norm_eps: float
    rope_theta: float
    sliding_window: int
    attention_bias: bool
    frame_rate: float

    @property
    def hop_length(self) -> int:
        """Waveform samples per SEANet frame (the product of the ratios)."""
        return math.prod(self.upsampling_ratios)

    @property
    def encodec_frame_rate(self) -> int:
        return math.ceil(self.sampling_rate / self.hop_length)

    @property
    def latent_stride(self) -> int:
        """Stride of the downsample / upsample convolutions (1: there are none)."""
        return int(self.encodec_frame_rate / self.frame_rate)

    @property
    def has_resample(self) -> bool:
        return self.frame_rate != self.encodec_frame_rate

    @property
    def samples_per_frame(self) -> int:
        """Waveform samples per code frame."""
        return self.hop_length * (self.latent_stride if self.has_resample else 1)


def _frame_size(ratios: tuple[int, ...]) -> int:
    # the encoder's strides: the SEANet ratios, then the fixed factor-2 downsampling of the latent
    return math.prod(ratios) * 2


def settings_from_dict(d: Mapping[str, Any]) -> MimiSettings:
    """Settings of a Mimi config dict; ValueError / NotImplementedError name what cannot be run."""
    if not isinstance(d, Mapping):
        raise TypeError(f"{WHO}: config must be a dict (MimiConfig.to_dict()), got {type(d).__name__}")
    g = dict(d).get
    ratios = tuple(int(r) for r in (g("upsampling_ratios") or (8, 6, 5, 4)))
    hidden = int(g("hidden_size", 512))
    heads = int(g("num_attention_heads", 8))
    rope = g("rope_parameters") or {}
    theta = float(rope.get("rope_theta", g("rope_theta", 10000.0)))
    if rope.get("rope_type", "default") != "default":
        raise NotImplementedError(f"{WHO}: rope_type {rope.get('rope_type')!r} is not supported (only 'default')")
    sr = int(g("sampling_rate", 24000))
    frame_rate = g("frame_rate", None)
    if frame_rate is None:
        frame_rate = g("_frame_rate", None)
    if frame_rate is None:
        frame_rate = sr / _frame_size(ratios)
    s = MimiSettings(
        sampling_rate=sr, audio_channels=int(g("audio_channels", 1)), hidden_size=hidden,
        num_filters=int(g("num_filters", 64)), num_residual_layers=int(g("num_residual_layers", 1)),
        upsampling_ratios=ratios, kernel_size=int(g("kernel_size", 7)), last_kernel_size=int(g("last_kernel_size", 3)),
        residual_kernel_size=int(g("residual_kernel_size", 3)), dilation_growth_rate=int(g("dilation_growth_rate", 2)),
        compress=int(g("compress", 2)), trim_right_ratio=float(g("trim_right_ratio", 1.0)),
        pad_mode=str(g("pad_mode", "constant")), use_conv_shortcut=bool(g("use_conv_shortcut", False)),
        codebook_size=int(g("codebook_size", 2048)), codebook_dim=int(g("codebook_dim") or hidden),
        num_quantizers=int(g("num_quantizers", 32)), num_semantic_quantizers=int(g("num_semantic_quantizers", 1)),
        vq_dim=int(g("vector_quantization_hidden_dimension", 256)), upsample_groups=int(g("upsample_groups", 512)),
        num_hidden_layers=int(g("num_hidden_layers", 8)), intermediate_size=int(g("intermediate_size", 2048)),
        num_attention_heads=heads, num_key_value_heads=int(g("num_key_value_heads") or heads),
        head_dim=int(g("head_dim") or hidden // heads), hidden_act=str(g("hidden_act", "gelu")),
        norm_eps=float(g("norm_eps", 1e-5)), rope_theta=theta, sliding_window=g("sliding_window", 250),
        attention_bias=bool(g("attention_bias", False)), frame_rate=float(frame_rate))
    _check(s, d)
    return s


def _check(s: MimiSettings, d: Mapping[str, Any]) -> None:
    if not d.get("use_causal_conv", True):
        raise NotImplementedError(f"{WHO}: only causal convolutions (use_causal_conv=True) are supported")
    if s.audio_channels != 1:
        raise NotImplementedError(f"{WHO}: only mono audio (audio_channels=1) is supported, got {s.audio_channels}")
    if s.pad_mode != "constant":
        raise NotImplementedError(f"{WHO}: only pad_mode 'constant' is supported, got {s.pad_mode!r}")
    if s.trim_right_ratio != 1.0:
        raise NotImplementedError(f"{WHO}: only trim_right_ratio 1.0 is supported, got {s.trim_right_ratio}")
    if s.use_conv_shortcut:
        raise NotImplementedError(f"{WHO}: use_conv_shortcut=True is not supported")
    if s.sliding_window is None or int(s.sliding_window) < 1:
        raise NotImplementedError(f"{WHO}: the transformers need a sliding_window >= 1, got {s.sliding_window!r}")
    if not 0 < s.num_semantic_quantizers < s.num_quantizers:
        raise ValueError(f"{WHO}: num_semantic_quantizers ({s.num_semantic_quantizers}) must be in "
                         f"[1, num_quantizers={s.num_quantizers})")
    if s.num_attention_heads % s.num_key_value_heads:
        raise ValueError(f"{WHO}: num_attention_heads ({s.num_attention_heads}) must be a multiple of "
                         f"num_key_value_heads ({s.num_key_value_heads})")
    if s.has_resample and s.hidden_size % s.upsample_groups:
        raise ValueError(f"{WHO}: hidden_size ({s.hidden_size}) must be a multiple of upsample_groups "
                         f"({s.upsample_groups})")
