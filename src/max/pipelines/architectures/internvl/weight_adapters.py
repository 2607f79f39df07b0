"""InternVL checkpoints, in each layout transformers has saved them: ``language_model.model.*`` /
``model.language_model.*`` (text decoder), ``[model.]vision_tower.*`` and ``[model.]multi_modal_projector.*``,
``[language_model.]lm_head.*``: the decoder's module names and the vision module's (``embeddings.*``,
``encoder.layer.N.*``, ``layernorm``, ``multi_modal_projector.*``)."""

from __future__ import annotations

from max.pipelines.architectures.common.multimodal import split_adapters


def route(name: str) -> tuple[bool, str]:
    if name.startswith("multi_modal_projector."):
        return True, name
    if name.startswith("vision_tower."):
        return True, name[len("vision_tower."):]
    for p in ("language_model.model.", "language_model."):
        if name.startswith(p):
            return False, name[len(p):]
    return False, name


WEIGHT_ADAPTERS, vision_weights = split_adapters(route)
