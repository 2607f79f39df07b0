"""Mamba-2 configuration from a Hugging Face ``config.json`` (``transformers.Mamba2Config``) or the metadata of
a llama.cpp ``mamba2`` GGUF file."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from max.pipelines.architectures.common.config import DecoderConfig, eos_ids

HF_DEFAULTS = dict(num_heads=128, head_dim=64, vocab_size=32768, hidden_size=4096, state_size=128,
                   num_hidden_layers=64, layer_norm_epsilon=1e-5, expand=2, conv_kernel=4, n_groups=8, use_bias=False,
                   use_conv_bias=True, hidden_act="silu", time_step_limit=(0.0, float("inf")), chunk_size=256,
                   tie_word_embeddings=False, bos_token_id=0, eos_token_id=2)
"""``transformers.Mamba2Config``'s defaults."""

MAX_POSITIONS = 1 << 20
"""A recurrent model has no position limit; this bounds ``max_length`` when none is given."""


def mixer_sizes(hf: dict, hidden: int, eps: float) -> SimpleNamespace:
    """What :class:`~max.pipelines.architectures.common.hybrid.Mamba2Mixer` reads, from Mamba-2 keys."""
    act = hf.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise NotImplementedError(f"Mamba-2 mixer: conv activation {act!r} is not supported (silu only)")
    inner = int(hf["expand"] * hidden) if "mamba_expand" not in hf else int(hf["mamba_expand"] * hidden)
    lim = tuple(float(v) for v in (hf.get("time_step_limit") or (0.0, float("inf"))))
    return SimpleNamespace(heads=int(hf["num_heads"]), head_dim=int(hf["head_dim"]), groups=int(hf["n_groups"]),
                           state=int(hf["state_size"]), kernel=int(hf["conv_kernel"]), inner=inner, eps=float(eps),
                           chunk=min(int(hf.get("chunk_size") or 64), 64), bias=bool(hf.get("use_bias", False)),
                           conv_bias=bool(hf.get("use_conv_bias", True)), dt_limit=lim)


def config_from_hf(hf: dict) -> DecoderConfig:
    c = {**HF_DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}
    hidden = int(c["hidden_size"])
    m = mixer_sizes(c, hidden, c["layer_norm_epsilon"])
    if m.heads * m.head_dim != m.inner:
        raise ValueError(f"Mamba2ForCausalLM: num_heads * head_dim = {m.heads * m.head_dim} != expand * hidden_size "
                         f"= {m.inner}")
    return DecoderConfig(
        architecture="Mamba2ForCausalLM", vocab_size=int(c["vocab_size"]), hidden_size=hidden,
        intermediate_size=m.inner, num_hidden_layers=int(c["num_hidden_layers"]), num_attention_heads=m.heads,
        num_key_value_heads=m.heads, head_dim=m.head_dim, rms_norm_eps=float(c["layer_norm_epsilon"]), rope_theta=0.0,
        max_position_embeddings=int(c.get("max_position_embeddings") or MAX_POSITIONS),
        tie_word_embeddings=bool(c["tie_word_embeddings"]), bos_token_id=c.get("bos_token_id"),
        eos_token_ids=eos_ids(c.get("eos_token_id")), extra={"mamba": m})


def config_from_gguf(meta: Any, *, defaults: bool = True) -> dict:
    """The ``Mamba2Config`` dict of a ``mamba2`` GGUF file (``defaults=False``: only the keys it has).

    llama.cpp's converter writes the SSM sizes under ``ssm.*``: ``inner_size`` (expand * hidden),
    ``state_size``, ``time_step_rank`` (the number of heads), ``group_count``, ``conv_kernel``; the head
    width is inner / heads.  Its ``context_length`` is a placeholder (2**20) and ``head_count`` is 0."""
    g = meta.arch_get
    names = {t.name for t in meta.tensors}
    tokens = meta.get("tokenizer.ggml.tokens")
    d: dict[str, Any] = dict(model_type="mamba2", architectures=["Mamba2ForCausalLM"],
                             vocab_size=g("vocab_size") or (len(tokens) if tokens is not None else None),
                             hidden_size=g("embedding_length"), num_hidden_layers=g("block_count"),
                             layer_norm_epsilon=g("attention.layer_norm_rms_epsilon"), state_size=g("ssm.state_size"),
                             num_heads=g("ssm.time_step_rank"), n_groups=g("ssm.group_count"),
                             conv_kernel=g("ssm.conv_kernel"), tie_word_embeddings="output.weight" not in names,
                             use_conv_bias="blk.0.ssm_conv1d.bias" in names, use_bias="blk.0.ssm_in.bias" in names,
                             bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
                             eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
                             pad_token_id=meta.get("tokenizer.ggml.padding_token_id"))
    inner, heads, hidden = g("ssm.inner_size"), d["num_heads"], d["hidden_size"]
    if inner is not None and heads:
        d["head_dim"] = int(inner) // int(heads)
    if inner is not None and hidden:
        d["expand"] = int(inner) // int(hidden)
    d = {k: v for k, v in d.items() if v is not None}
    return {**HF_DEFAULTS, **d} if defaults else d
