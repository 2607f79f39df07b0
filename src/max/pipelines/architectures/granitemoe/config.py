"""Granite MoE configuration from a Hugging Face ``config.json`` or GGUF metadata (llama.cpp
``granitemoe``): Granite's, plus the experts.

The router picks the top-k logits and softmaxes over them, which equals a softmax over all experts
renormalised over the chosen ones (``softmax_topk`` with ``renormalize``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from max.pipelines.architectures.common import DecoderConfig, gguf_hf_config, rope_defaults, with_defaults
from max.pipelines.architectures.common.moe import MoESpec
from max.pipelines.architectures.granite.config import HF_DEFAULTS as GRANITE_DEFAULTS
from max.pipelines.architectures.granite.config import config_from_hf as granite_config
from max.pipelines.architectures.granite.config import gguf_granite_keys

HF_DEFAULTS: dict[str, Any] = {**{k: v for k, v in GRANITE_DEFAULTS.items() if k != "mlp_bias"},
                               "num_local_experts": 8, "num_experts_per_tok": 2}
"""``transformers.GraniteMoeConfig``'s defaults (what a GGUF file lacks): Granite's (it has no ``mlp_bias``)
plus the experts'."""


def config_from_hf(hf: dict) -> DecoderConfig:
    c = granite_config(hf)
    moe = MoESpec(num_experts=int(hf["num_local_experts"]), top_k=int(hf["num_experts_per_tok"]),
                  moe_dim=c.intermediate_size, routing="softmax_topk", renormalize=True, router_name="router",
                  activation=c.hidden_act)
    return dataclasses.replace(c, architecture="GraniteMoeForCausalLM", moe=moe)


def config_from_gguf(meta: Any, *, defaults: bool = True) -> dict:
    """``granitemoe`` GGUF metadata -> ``GraniteMoeConfig`` dict: Granite's keys plus ``expert_count`` /
    ``expert_used_count`` (``defaults=False``: only the keys the file has)."""
    g = meta.arch_get
    d = gguf_granite_keys(meta, gguf_hf_config(meta, "granitemoe", "GraniteMoeForCausalLM"))
    if g("expert_count"):
        d["num_local_experts"] = int(g("expert_count"))
    if g("expert_used_count"):
        d["num_experts_per_tok"] = int(g("expert_used_count"))
    return rope_defaults(with_defaults(d, HF_DEFAULTS)) if defaults else d
