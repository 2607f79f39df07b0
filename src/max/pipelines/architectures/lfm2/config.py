"""LFM2 configuration from a Hugging Face ``config.json`` (``transformers.Lfm2Config``)."""

from __future__ import annotations

from max.pipelines.architectures.common.config import DecoderConfig, hf_common


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
