"""Granite MoE configuration from a Hugging Face ``config.json``: Granite's, plus the experts.

The router picks the top-k logits and softmaxes over them, which equals a softmax over all experts
renormalised over the chosen ones (``softmax_topk`` with ``renormalize``)."""

from __future__ import annotations

import dataclasses

from max.pipelines.architectures.common import DecoderConfig
from max.pipelines.architectures.common.moe import MoESpec
from max.pipelines.architectures.granite.config import config_from_hf as granite_config


def config_from_hf(hf: dict) -> DecoderConfig:
    c = granite_config(hf)
    moe = MoESpec(num_experts=int(hf["num_local_experts"]), top_k=int(hf["num_experts_per_tok"]),
                  moe_dim=c.intermediate_size, routing="softmax_topk", renormalize=True, router_name="router",
                  activation=c.hidden_act)
    return dataclasses.replace(c, architecture="GraniteMoeForCausalLM", moe=moe)
