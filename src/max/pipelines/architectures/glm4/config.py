"""GLM-4 configuration from a Hugging Face ``config.json`` or GGUF metadata (llama.cpp ``glm4``)."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common import (
    DecoderConfig,
    NormPlan,
    gguf_hf_config,
    hf_common,
    rope_defaults,
    with_defaults,
)

NORMS = NormPlan(pre_attention="input_layernorm", post_attention="post_self_attn_layernorm",
                 pre_mlp="post_attention_layernorm", post_mlp="post_mlp_layernorm")

HF_DEFAULTS: dict[str, Any] = dict(
    vocab_size=151552, hidden_size=4096, intermediate_size=13696, num_hidden_layers=40, num_attention_heads=32,
    num_key_value_heads=2, head_dim=128, hidden_act="silu", max_position_embeddings=131072, rms_norm_eps=1.5625e-07,
    tie_word_embeddings=False, pad_token_id=151329, eos_token_id=[151329, 151336, 151338], bos_token_id=None,
    attention_bias=True)
"""``transformers.Glm4Config``'s defaults (what a GGUF file lacks); RoPE base 10000 on half of each head."""


def config_from_hf(hf: dict) -> DecoderConfig:
    c = hf_common(hf, "Glm4ForCausalLM")
    c.update(norms=NORMS, fused_gate_up=True, interleaved_rope=True, o_proj_bias=False, mlp_bias=False)
    return DecoderConfig(**c)


def config_from_gguf(meta: Any, *, defaults: bool = True) -> dict:
    """``glm4`` GGUF metadata -> ``Glm4Config`` dict: llama.cpp's converter stores the rotated dims
    (``rope.dimension_count`` = ``head_dim * partial_rotary_factor``) and the q/k/v biases as tensors
    (``defaults=False``: only the keys the file has)."""
    g = meta.arch_get
    d = gguf_hf_config(meta, "glm4", "Glm4ForCausalLM", rope_dim_is_head_dim=False)
    d["attention_bias"] = any(t.name == "blk.0.attn_q.bias" for t in meta.tensors)
    rot = g("rope.dimension_count")
    if rot and d.get("head_dim"):
        d["rope_parameters"] = {"rope_type": "default", **(d.get("rope_parameters") or {}),
                                "partial_rotary_factor": float(rot) / int(d["head_dim"])}
    if not defaults:
        return d
    d = with_defaults(d, HF_DEFAULTS)
    rp = dict(d.get("rope_parameters") or {"rope_type": "default"})
    if "partial_rotary_factor" not in rp:
        rp["partial_rotary_factor"] = float(rot) / d["head_dim"] if rot else 0.5
    d["rope_parameters"] = rp
    return rope_defaults(d)
