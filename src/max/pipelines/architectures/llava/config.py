"""Llava configuration (``LlavaForConditionalGeneration``) for a Pixtral vision tower: the text decoder
from ``text_config``; the image model is Mistral 3's (``mistral3.config.VisionConfig``) with no spatial
merge and no projector norm/merger, every patch of the chosen hidden state (``vision_feature_layer``,
``vision_feature_select_strategy`` "full") through linear, activation, linear."""

from __future__ import annotations

import dataclasses

from max.pipelines.architectures.common import DecoderConfig, hf_common
from max.pipelines.architectures.mistral3.config import VisionConfig
from max.pipelines.architectures.mistral3.config import vision_config_from_hf as mistral3_vision_config

ARCHITECTURE = "LlavaForConditionalGeneration"


def config_from_hf(hf: dict) -> DecoderConfig:
    vision_config_from_hf(hf)  # an unsupported vision tower is refused before anything is built
    return DecoderConfig(**hf_common(hf["text_config"], ARCHITECTURE))


def vision_config_from_hf(hf: dict) -> VisionConfig:
    v, text = hf.get("vision_config"), hf.get("text_config")
    if not isinstance(v, dict) or not isinstance(text, dict):
        raise ValueError(f"{ARCHITECTURE}: the config needs a vision_config and a text_config")
    if v.get("model_type") != "pixtral":
        raise NotImplementedError(f"{ARCHITECTURE}: only a Pixtral vision tower is supported natively (e.g. Pixtral "
                                  f"12B), not {v.get('model_type')!r}")
    strategy = hf.get("vision_feature_select_strategy", "default")
    if strategy != "full":
        raise NotImplementedError(f"{ARCHITECTURE}: a Pixtral tower needs vision_feature_select_strategy 'full' "
                                  f"(every patch), got {strategy!r}")
    c = mistral3_vision_config({**hf, "spatial_merge_size": 1,
                                "vision_feature_layer": hf.get("vision_feature_layer", -2),
                                "multimodal_projector_bias": hf.get("multimodal_projector_bias", True)})
    return dataclasses.replace(c, merger=False)
