"""DeepSeek-V2 configuration from a Hugging Face ``config.json`` or GGUF metadata (``deepseek2``).

Follows transformers' DeepSeek-V2: the router scores are a softmax, top-k ``greedy`` or
``group_limited_greedy`` (``n_group`` / ``topk_group``), weights multiplied by ``routed_scaling_factor``
and not renormalised; layers ``< first_k_dense_replace`` keep a dense MLP; the softmax scale is
``qk_head_dim ** -0.5`` times ``mscale(factor, mscale_all_dim) ** 2`` under YaRN.
"""

from __future__ import annotations

import math
from typing import Any

from max.pipelines.architectures.common import DecoderConfig, gguf_hf_config, hf_common, rope_defaults, with_defaults
from max.pipelines.architectures.common.config import LLAMA_HF_DEFAULTS, derive_defaults
from max.pipelines.architectures.common.moe import MoESpec

HF_DEFAULTS: dict[str, Any] = derive_defaults(
    LLAMA_HF_DEFAULTS, drop=("head_dim",), vocab_size=102400, first_k_dense_replace=0, kv_lora_rank=512,
    q_lora_rank=1536, n_group=None, n_routed_experts=64, n_shared_experts=2, qk_nope_head_dim=128, qk_rope_head_dim=64,
    routed_scaling_factor=1.0, topk_group=None, topk_method="greedy", norm_topk_prob=False, v_head_dim=128,
    num_experts_per_tok=None, moe_intermediate_size=1407)
"""``transformers.DeepseekV2Config``'s defaults (what a GGUF file lacks); RoPE base 10000.  ``head_dim`` is
always ``qk_rope_head_dim`` and ``qk_head_dim`` ``qk_nope_head_dim + qk_rope_head_dim``."""


def config_from_hf(hf: dict) -> DecoderConfig:
    c = hf_common(hf, "DeepseekV2ForCausalLM")
    nope, rope_dim = int(hf["qk_nope_head_dim"]), int(hf["qk_rope_head_dim"])
    scale = (nope + rope_dim) ** -0.5
    sc = c["rope_scaling"] or {}
    if sc.get("mscale_all_dim"):
        m = 0.1 * float(sc["mscale_all_dim"]) * math.log(float(sc["factor"])) + 1.0 if float(sc["factor"]) > 1 else 1.0
        scale *= m * m
    method = hf.get("topk_method") or "greedy"
    if method not in ("greedy", "group_limited_greedy"):
        raise NotImplementedError(f"DeepseekV2ForCausalLM: topk_method {method!r} is not supported "
                                  "(greedy, group_limited_greedy)")
    groups = (int(hf["n_group"]), int(hf["topk_group"])) if method == "group_limited_greedy" else (1, 1)
    n_shared = int(hf.get("n_shared_experts") or 0)
    c.update(
        attention_scale=scale, o_proj_bias=c["attention_bias"], interleaved_rope=True,
        moe=MoESpec(num_experts=int(hf.get("n_routed_experts") or hf["num_experts"]),
                    top_k=int(hf["num_experts_per_tok"]), moe_dim=int(hf["moe_intermediate_size"]),
                    routing="softmax_topk", renormalize=False, scaling=float(hf.get("routed_scaling_factor") or 1.0),
                    n_group=groups[0], topk_group=groups[1], activation=c["hidden_act"],
                    shared_dim=int(hf["moe_intermediate_size"]) * n_shared,
                    dense_layers=set(range(int(hf.get("first_k_dense_replace") or 0)))),
        extra=dict(q_lora_rank=hf.get("q_lora_rank"), kv_lora_rank=int(hf["kv_lora_rank"]), qk_nope_head_dim=nope,
                   qk_rope_head_dim=rope_dim, v_head_dim=int(hf["v_head_dim"])),
    )
    return DecoderConfig(**c)


def config_from_gguf(meta: Any, *, defaults: bool = True) -> dict:
    """``deepseek2`` GGUF metadata -> ``DeepseekV2Config`` dict (llama.cpp's key names; ``defaults=False``:
    only the keys the file has)."""
    g = meta.arch_get
    key_len, val_len, rope_dim = g("attention.key_length"), g("attention.value_length"), g("rope.dimension_count")
    d = gguf_hf_config(meta, "deepseek_v2", "DeepseekV2ForCausalLM", rope_dim_is_head_dim=False)
    d.pop("head_dim", None)
    d.update(kv_lora_rank=int(g("attention.kv_lora_rank")), qk_rope_head_dim=int(rope_dim),
             qk_nope_head_dim=int(key_len) - int(rope_dim), v_head_dim=int(val_len),
             q_lora_rank=int(g("attention.q_lora_rank")) if g("attention.q_lora_rank") else None,
             n_routed_experts=int(g("expert_count")), num_experts_per_tok=int(g("expert_used_count")),
             moe_intermediate_size=int(g("expert_feed_forward_length")),
             n_shared_experts=int(g("expert_shared_count") or 0),
             first_k_dense_replace=int(g("leading_dense_block_count") or 0),
             routed_scaling_factor=float(g("expert_weights_scale") or 1.0))
    if not defaults:
        return d
    d = rope_defaults(with_defaults(d, HF_DEFAULTS))
    d.update(head_dim=d["qk_rope_head_dim"], qk_head_dim=d["qk_nope_head_dim"] + d["qk_rope_head_dim"])
    return d
