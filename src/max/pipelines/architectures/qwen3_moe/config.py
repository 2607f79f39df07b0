"""Qwen3-MoE configuration from a Hugging Face ``config.json`` or GGUF metadata (``qwen3moe``)."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common import DecoderConfig, gguf_hf_config, hf_common, rope_defaults, with_defaults
from max.pipelines.architectures.common.moe import MoESpec
from max.pipelines.architectures.qwen2.config import qwen_sliding_window

HF_DEFAULTS: dict[str, Any] = dict(
    vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24, num_attention_heads=32,
    num_key_value_heads=4, hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6,
    tie_word_embeddings=False, attention_bias=False, use_sliding_window=False, sliding_window=4096,
    decoder_sparse_step=1, moe_intermediate_size=768, num_experts_per_tok=8, num_experts=128, norm_topk_prob=False,
    mlp_only_layers=[], pad_token_id=None, bos_token_id=None, eos_token_id=None)
"""``transformers.Qwen3MoeConfig``'s defaults (what a GGUF file lacks); RoPE base 10000."""


def config_from_hf(hf: dict) -> DecoderConfig:
    c = hf_common(hf, "Qwen3MoeForCausalLM")
    c.update(qk_norm="head", moe=moe_spec(hf, c, renormalize=bool(hf.get("norm_topk_prob", False))))
    return DecoderConfig(**c)


def moe_spec(hf: dict, common: dict, renormalize: bool) -> MoESpec:
    """Qwen3-MoE's experts (softmax top-k) from a text config; ``common``: its :func:`hf_common` fields."""
    n = int(hf.get("num_local_experts") or hf["num_experts"])
    step = int(hf.get("decoder_sparse_step") or 1)
    only = set(hf.get("mlp_only_layers") or [])
    dense = {i for i in range(common["num_hidden_layers"]) if i in only or not (n > 0 and (i + 1) % step == 0)}
    return MoESpec(num_experts=n, top_k=int(hf["num_experts_per_tok"]), moe_dim=int(hf["moe_intermediate_size"]),
                   routing="softmax_topk", renormalize=renormalize, activation=common["hidden_act"],
                   dense_layers=dense)


def config_from_gguf(meta: Any, *, defaults: bool = True) -> dict:
    """llama.cpp always renormalises Qwen3-MoE's top-k weights (as the released models' configs say:
    ``norm_topk_prob: true``); transformers' GGUF reader leaves the class default (False).
    ``defaults=False``: only the keys the file has."""
    g = meta.arch_get
    d = gguf_hf_config(meta, "qwen3_moe", "Qwen3MoeForCausalLM")
    d.update(num_experts=int(g("expert_count")), num_experts_per_tok=int(g("expert_used_count")),
             norm_topk_prob=True)
    if g("expert_feed_forward_length"):
        d["moe_intermediate_size"] = int(g("expert_feed_forward_length"))
    return rope_defaults(qwen_sliding_window(with_defaults(d, HF_DEFAULTS))) if defaults else d
