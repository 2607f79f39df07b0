"""Granite 4 hybrid configuration from a Hugging Face ``config.json`` (``transformers.GraniteMoeHybridConfig``)
or the metadata of a ``granitehybrid`` GGUF file."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common.config import (
    DecoderConfig,
    gguf_hf_config,
    gguf_layer_kv_heads,
    gguf_ssm_keys,
    hf_common,
    kv_heads,
    rope_defaults,
    with_defaults,
)
from max.pipelines.architectures.common.hybrid import mixer_from_mamba_keys
from max.pipelines.architectures.common.moe import MoESpec

_TYPES = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention", "full_attention": "attention"}


def config_from_hf(hf: dict) -> DecoderConfig:
    n = int(hf["num_hidden_layers"])
    raw = hf.get("layer_types") or hf.get("layers_block_type") or ["mamba"] * n
    bad = sorted({t for t in raw if t not in _TYPES})
    if bad:
        raise NotImplementedError(f"GraniteMoeHybridForCausalLM: layer types {bad} are not supported")
    hidden = int(hf["hidden_size"])
    inner = int(hf.get("mamba_expand", 2)) * hidden
    mamba = mixer_from_mamba_keys(hf, inner, "GraniteMoeHybridForCausalLM")
    rope = hf.get("position_embedding_type") == "rope"
    c = hf_common({**hf, "layer_types": None,
                   "rope_parameters": hf.get("rope_parameters") or {"rope_type": "default", "rope_theta": 10000.0}},
                  "GraniteMoeHybridForCausalLM")
    e = int(hf.get("num_local_experts") or 0)
    moe = None
    if e > 0:
        moe = MoESpec(num_experts=e, top_k=int(hf["num_experts_per_tok"]), moe_dim=int(hf["intermediate_size"]),
                      routing="softmax_topk", renormalize=True, activation="silu")
    c.update(attention_scale=float(hf.get("attention_multiplier", 1.0)),
             embedding_multiplier=float(hf.get("embedding_multiplier", 1.0)),
             residual_multiplier=float(hf.get("residual_multiplier", 1.0)),
             logits_scaling=float(hf.get("logits_scaling", 1.0)), moe=moe,
             extra={"layer_types": [_TYPES[t] for t in raw], "mamba": mamba, "rope": rope,
                    "shared_dim": int(hf.get("shared_intermediate_size", 1024))})
    return DecoderConfig(**c)


HF_DEFAULTS: dict[str, Any] = dict(
    vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=kv_heads, hidden_act="silu", max_position_embeddings=2048, rms_norm_eps=1e-6,
    pad_token_id=None, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, attention_bias=False,
    embedding_multiplier=1.0, logits_scaling=1.0, residual_multiplier=1.0, attention_multiplier=1.0,
    num_local_experts=8, num_experts_per_tok=2, shared_intermediate_size=1024, position_embedding_type=None,
    layer_types=lambda d: ["linear_attention"] * d["num_hidden_layers"], mamba_n_heads=128, mamba_n_groups=1,
    mamba_d_state=256, mamba_d_head=64, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=256, mamba_conv_bias=True,
    mamba_proj_bias=False, time_step_limit=(0.0, float("inf")))
"""``transformers.GraniteMoeHybridConfig``'s defaults (what a GGUF file lacks); RoPE base 10000."""


def config_from_gguf(meta: Any, *, defaults: bool = True) -> dict:
    """The ``GraniteMoeHybridConfig`` dict of a ``granitehybrid`` GGUF file (``defaults=False``: only the keys
    it has).

    llama.cpp's converter writes ``attention.head_count_kv`` per layer (0 for the Mamba-2 layers), the
    mixer sizes as ``ssm.*``, the multipliers as Granite's ``*_scale`` keys, the shared MLP's width as
    ``expert_shared_feed_forward_length``, and marks RoPE with ``rope.scaling.finetuned`` (absent or
    false: no position embedding, Granite 4's ``nope``)."""
    g = meta.arch_get
    d = gguf_hf_config(meta, "granitemoehybrid", "GraniteMoeHybridForCausalLM")
    d.pop("head_dim", None)
    d.pop("sliding_window", None)
    for key, name in (("embedding_scale", "embedding_multiplier"), ("residual_scale", "residual_multiplier"),
                      ("attention.scale", "attention_multiplier"), ("logit_scale", "logits_scaling")):
        if g(key) is not None:
            d[name] = float(g(key))
    names = {t.name for t in meta.tensors}
    attn = sorted(int(n.split(".")[1]) for n in names if n.startswith("blk.") and n.endswith(".attn_q.weight"))
    if attn:
        d["attention_bias"] = f"blk.{attn[0]}.attn_q.bias" in names
    if g("expert_count") is not None:
        d["num_local_experts"] = int(g("expert_count"))
        if g("expert_used_count") is not None:
            d["num_experts_per_tok"] = int(g("expert_used_count"))
    elif any(n.startswith("blk.") and n.endswith(".ffn_down.weight") for n in names):
        d["num_local_experts"] = 0  # dense: the shared MLP alone, written as ffn_gate/ffn_up/ffn_down
    if g("expert_shared_feed_forward_length") is not None:
        d["shared_intermediate_size"] = int(g("expert_shared_feed_forward_length"))
    elif d.get("num_local_experts") == 0 and "intermediate_size" in d:
        d["shared_intermediate_size"] = d["intermediate_size"]
    per_layer = gguf_layer_kv_heads(meta)
    if per_layer is not None:
        d["layer_types"] = ["full_attention" if n > 0 else "linear_attention" for n in per_layer]
    if g("rope.scaling.finetuned") is not None:
        d["position_embedding_type"] = "rope" if bool(g("rope.scaling.finetuned")) else "nope"
    ssm = gguf_ssm_keys(meta)
    for key, name in (("heads", "mamba_n_heads"), ("head_dim", "mamba_d_head"), ("groups", "mamba_n_groups"),
                      ("state", "mamba_d_state"), ("kernel", "mamba_d_conv"), ("conv_bias", "mamba_conv_bias"),
                      ("proj_bias", "mamba_proj_bias")):
        if key in ssm:
            d[name] = ssm[key]
    if "inner" in ssm and "hidden_size" in d:
        if ssm["inner"] % int(d["hidden_size"]):
            raise NotImplementedError(f"GraniteMoeHybridForCausalLM: ssm.inner_size {ssm['inner']} is not a "
                                      f"multiple of the hidden size {d['hidden_size']}")
        d["mamba_expand"] = ssm["inner"] // int(d["hidden_size"])
    return rope_defaults(with_defaults(d, HF_DEFAULTS)) if defaults else d
