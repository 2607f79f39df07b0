"""Qwen3-Next configuration from a Hugging Face ``config.json`` (``transformers.Qwen3NextConfig``) or the
metadata of a ``qwen3next`` GGUF file."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common.config import DecoderConfig
from max.pipelines.architectures.common.deltanet import qwen_hybrid_config, qwen_hybrid_gguf_config
from max.pipelines.architectures.common.moe import MoESpec


def config_from_hf(hf: dict) -> DecoderConfig:
    n = int(hf["num_hidden_layers"])
    e = int(hf.get("num_experts") or 0)
    step = int(hf.get("decoder_sparse_step") or 1)
    only = set(hf.get("mlp_only_layers") or [])
    dense = {i for i in range(n) if i in only or not (e > 0 and (i + 1) % step == 0)}
    moe = None
    if len(dense) < n:
        moe = MoESpec(num_experts=e, top_k=int(hf["num_experts_per_tok"]), moe_dim=int(hf["moe_intermediate_size"]),
                      routing="softmax_topk", renormalize=bool(hf.get("norm_topk_prob", True)),
                      activation=str(hf.get("hidden_act") or "silu"), dense_layers=dense)
    cfg = qwen_hybrid_config(hf, "Qwen3NextForCausalLM", moe=moe)
    cfg.extra["shared_expert_dim"] = int(hf.get("shared_expert_intermediate_size") or 0)
    return cfg


HF_DEFAULTS: dict[str, Any] = dict(
    vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=48, num_attention_heads=16,
    num_key_value_heads=2, hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6,
    tie_word_embeddings=False, attention_bias=False, head_dim=256, linear_conv_kernel_dim=4, linear_key_head_dim=128,
    linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32, decoder_sparse_step=1,
    moe_intermediate_size=512, shared_expert_intermediate_size=512, num_experts_per_tok=10, num_experts=512,
    norm_topk_prob=True, mlp_only_layers=[], pad_token_id=None, bos_token_id=None, eos_token_id=None,
    layer_types=lambda d: ["linear_attention" if (i + 1) % 4 else "full_attention"
                           for i in range(d["num_hidden_layers"])])
"""``transformers.Qwen3NextConfig``'s defaults (what a GGUF file lacks); RoPE base 10000, a quarter of each
head rotated."""


def config_from_gguf(meta: Any, *, defaults: bool = True) -> dict:
    """The ``Qwen3NextConfig`` dict of a ``qwen3next`` GGUF file (``defaults=False``: only the keys it has);
    llama.cpp runs every layer's feed-forward as experts (no ``mlp_only_layers``)."""
    return qwen_hybrid_gguf_config(meta, "qwen3_next", "Qwen3NextForCausalLM", HF_DEFAULTS if defaults else None)
