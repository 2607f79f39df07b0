"""Mixtral configuration from a Hugging Face ``config.json`` or GGUF metadata (llama.cpp writes Mixtral
as ``general.architecture = llama`` with ``llama.expert_count``)."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common import DecoderConfig, gguf_hf_config, hf_common, rope_defaults, with_defaults
from max.pipelines.architectures.common.config import LLAMA_HF_DEFAULTS, derive_defaults
from max.pipelines.architectures.common.moe import MoESpec

HF_DEFAULTS: dict[str, Any] = derive_defaults(
    LLAMA_HF_DEFAULTS, drop=("attention_bias", "mlp_bias"), intermediate_size=14336, num_key_value_heads=8,
    head_dim=None, max_position_embeddings=4096 * 32, rms_norm_eps=1e-5, sliding_window=None, num_experts_per_tok=2,
    num_local_experts=8)
"""``transformers.MixtralConfig``'s defaults (what a GGUF file lacks; ``head_dim`` None: hidden / heads);
RoPE base 1e6."""

ROPE_THETA = 1e6


def config_from_hf(hf: dict) -> DecoderConfig:
    c = hf_common(hf, "MixtralForCausalLM")
    c["moe"] = MoESpec(num_experts=int(hf["num_local_experts"]), top_k=int(hf["num_experts_per_tok"]),
                       moe_dim=c["intermediate_size"], routing="softmax_topk", renormalize=True,
                       activation=c["hidden_act"])
    return DecoderConfig(**c)


def config_from_gguf(meta: Any, *, defaults: bool = True) -> dict | None:
    """The ``MixtralConfig`` dict of a ``llama`` GGUF file with experts, else None (``defaults=False``:
    only the keys the file has)."""
    g = meta.arch_get
    if not g("expert_count"):
        return None
    d = gguf_hf_config(meta, "mixtral", "MixtralForCausalLM")
    d.update(num_local_experts=int(g("expert_count")), num_experts_per_tok=int(g("expert_used_count")))
    if g("expert_feed_forward_length"):
        d["intermediate_size"] = int(g("expert_feed_forward_length"))
    return rope_defaults(with_defaults(d, HF_DEFAULTS), ROPE_THETA) if defaults else d
