"""Qwen3-VL configuration (``Qwen3VLForConditionalGeneration``): a Qwen3 text decoder (per-head q/k RMSNorm)
whose RoPE is multimodal with the temporal/height/width frequencies *interleaved* (frequency ``j`` turns by
the height position when ``j % 3 == 1`` and ``j < 3 * section[1]``, by the width position when
``j % 3 == 2`` and ``j < 3 * section[2]``, else by the temporal one), and a ViT with learned (bilinearly
resampled) position embeddings, 2-D RoPE, full attention per frame and DeepStack mergers: the features of
some intermediate vision blocks, each merged by its own MLP, are added to the hidden states of the first
decoder layers at the image rows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from max.pipelines.architectures.common import DecoderConfig, hf_common
from max.pipelines.architectures.common.vision_config import MergedPatchGrid, hf_part, merged_patch_fields
from max.pipelines.architectures.qwen2_5vl.config import mrope_section

ARCHITECTURE = "Qwen3VLForConditionalGeneration"


def text_config(hf: dict) -> dict:
    return hf_part(hf, "text_config", ARCHITECTURE)


def config_fields(hf: dict, architecture: str) -> dict:
    """The decoder's fields (Qwen3: q/k norms per head; no sliding window) and the M-RoPE sections."""
    text = dict(text_config(hf))
    text["sliding_window"], text["layer_types"] = None, None
    c = hf_common(text, architecture)
    c.update(qk_norm="head", tie_word_embeddings=bool(hf.get("tie_word_embeddings", text.get("tie_word_embeddings"))))
    return c


def config_from_hf(hf: dict) -> DecoderConfig:
    return with_vision_extras(DecoderConfig(**config_fields(hf, ARCHITECTURE)), hf)


def with_vision_extras(cfg: DecoderConfig, hf: dict) -> DecoderConfig:
    """``cfg`` with the M-RoPE sections and the number of DeepStack features (what the step graph needs)."""
    cfg.extra["mrope_section"] = mrope_section(hf)
    cfg.extra["deepstack"] = len((hf.get("vision_config") or {}).get("deepstack_visual_indexes") or ())
    return cfg


def interleaved_axes(section: list[int], half: int) -> np.ndarray:
    """The position axis (0 temporal, 1 height, 2 width) of each of a head's ``half`` RoPE frequencies."""
    if len(section) != 3:
        raise ValueError(f"{ARCHITECTURE}: mrope_section {section} must have three sections (t, h, w)")
    axis = np.zeros(half, np.int64)
    for a in (1, 2):
        axis[a:3 * section[a]:3] = a
    return axis


@dataclass(frozen=True)
class VisionConfig(MergedPatchGrid):
    num_position_embeddings: int
    deepstack_visual_indexes: tuple[int, ...]

    @property
    def grid_side(self) -> int:
        """Side of the square table of learned position embeddings."""
        return int(round(self.num_position_embeddings ** 0.5))


def vision_config_from_hf(hf: dict) -> VisionConfig:
    v = hf_part(hf, "vision_config", ARCHITECTURE)
    c = VisionConfig(**merged_patch_fields(v, "gelu_pytorch_tanh"),
                     num_position_embeddings=int(v["num_position_embeddings"]),
                     deepstack_visual_indexes=tuple(int(i) for i in v.get("deepstack_visual_indexes", ())))
    if c.grid_side ** 2 != c.num_position_embeddings:
        raise ValueError(f"{ARCHITECTURE}: num_position_embeddings {c.num_position_embeddings} is not a square")
    bad = [i for i in c.deepstack_visual_indexes if not 0 <= i < c.depth]
    if bad:
        raise ValueError(f"{ARCHITECTURE}: deepstack_visual_indexes {bad} are not vision blocks (depth {c.depth})")
    return c
