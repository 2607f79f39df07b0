"""Idefics3 checkpoints (``model.text_model.*``, ``model.vision_model.*``, ``model.connector.*``,
``lm_head.*``): the decoder's module names and the vision module's (``embeddings.*``, ``encoder.*``,
``post_layernorm``, ``connector.*``)."""

from __future__ import annotations

from max.pipelines.architectures.common.multimodal import split_adapters


def route(name: str) -> tuple[bool, str]:
    if name.startswith("vision_model."):
        return True, name[len("vision_model."):]
    if name.startswith("connector."):
        return True, name
    return False, name[len("text_model."):] if name.startswith("text_model.") else name


WEIGHT_ADAPTERS, vision_weights = split_adapters(route)
