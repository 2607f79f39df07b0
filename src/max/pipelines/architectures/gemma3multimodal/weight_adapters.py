"""Gemma 3 multimodal checkpoints, in each layout transformers has saved them:
``language_model.model.*`` / ``model.language_model.*`` (text decoder), ``vision_tower[.vision_model].*`` and
``multi_modal_projector.*`` (with or without a leading ``model.``), ``[language_model.]lm_head.*``: the
decoder's module names and the vision module's (``embeddings.*``, ``encoder.*``, ``post_layernorm``,
``multi_modal_projector.*``)."""

from __future__ import annotations

from max.pipelines.architectures.common.multimodal import split_adapters


def route(name: str) -> tuple[bool, str]:
    if name.startswith("multi_modal_projector."):
        return True, name
    for p in ("vision_tower.vision_model.", "vision_tower."):
        if name.startswith(p):
            return True, name[len(p):]
    for p in ("language_model.model.", "language_model."):
        if name.startswith(p):
            return False, name[len(p):]
    return False, name


WEIGHT_ADAPTERS, vision_weights = split_adapters(route)
