"""Gemma 4 multimodal checkpoints -> the gemma4 text decoder's module names: ``model.language_model.*``
(and ``lm_head.*`` when untied) go through the text family's adapter; the vision and audio towers and
their embedders (``model.vision_tower.*``, ``model.embed_vision.*``, ``model.audio_tower.*``,
``model.embed_audio.*``) are left out on purpose (this build runs the text only).  Any other name is
kept, so the text module's path check reports it."""

from __future__ import annotations

from typing import Any

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.gemma4.model import rename_gemma4
from max.pipelines.architectures.gemma4multimodal.config import text_config

TEXT_PREFIX = "model.language_model."
IGNORED_PREFIXES = ("model.vision_tower.", "model.embed_vision.", "model.audio_tower.", "model.embed_audio.")


def rename(state_dict: dict, huggingface_config: Any = None, **kw: Any) -> dict:
    hf = huggingface_config.to_dict() if hasattr(huggingface_config, "to_dict") else dict(huggingface_config or {})
    text: dict[str, Any] = {}
    for name, w in state_dict.items():
        if name.startswith(IGNORED_PREFIXES):
            continue
        text["model." + name[len(TEXT_PREFIX):] if name.startswith(TEXT_PREFIX) else name] = w
    return rename_gemma4(text, huggingface_config=text_config(hf) if hf else None, **kw)


WEIGHT_ADAPTERS = {WeightsFormat.safetensors: rename, WeightsFormat.pytorch: rename}
