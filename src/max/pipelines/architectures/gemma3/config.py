"""Gemma 3 configuration from a Hugging Face ``config.json`` (``gemma3_text``) or GGUF metadata.

Gemma 3 (as transformers runs it; ``attn_logit_softcapping`` is ignored there too): scaled embeddings (``sqrt(hidden)``), RMSNorm by ``1 + weight`` computed in float32, norms
before and after both attention and MLP, per-head q/k norms, GeGLU (tanh GELU), softmax scale
``query_pre_attn_scalar ** -0.5``, sliding-window layers (5 of every 6) with their own unscaled RoPE
base and global layers with the scaled one, optional final-logit soft-capping.
"""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common import DecoderConfig, NormPlan, gguf_hf_config, hf_common, with_defaults

NORMS = NormPlan(pre_attention="input_layernorm", post_attention="post_attention_layernorm",
                 pre_mlp="pre_feedforward_layernorm", post_mlp="post_feedforward_layernorm")

HF_DEFAULTS: dict[str, Any] = dict(
    vocab_size=262_208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
    num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131_072,
    rms_norm_eps=1e-6, pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=True,
    attention_bias=False, query_pre_attn_scalar=256, sliding_window=4096,
    layer_types=lambda d: ["sliding_attention" if (i + 1) % 6 else "full_attention"
                           for i in range(d["num_hidden_layers"])],
    final_logit_softcapping=None, attn_logit_softcapping=None, use_bidirectional_attention=False)
"""``transformers.Gemma3TextConfig``'s defaults (what a GGUF file lacks): every 6th layer global; RoPE
bases 1e6 (global layers) and 10000 (sliding-window layers)."""

ROPE_THETA = {"full_attention": 1e6, "sliding_attention": 1e4}


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


def config_from_gguf(meta: Any, *, defaults: bool = True) -> dict:
    """``gemma3`` GGUF metadata -> ``Gemma3TextConfig`` dict (``defaults=False``: only the keys the file
    has).  The layer pattern (every 6th layer global) and the local RoPE base (10000) are not stored in
    the file: the config class's defaults apply, as in llama.cpp.  The file's RoPE base and scaling are
    the global layers', ``rope.freq_base_swa`` the sliding-window layers' (``rope_parameters`` per
    attention type).  llama.cpp scales queries by ``1/sqrt(head_dim)`` except for the 27B model (62
    layers), where it uses ``hidden / heads``."""
    g = meta.arch_get
    d = gguf_hf_config(meta, "gemma3_text", "Gemma3ForCausalLM")
    if g("block_count") == 62:
        d["query_pre_attn_scalar"] = int(g("embedding_length")) // int(g("attention.head_count"))
    elif g("attention.key_length"):
        d["query_pre_attn_scalar"] = int(g("attention.key_length"))
    full = d.pop("rope_parameters", None)
    local = {"rope_type": "default"}
    if g("rope.freq_base_swa"):
        local["rope_theta"] = float(g("rope.freq_base_swa"))
    if full is not None or "rope_theta" in local:
        d["rope_parameters"] = {"full_attention": full or {"rope_type": "default"}, "sliding_attention": local}
    if not defaults:
        return d
    d = with_defaults(d, HF_DEFAULTS)
    rp = d.get("rope_parameters") or {}
    d["rope_parameters"] = {kind: {"rope_type": "default", **(rp.get(kind) or {})} for kind in ROPE_THETA}
    for kind, theta in ROPE_THETA.items():
        d["rope_parameters"][kind].setdefault("rope_theta", theta)
    return d
