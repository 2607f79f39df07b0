"""Llama 4 vision-language configuration (``Llama4ForConditionalGeneration``): the text decoder is Llama 4's
(``text_config`` through the llama4 family's translation); the vision encoder (``vision_config``) and the
projector are described by :class:`VisionConfig`."""

from __future__ import annotations

from dataclasses import dataclass

from max.pipelines.architectures.common import DecoderConfig
from max.pipelines.architectures.common.vision_config import PixelShuffleTokens, hf_part, inverse_ratio, square_size
from max.pipelines.architectures.llama4.config import config_from_hf as llama4_text_config

ARCHITECTURE = "Llama4ForConditionalGeneration"


def config_from_hf(hf: dict) -> DecoderConfig:
    """The text decoder's config (Llama 4's), named after the multimodal architecture."""
    if not isinstance(hf.get("text_config"), dict):
        raise ValueError(f"{ARCHITECTURE}: the config has no text_config")
    cfg = llama4_text_config(hf)
    cfg.architecture = ARCHITECTURE
    cfg.tie_word_embeddings = bool(hf.get("tie_word_embeddings", False))
    return cfg


@dataclass(frozen=True)
class VisionConfig(PixelShuffleTokens):
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    image_size: int
    patch_size: int
    num_channels: int
    rope_theta: float
    scale_factor: int
    """``1 / pixel_shuffle_ratio``: each ``s`` x ``s`` patches become one token."""
    projector_input_dim: int
    projector_output_dim: int
    text_hidden_size: int


def vision_config_from_hf(hf: dict) -> VisionConfig:
    v = hf_part(hf, "vision_config", ARCHITECTURE)
    if v.get("vision_feature_select_strategy", "default") != "default":
        raise NotImplementedError(f"{ARCHITECTURE}: vision_feature_select_strategy "
                                  f"{v.get('vision_feature_select_strategy')!r} is not supported (only 'default')")
    scale = inverse_ratio(float(v.get("pixel_shuffle_ratio", 0.5)), "pixel_shuffle_ratio", ARCHITECTURE)
    rope = v.get("rope_parameters") or {}
    c = VisionConfig(
        hidden_size=int(v["hidden_size"]), intermediate_size=int(v["intermediate_size"]),
        num_hidden_layers=int(v["num_hidden_layers"]), num_attention_heads=int(v["num_attention_heads"]),
        image_size=square_size(v.get("image_size", 448), "image size", ARCHITECTURE), patch_size=square_size(v.get("patch_size", 14), "patch", ARCHITECTURE),
        num_channels=int(v.get("num_channels", 3)), rope_theta=float(rope.get("rope_theta", v.get("rope_theta", 1e4))),
        scale_factor=scale, projector_input_dim=int(v["projector_input_dim"]),
        projector_output_dim=int(v["projector_output_dim"]), text_hidden_size=int(hf["text_config"]["hidden_size"]))
    shuffled = c.hidden_size * scale * scale
    if c.patches_per_side % scale or c.intermediate_size != shuffled:
        raise ValueError(f"{ARCHITECTURE}: the pixel shuffle by {scale} needs a patch grid side divisible by it (got "
                         f"{c.patches_per_side}) and intermediate_size = hidden_size * {scale * scale} = {shuffled} "
                         f"(got {c.intermediate_size})")
    if c.head_dim % 4:
        raise ValueError(f"{ARCHITECTURE}: the vision head size {c.head_dim} must be a multiple of 4 (2-D RoPE)")
    if int(v.get("vision_output_dim", c.projector_output_dim)) != c.projector_output_dim or \
            c.projector_input_dim != c.projector_output_dim:
        raise ValueError(f"{ARCHITECTURE}: vision_output_dim, projector_input_dim and projector_output_dim must agree")
    return c
