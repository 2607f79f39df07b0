"""Gemma 3 configuration from a Hugging Face ``config.json`` (``gemma3_text``) or GGUF metadata.

Gemma 3 (as transformers runs it; ``attn_logit_softcapping`` is ignored there too): scaled embeddings (``sqrt(hidden)``), RMSNorm by ``1 + weight`` computed in float32, norms
before and after both attention and MLP, per-head q/k norms, GeGLU (tanh GELU), softmax scale
``query_pre_attn_scalar ** -0.5``, sliding-window layers (5 of every 6) with their own unscaled RoPE
base and global layers with the scaled one, optional final-logit soft-capping.
"""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common import DecoderConfig, NormPlan, gguf_hf_config, hf_common

NORMS = NormPlan(pre_attention="input_layernorm", post_attention="post_attention_layernorm",
                 pre_mlp="pre_feedforward_layernorm", post_mlp="post_feedforward_layernorm")


def config_from_hf(hf: dict) -> DecoderConfig:
    name = "Gemma3ForCausalLM"
    if hf.get("use_bidirectional_attention"):
        raise NotImplementedError(f"{name}: bidirectional attention (EmbeddingGemma) is not supported")
    c = hf_common(hf, name)
    rp = hf.get("rope_parameters") or {}
    local = (rp.get("sliding_attention") or {}).get("rope_theta") if isinstance(rp, dict) else None
    c.update(
        o_proj_bias=c["attention_bias"],
        qk_norm="head",
        norms=NORMS,
        norm_weight_offset=1.0,
        norm_multiply_before_cast=True,
        local_rope_theta=float(local or hf.get("rope_local_base_freq") or 10000.0),
        attention_scale=float(hf["query_pre_attn_scalar"]) ** -0.5,
        embedding_multiplier=float(c["hidden_size"]) ** 0.5,
        final_logit_softcapping=hf.get("final_logit_softcapping"),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
    )
    return DecoderConfig(**c)


def config_from_gguf(meta: Any) -> dict:
    """``gemma3`` GGUF metadata -> ``Gemma3TextConfig`` dict.  The layer pattern (every 6th layer global)
    and the local RoPE base (10000) are not stored in the file: the config class's defaults apply, as in
    llama.cpp.  llama.cpp scales queries by ``1/sqrt(head_dim)`` except for the 27B model (62 layers),
    where it uses ``hidden / heads``."""
    g = meta.arch_get
    d = gguf_hf_config(meta, "gemma3_text", "Gemma3ForCausalLM")
    if g("block_count") == 62:
        d["query_pre_attn_scalar"] = int(g("embedding_length")) // int(g("attention.head_count"))
    elif g("attention.key_length"):
        d["query_pre_attn_scalar"] = int(g("attention.key_length"))
    if g("rope.freq_base_swa"):
        d["rope_local_base_freq"] = float(g("rope.freq_base_swa"))
    return d
