"""Qwen2.5-VL checkpoints in either layout: ``model.layers.*`` + ``visual.*`` (original) or
``model.language_model.*`` + ``model.visual.*`` (newer transformers), ``lm_head.*``: the decoder's module
names and the vision module's (``visual.`` dropped, ``merger.mlp.0/2`` -> ``merger.fc1/2``)."""

from __future__ import annotations

from max.pipelines.architectures.common.multimodal import split_adapters

_MERGER = {"merger.mlp.0.": "merger.fc1.", "merger.mlp.2.": "merger.fc2."}


def route(name: str) -> tuple[bool, str]:
    if name.startswith("visual."):
        n = name[len("visual."):]
        for a, b in _MERGER.items():
            if n.startswith(a):
                n = b + n[len(a):]
        return True, n
    return False, name[len("language_model."):] if name.startswith("language_model.") else name


WEIGHT_ADAPTERS, vision_weights = split_adapters(route)
