"""Mistral 3 checkpoints in either layout: ``language_model.model.*`` / ``language_model.lm_head.*`` +
``vision_tower.*`` + ``multi_modal_projector.*`` (as saved by transformers), or ``model.language_model.*``,
``model.vision_tower.*``, ``model.multi_modal_projector.*`` and ``lm_head.*``: the decoder's module names and
the vision module's (``vision_tower.`` dropped, the projector kept)."""

from __future__ import annotations

from max.pipelines.architectures.common.multimodal import split_adapters


def route(name: str) -> tuple[bool, str]:
    if name.startswith("vision_tower."):
        return True, name[len("vision_tower."):]
    if name.startswith("multi_modal_projector."):
        return True, name
    for old, new in (("language_model.model.", ""), ("language_model.lm_head.", "lm_head."),
                     ("language_model.", "")):
        if name.startswith(old):
            return False, new + name[len(old):]
    return False, name


WEIGHT_ADAPTERS, vision_weights = split_adapters(route)
