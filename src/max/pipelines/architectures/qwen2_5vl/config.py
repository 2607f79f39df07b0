"""Qwen2.5-VL configuration (``Qwen2_5_VLForConditionalGeneration``): a Qwen2 text decoder whose RoPE is
multimodal (M-RoPE: the head's frequencies split into temporal/height/width sections, each rotated by
its own position axis) and a ViT with 2-D RoPE and window attention."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from max.graph.rope import rope_inv_freq
from max.pipelines.architectures.common import DecoderConfig, hf_common
from max.pipelines.architectures.common.vision_config import MergedPatchGrid, hf_part, merged_patch_fields

ARCHITECTURE = "Qwen2_5_VLForConditionalGeneration"


def _text(hf: dict) -> dict:
    text = hf.get("text_config")
    if not isinstance(text, dict):  # older checkpoints keep the text fields at the top level
        text = hf
    return text


def config_from_hf(hf: dict) -> DecoderConfig:
    text = dict(_text(hf))
    if not text.get("use_sliding_window"):
        text["sliding_window"] = None
        text["layer_types"] = None
    cfg = DecoderConfig(**{**hf_common(text, ARCHITECTURE), "attention_bias": True})
    cfg.extra["mrope_section"] = mrope_section(hf)
    return cfg


def mrope_section(hf: dict) -> list[int]:
    """How many of each head's RoPE frequencies the temporal, height and width positions rotate."""
    text = _text(hf)
    for rp in (text.get("rope_parameters"), text.get("rope_scaling"), hf.get("rope_scaling")):
        if isinstance(rp, dict) and rp.get("mrope_section"):
            return [int(s) for s in rp["mrope_section"]]
    raise ValueError(f"{ARCHITECTURE}: the config has no rope mrope_section")


@dataclass(frozen=True)
class VisionConfig(MergedPatchGrid):
    window_size: int
    fullatt_block_indexes: tuple[int, ...]

    @property
    def window_tokens(self) -> int:
        """A window's side in merged tokens."""
        return self.window_size // self.spatial_merge_size // self.patch_size


def vision_config_from_hf(hf: dict) -> VisionConfig:
    v = hf_part(hf, "vision_config", ARCHITECTURE)
    fields = merged_patch_fields(v, "silu")
    fields["in_channels"] = int(v.get("in_channels", v.get("in_chans", 3)))  # older configs name it in_chans
    c = VisionConfig(**fields,
                     window_size=int(v["window_size"]),
                     fullatt_block_indexes=tuple(int(i) for i in v.get("fullatt_block_indexes", ())))
    if c.window_tokens < 1:
        raise ValueError(f"{ARCHITECTURE}: window_size {c.window_size} is smaller than one merged patch")
    return c


def inv_freq(theta: float, dim: int) -> np.ndarray:
    """RoPE inverse frequencies ``theta ** (-2i / dim)`` (float32, as transformers computes them)."""
    return rope_inv_freq(theta, dim, np.float32)
