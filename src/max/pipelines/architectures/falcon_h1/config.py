"""Falcon-H1 configuration from a Hugging Face ``config.json`` (``transformers.FalconH1Config``) or the
metadata of a ``falcon-h1`` GGUF file."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common.config import (
    DecoderConfig,
    gguf_hf_config,
    gguf_ssm_keys,
    hf_common,
    rope_defaults,
    with_defaults,
)
from max.pipelines.architectures.common.hybrid import mixer_from_mamba_keys


def config_from_hf(hf: dict) -> DecoderConfig:
    hidden = int(hf["hidden_size"])
    inner = int(hf["mamba_d_ssm"]) if hf.get("mamba_d_ssm") is not None else int(hf.get("mamba_expand", 2)) * hidden
    mamba = mixer_from_mamba_keys(hf, inner, "FalconH1ForCausalLM",
                                  rms_norm=bool(hf.get("mamba_rms_norm", False)),
                                  norm_before_gate=bool(hf.get("mamba_norm_before_gate", True)),
                                  out_bias=bool(hf.get("projectors_bias", False)))
    c = hf_common(hf, "FalconH1ForCausalLM")
    c.update(embedding_multiplier=float(hf.get("embedding_multiplier") or 1.0),
             logits_scaling=1.0 / float(hf.get("lm_head_multiplier") or 1.0), extra={"mamba": mamba})
    return DecoderConfig(**c)


HF_DEFAULTS: dict[str, Any] = dict(
    vocab_size=128000, tie_word_embeddings=False, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, hidden_act="silu", rms_norm_eps=1e-5, num_logits_to_keep=1,
    pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=8192, mamba_d_ssm=1024,
    mamba_n_heads=128, mamba_n_groups=1, mamba_d_state=256, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=256,
    mamba_d_head=lambda d: (d["mamba_d_ssm"] or d["mamba_expand"] * d["hidden_size"]) // d["mamba_n_heads"],
    mamba_conv_bias=True, mamba_proj_bias=False, mamba_norm_before_gate=True, mamba_rms_norm=False,
    time_step_limit=(0.0, float("inf")), projectors_bias=False, lm_head_multiplier=1.0, embedding_multiplier=1.0,
    mlp_multipliers=[1.0, 1.0], key_multiplier=1.0, attention_out_multiplier=1.0, attention_in_multiplier=1.0,
    ssm_multipliers=[1.0] * 5, ssm_in_multiplier=1.0, ssm_out_multiplier=1.0, attention_bias=False, mlp_bias=False)
"""``transformers.FalconH1Config``'s defaults (what a GGUF file lacks; the multipliers stay 1: llama.cpp's
converter folds them into the weights); RoPE base 10000."""


def config_from_gguf(meta: Any, *, defaults: bool = True) -> dict:
    """The ``FalconH1Config`` dict of a ``falcon-h1`` GGUF file (``defaults=False``: only the keys it has).

    The mixer sizes come from ``ssm.*``, the attention head size from ``attention.key_length``; the µP
    multipliers are already in the weights (so 1 here); ``mamba_rms_norm`` is whether the file has the
    mixer's ``ssm_norm``, and llama.cpp's Mamba-2 layer normalises after the gate
    (``mamba_norm_before_gate=False``); bias flags come from the tensors present."""
    d = gguf_hf_config(meta, "falcon_h1", "FalconH1ForCausalLM")
    d.pop("sliding_window", None)
    names = {t.name for t in meta.tensors}
    ssm = gguf_ssm_keys(meta)
    for key, name in (("heads", "mamba_n_heads"), ("head_dim", "mamba_d_head"), ("groups", "mamba_n_groups"),
                      ("state", "mamba_d_state"), ("kernel", "mamba_d_conv"), ("inner", "mamba_d_ssm"),
                      ("conv_bias", "mamba_conv_bias"), ("proj_bias", "mamba_proj_bias")):
        if key in ssm:
            d[name] = ssm[key]
    if any(n.startswith("blk.0.") for n in names):
        d["mamba_rms_norm"] = "blk.0.ssm_norm.weight" in names
        d["projectors_bias"] = "blk.0.ssm_out.bias" in names
        d["attention_bias"] = "blk.0.attn_q.bias" in names
        d["mlp_bias"] = "blk.0.ffn_up.bias" in names
    d["mamba_norm_before_gate"] = False
    return rope_defaults(with_defaults(d, HF_DEFAULTS)) if defaults else d
