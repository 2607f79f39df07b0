"""Gemma 3 multimodal checkpoints, in each layout transformers has saved them:
``language_model.model.*`` / ``model.language_model.*`` (text decoder), ``vision_tower[.vision_model].*`` and
``multi_modal_projector.*`` (with or without a leading ``model.``), ``[language_model.]lm_head.*``.
:func:`split` sorts them into the text decoder's module names and the vision module's."""

from __future__ import annotations

from typing import Any, Mapping

from max.graph.weights import WeightsFormat

_TEXT_PREFIXES = ("language_model.model.", "language_model.")
_VISION_PREFIXES = ("vision_tower.vision_model.", "vision_tower.")


def split(state_dict: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(text, vision)``: module name -> tensor handle for the decoder and for the vision tower + projector."""
    text: dict[str, Any] = {}
    vision: dict[str, Any] = {}
    for name, w in state_dict.items():
        n = name[len("model."):] if name.startswith("model.") else name
        if n.endswith("rotary_emb.inv_freq"):
            continue
        if n.startswith("multi_modal_projector."):
            vision[n] = w
            continue
        for p in _VISION_PREFIXES:
            if n.startswith(p):
                vision[n[len(p):]] = w
                break
        else:
            for p in _TEXT_PREFIXES:
                if n.startswith(p):
                    n = n[len(p):]
                    break
            text[n] = w
    return text, vision


def text_weights(state_dict: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    return split(state_dict)[0]


def vision_weights(state_dict: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    return split(state_dict)[1]


WEIGHT_ADAPTERS = {WeightsFormat.safetensors: text_weights, WeightsFormat.pytorch: text_weights}
