"""Gemma 3 multimodal configuration (``Gemma3ForConditionalGeneration``): the text decoder is Gemma 3's
(``text_config`` through the gemma3 family's translation), the vision tower is SigLIP (``vision_config``)
and the projector average-pools its patch grid to ``mm_tokens_per_image`` tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from max.pipelines.architectures.common import DecoderConfig
from max.pipelines.architectures.common.siglip import SiglipConfig, siglip_fields
from max.pipelines.architectures.common.vision_config import hf_part
from max.pipelines.architectures.gemma3.config import config_from_hf as gemma3_text_config

ARCHITECTURE = "Gemma3ForConditionalGeneration"


@dataclass(frozen=True)
class VisionConfig(SiglipConfig):
    """The SigLIP vision tower and Gemma 3's multimodal projector."""

    mm_tokens_per_image: int = 256
    text_hidden_size: int = 0
    image_token_id: int = 262144

    @property
    def tokens_per_side(self) -> int:
        return int(round(self.mm_tokens_per_image ** 0.5))


def _text(hf: dict) -> dict:
    return hf_part(hf, "text_config", ARCHITECTURE)


def config_from_hf(hf: dict) -> DecoderConfig:
    """The text decoder's config (Gemma 3's), named after the multimodal architecture."""
    cfg = gemma3_text_config(_text(hf))
    cfg.architecture = ARCHITECTURE
    return cfg


def vision_config_from_hf(hf: dict) -> VisionConfig:
    v = hf_part(hf, "vision_config", ARCHITECTURE)
    if v.get("vision_use_head"):
        raise NotImplementedError(f"{ARCHITECTURE}: a SigLIP pooling head (vision_use_head) is not supported")
    c = VisionConfig(**siglip_fields(v), mm_tokens_per_image=int(hf.get("mm_tokens_per_image", 256)),
                     text_hidden_size=int(_text(hf)["hidden_size"]),
                     image_token_id=int(hf.get("image_token_index", hf.get("image_token_id", 262144))))
    if c.tokens_per_side ** 2 != c.mm_tokens_per_image or c.patches_per_side % c.tokens_per_side:
        raise ValueError(f"{ARCHITECTURE}: mm_tokens_per_image {c.mm_tokens_per_image} must be a square whose side "
                         f"divides the patch grid side {c.patches_per_side}")
    return c


def image_token_id(hf: Any) -> int:
    """The image placeholder token id of a config object or dict."""
    d = hf.to_dict() if hasattr(hf, "to_dict") else dict(hf)
    return int(d.get("image_token_index", d.get("image_token_id", 262144)))
