"""Idefics3 configuration (``Idefics3ForConditionalGeneration``, e.g. SmolVLM): a Llama text decoder
(``text_config``), a SigLIP vision transformer over image tiles (``vision_config``) and a connector
(pixel shuffle by ``scale_factor``, then a linear projection)."""

from __future__ import annotations

from dataclasses import dataclass

from max.pipelines.architectures.common import DecoderConfig, hf_common
from max.pipelines.architectures.common.siglip import SiglipConfig, siglip_fields

ARCHITECTURE = "Idefics3ForConditionalGeneration"


def config_from_hf(hf: dict) -> DecoderConfig:
    text = hf.get("text_config")
    if not isinstance(text, dict):
        raise ValueError(f"{ARCHITECTURE}: the config has no text_config")
    return DecoderConfig(**hf_common(text, ARCHITECTURE))


@dataclass(frozen=True)
class VisionConfig(SiglipConfig):
    scale_factor: int = 2
    text_hidden_size: int = 0

    @property
    def tokens_per_tile(self) -> int:
        return self.patches_per_side ** 2 // self.scale_factor ** 2


def vision_config_from_hf(hf: dict) -> VisionConfig:
    v = hf.get("vision_config")
    if not isinstance(v, dict):
        raise ValueError(f"{ARCHITECTURE}: the config has no vision_config")
    c = VisionConfig(**siglip_fields(v), scale_factor=int(hf.get("scale_factor", 2)),
                     text_hidden_size=int(hf["text_config"]["hidden_size"]))
    if c.patches_per_side % c.scale_factor:
        raise ValueError(f"{ARCHITECTURE}: scale_factor {c.scale_factor} must divide the patch grid side "
                         f"{c.patches_per_side}")
    return c
