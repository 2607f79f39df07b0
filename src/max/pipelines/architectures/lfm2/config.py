"""LFM2 configuration from a Hugging Face ``config.json`` (``transformers.Lfm2Config``) or GGUF metadata."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common.config import (
    DecoderConfig,
    gguf_hf_config,
    gguf_layer_kv_heads,
    hf_common,
    rope_defaults,
    with_defaults,
)

HF_DEFAULTS: dict[str, Any] = dict(
    vocab_size=65536, hidden_size=2560, intermediate_size=12288, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, max_position_embeddings=128000, norm_eps=1e-5, pad_token_id=0, bos_token_id=1,
    eos_token_id=2, tie_word_embeddings=True, conv_bias=False, conv_L_cache=3, block_multiple_of=256,
    block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=True,
    full_attn_idxs=lambda d: list(range(d["num_hidden_layers"])),
    layer_types=lambda d: ["full_attention" if i in d["full_attn_idxs"] else "conv"
                           for i in range(d["num_hidden_layers"])])
"""``transformers.Lfm2Config``'s defaults (what a GGUF file lacks; every layer attention when the file
gives one KV head count for all); RoPE base 1e6."""

ROPE_THETA = 1e6


def ffn_size(hf: dict) -> int:
    """The feed-forward width ``Lfm2MLP`` derives (``block_auto_adjust_ff_dim``: 2/3, multiplier, rounding)."""
    inter = int(hf.get("block_ff_dim") or hf["intermediate_size"])
    if hf.get("block_auto_adjust_ff_dim", True):
        inter = int(2 * inter / 3)
        mult = hf.get("block_ffn_dim_multiplier", 1.0)
        if mult is not None:
            inter = int(mult * inter)
            m = int(hf.get("block_multiple_of", 256))
            inter = m * ((inter + m - 1) // m)
    return inter


def config_from_hf(hf: dict) -> DecoderConfig:
    n = int(hf["num_hidden_layers"])
    types = hf.get("layer_types")
    if not types:
        full = hf.get("full_attn_idxs")
        full = list(range(n)) if full is None else list(full)
        types = ["full_attention" if i in full else "conv" for i in range(n)]
    bad = sorted({t for t in types if t not in ("full_attention", "conv")})
    if bad:
        raise NotImplementedError(f"Lfm2ForCausalLM: layer types {bad} are not supported (full_attention, conv)")
    d = {**hf, "rms_norm_eps": hf.get("norm_eps", 1e-5), "intermediate_size": ffn_size(hf), "layer_types": None,
         "tie_word_embeddings": hf.get("tie_word_embeddings", hf.get("tie_embedding", True)),
         "max_position_embeddings": hf.get("max_position_embeddings") or 128000}
    c = hf_common(d, "Lfm2ForCausalLM")
    c.update(qk_norm="head", extra={"layer_types": list(types), "conv_kernel": int(hf.get("conv_L_cache", 3)),
                                    "conv_bias": bool(hf.get("conv_bias", False))})
    return DecoderConfig(**c)


def config_from_gguf(meta: Any, *, defaults: bool = True) -> dict:
    """The ``Lfm2Config`` dict of an ``lfm2`` GGUF file (``defaults=False``: only the keys it has).

    llama.cpp stores ``attention.head_count_kv`` per layer (0 for the convolution layers): the attention
    layers are those with KV heads; ``feed_forward_length`` is the feed-forward width itself."""
    g = meta.arch_get
    per_layer = gguf_layer_kv_heads(meta)
    d = gguf_hf_config(meta, "lfm2", "Lfm2ForCausalLM")
    if "rms_norm_eps" in d:
        d["norm_eps"] = d.pop("rms_norm_eps")
    d["block_auto_adjust_ff_dim"] = False
    d.pop("head_dim", None)
    if per_layer is not None:
        d["full_attn_idxs"] = [i for i, n in enumerate(per_layer) if n > 0]
        d["layer_types"] = ["full_attention" if n > 0 else "conv" for n in per_layer]
    if g("shortconv.l_cache") is not None:
        d["conv_L_cache"] = int(g("shortconv.l_cache"))
    return rope_defaults(with_defaults(d, HF_DEFAULTS), ROPE_THETA) if defaults else d
