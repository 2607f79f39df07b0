"""Qwen3-VL checkpoints (``model.language_model.*``, ``model.visual.*``, ``lm_head.*``): Qwen2.5-VL's routing
(``visual.`` -> the vision module, ``language_model.`` -> the decoder); the vision tower's own names
(``merger.linear_fc1``, ``deepstack_merger_list.K.*``, ``pos_embed``) are kept."""

from __future__ import annotations

from max.pipelines.architectures.qwen2_5vl.weight_adapters import WEIGHT_ADAPTERS, route, vision_weights

__all__ = ["WEIGHT_ADAPTERS", "route", "vision_weights"]
