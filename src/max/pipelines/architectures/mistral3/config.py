"""Mistral 3 configuration (``Mistral3ForConditionalGeneration``): a Mistral (Llama-shaped) text decoder
(``text_config``), a Pixtral vision encoder (``vision_config``) and the multimodal projector's top-level
fields (``spatial_merge_size``, ``vision_feature_layer``, ``projector_hidden_act``,
``multimodal_projector_bias``)."""

from __future__ import annotations

from dataclasses import dataclass

from max.pipelines.architectures.common import DecoderConfig, hf_common
from max.pipelines.architectures.common.vision_config import hf_part

ARCHITECTURE = "Mistral3ForConditionalGeneration"


def config_from_hf(hf: dict) -> DecoderConfig:
    text = hf_part(hf, "text_config", ARCHITECTURE)
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    if isinstance(rope, dict) and rope.get("llama_4_scaling_beta"):
        raise NotImplementedError(f"{ARCHITECTURE}: the text decoder's position-dependent query scaling "
                                  "(rope llama_4_scaling_beta, Ministral 3) is not supported")
    return DecoderConfig(**hf_common(text, ARCHITECTURE))


@dataclass(frozen=True)
class VisionConfig:
    """The Pixtral encoder and the projector (patch merger, two linear layers) to the text width."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_channels: int
    patch_size: int
    hidden_act: str
    rope_theta: float
    spatial_merge_size: int
    feature_layer: int
    """The hidden state that feeds the projector (0: after ``ln_pre``, ``k``: after layer ``k``)."""
    projector_act: str
    projector_bias: bool
    projector_norm_eps: float
    text_hidden_size: int
    merger: bool = True
    """Whether the projector starts with RMSNorm and the patch merger (Mistral 3), or is the two linear
    layers alone (Llava's projector over a Pixtral tower)."""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def patch_dim(self) -> int:
        return self.num_channels * self.patch_size ** 2

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size ** 2

    @property
    def token_pixels(self) -> int:
        """An image token's side in pixels (the image sides must be multiples of it)."""
        return self.patch_size * self.spatial_merge_size


def vision_config_from_hf(hf: dict) -> VisionConfig:
    v, text = hf_part(hf, "vision_config", ARCHITECTURE), hf_part(hf, "text_config", ARCHITECTURE)
    layers = int(v["num_hidden_layers"])
    fl = hf.get("vision_feature_layer", -1)
    if isinstance(fl, (list, tuple)):  # the projector's norm and merger are sized for one layer's features
        raise NotImplementedError(f"{ARCHITECTURE}: a list of vision_feature_layer ({fl}) is not supported")
    if not -(layers + 1) <= int(fl) <= layers:
        raise ValueError(f"{ARCHITECTURE}: vision_feature_layer {fl} is outside the {layers + 1} hidden states")
    rp = v.get("rope_parameters") or {}
    c = VisionConfig(hidden_size=int(v["hidden_size"]), intermediate_size=int(v["intermediate_size"]),
                     num_hidden_layers=layers, num_attention_heads=int(v["num_attention_heads"]),
                     num_channels=int(v.get("num_channels", 3)), patch_size=int(v["patch_size"]),
                     hidden_act=str(v.get("hidden_act", "gelu")),
                     rope_theta=float(rp.get("rope_theta", v.get("rope_theta", 10000.0))),
                     spatial_merge_size=int(hf.get("spatial_merge_size", 2)),
                     feature_layer=int(fl) % (layers + 1),
                     projector_act=str(hf.get("projector_hidden_act", "gelu")),
                     projector_bias=bool(hf.get("multimodal_projector_bias", False)),
                     projector_norm_eps=float(text.get("rms_norm_eps", 1e-5)),
                     text_hidden_size=int(text["hidden_size"]))
    hd = v.get("head_dim")
    if c.hidden_size % c.num_attention_heads or (hd and int(hd) != c.head_dim) or c.head_dim % 4:
        raise ValueError(f"{ARCHITECTURE}: the vision head size ({c.hidden_size} / {c.num_attention_heads} heads, "
                         f"head_dim {hd}) must be whole, agree with head_dim and be a multiple of 4 (2-D RoPE)")
    return c
