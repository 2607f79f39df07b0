"""Mamba-2 configuration from a Hugging Face ``config.json`` (``transformers.Mamba2Config``) or the
metadata of a ``mamba2`` GGUF file."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from max.pipelines.architectures.common.config import (
    DecoderConfig,
    eos_ids,
    gguf_hf_config,
    gguf_ssm_keys,
    with_defaults,
)

HF_DEFAULTS = dict(num_heads=128, head_dim=64, vocab_size=32768, hidden_size=4096, state_size=128,
                   num_hidden_layers=64, layer_norm_epsilon=1e-5, expand=2, conv_kernel=4, n_groups=8, use_bias=False,
                   use_conv_bias=True, hidden_act="silu", time_step_limit=(0.0, float("inf")), chunk_size=256,
                   tie_word_embeddings=False, bos_token_id=0, eos_token_id=2, pad_token_id=1, residual_in_fp32=True,
                   time_step_rank=lambda d: -(-d["hidden_size"] // 16), time_step_min=0.001, time_step_max=0.1,
                   time_step_floor=1e-4, rescale_prenorm_residual=False)
"""``transformers.Mamba2Config``'s defaults (``time_step_rank``'s ``"auto"`` is ``ceil(hidden / 16)``)."""

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

    llama.cpp's converter writes ``head_count`` and ``feed_forward_length`` as 0 (unused); the inner size
    is ``ssm.inner_size`` (``expand = inner / hidden``) and the vocabulary the embedding's rows."""
    base = gguf_hf_config(meta, "mamba2", "Mamba2ForCausalLM")
    d = {k: base[k] for k in ("model_type", "architectures", "vocab_size", "hidden_size", "num_hidden_layers",
                              "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id") if k in base}
    emb = next((t for t in meta.tensors if t.name == "token_embd.weight"), None)
    if emb is not None:
        d["vocab_size"] = int(emb.shape[0])  # [vocab, hidden]
    if "rms_norm_eps" in base:
        d["layer_norm_epsilon"] = base["rms_norm_eps"]
    ssm = gguf_ssm_keys(meta)
    for key, name in (("heads", "num_heads"), ("head_dim", "head_dim"), ("groups", "n_groups"),
                      ("state", "state_size"), ("kernel", "conv_kernel"), ("conv_bias", "use_conv_bias"),
                      ("proj_bias", "use_bias")):
        if key in ssm:
            d[name] = ssm[key]
    inner = ssm.get("inner")
    if inner is not None and "hidden_size" in d:
        if int(inner) % int(d["hidden_size"]):
            raise NotImplementedError(f"Mamba2ForCausalLM: ssm.inner_size {inner} is not a multiple of the hidden "
                                      f"size {d['hidden_size']}")
        d["expand"] = int(inner) // int(d["hidden_size"])
    return with_defaults(d, HF_DEFAULTS) if defaults else d
