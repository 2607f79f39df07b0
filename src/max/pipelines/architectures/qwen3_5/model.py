"""The Qwen3.5 text pipeline model (the shared Qwen hybrid decoder of ``common.deltanet``, dense MLPs)."""

from __future__ import annotations

from max.pipelines.architectures.common.deltanet import QwenHybridModel
from max.pipelines.architectures.qwen3_5.config import config_from_hf
from max.pipelines.architectures.qwen3_5.weight_adapters import WEIGHT_ADAPTERS


class Qwen3_5Model(QwenHybridModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS
