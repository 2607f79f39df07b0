"""Llama 4 vision-language checkpoints: the text decoder's tensors go through the llama4 family's adapter
(which leaves the vision ones out); the vision adapter keeps ``vision_model.*`` (module names below it:
``patch_embedding.linear``, ``class_embedding``, ``positional_embedding_vlm``, ``layernorm_pre/post``,
``model.layers.N.*``, ``vision_adapter.mlp.*``) and ``multi_modal_projector.*``, with or without a
leading ``model.``."""

from __future__ import annotations

from typing import Any, Mapping

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.llama4.weight_adapters import convert_safetensor_state_dict

__all__ = ["WEIGHT_ADAPTERS", "vision_weights"]


def _split(state_dict: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    text: dict[str, Any] = {}
    vision: dict[str, Any] = {}
    for name, w in state_dict.items():
        n = name[len("model."):] if name.startswith("model.") else name
        if n.startswith("vision_model."):
            vision[n[len("vision_model."):]] = w
        elif n.startswith("multi_modal_projector."):
            vision[n] = w
        else:
            text[name] = w
    return text, vision


def text_weights(state_dict: Mapping[str, Any], **kw: Any) -> dict[str, Any]:
    return convert_safetensor_state_dict(_split(state_dict)[0], **kw)


def vision_weights(state_dict: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    return _split(state_dict)[1]


WEIGHT_ADAPTERS = {WeightsFormat.safetensors: text_weights, WeightsFormat.pytorch: text_weights}
