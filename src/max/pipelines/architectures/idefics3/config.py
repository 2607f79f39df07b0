"""Idefics3 configuration (``Idefics3ForConditionalGeneration``, e.g. SmolVLM): a Llama text decoder
(``text_config``), a SigLIP vision transformer over image tiles (``vision_config``) and a connector
(pixel shuffle by ``scale_factor``, then a linear projection)."""

from __future__ import annotations

from dataclasses import dataclass

from max.pipelines.architectures.common import DecoderConfig, hf_common
from max.pipelines.architectures.common.siglip import SiglipConfig, siglip_fields
from max.pipelines.architectures.common.vision_config import PixelShuffleTokens, hf_part

ARCHITECTURE = "Idefics3ForConditionalGeneration"


def config_from_hf(hf: dict) -> DecoderConfig:
    return DecoderConfig(**hf_common(hf_part(hf, "text_config", ARCHITECTURE), ARCHITECTURE))


@dataclass(frozen=True)
class VisionConfig(PixelShuffleTokens, SiglipConfig):
    scale_factor: int = 2
    text_hidden_size: int = 0


def vision_config_from_hf(hf: dict) -> VisionConfig:
    v = hf_part(hf, "vision_config", ARCHITECTURE)
    c = VisionConfig(**siglip_fields(v), scale_factor=int(hf.get("scale_factor", 2)),
                     text_hidden_size=int(hf["text_config"]["hidden_size"]))
    if c.patches_per_side % c.scale_factor:
        raise ValueError(f"{ARCHITECTURE}: scale_factor {c.scale_factor} must divide the patch grid side "
                         f"{c.patches_per_side}")
    return c
