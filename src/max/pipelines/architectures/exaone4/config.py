"""EXAONE 4 configuration from a Hugging Face ``config.json`` or GGUF metadata (llama.cpp ``exaone4``)."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common import (
    DecoderConfig,
    gguf_hf_config,
    hf_common,
    rope_defaults,
    with_defaults,
)
from max.pipelines.architectures.olmo2.config import NORMS


def _default_layer_types(d: dict[str, Any]) -> list[str]:
    """The config class's pattern: every ``sliding_window_pattern``-th layer global, the others sliding."""
    every = d["sliding_window_pattern"]
    return ["sliding_attention" if every and (i + 1) % every != 0 else "full_attention"
            for i in range(d["num_hidden_layers"])]


HF_DEFAULTS: dict[str, Any] = dict(
    vocab_size=102400, hidden_size=4096, intermediate_size=16384, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=32, hidden_act="silu", max_position_embeddings=2048, rms_norm_eps=1e-5,
    bos_token_id=0, eos_token_id=2, pad_token_id=None, tie_word_embeddings=False, sliding_window=4096,
    sliding_window_pattern=lambda d: 4 if d["sliding_window"] is not None else 0, layer_types=_default_layer_types)
"""``transformers.Exaone4Config``'s defaults (what a GGUF file lacks; its KV head count is 32 whatever the
query heads); RoPE base 10000."""


def config_from_hf(hf: dict) -> DecoderConfig:
    c = hf_common(hf, "Exaone4ForCausalLM")
    types = c["layer_types"] or ["full_attention"] * c["num_hidden_layers"]
    nope = {i for i, t in enumerate(types) if t != "sliding_attention"} if c["sliding_window"] else set()
    c.update(qk_norm="head", norms=NORMS, no_rope_layers=nope, layer_types=types, o_proj_bias=False,
             attention_bias=False)
    return DecoderConfig(**c)


def config_from_gguf(meta: Any, *, defaults: bool = True) -> dict:
    """``exaone4`` GGUF metadata -> ``Exaone4Config`` dict (``defaults=False``: only what the file says).

    llama.cpp's converter writes ``attention.sliding_window`` (and the per-layer
    ``attention.sliding_window_pattern``, true = sliding) only for hybrid models: a file without them had
    no sliding window (every layer global, with RoPE).  Llama 3-style RoPE scaling is a ``rope_freqs``
    tensor (read by ``gguf_hf_config``)."""
    d = gguf_hf_config(meta, "exaone4", "Exaone4ForCausalLM")
    n = int(meta.arch_get("block_count"))
    pattern = meta.arch_get("attention.sliding_window_pattern")
    if d.get("sliding_window") is None:
        d.update(sliding_window=None, layer_types=["full_attention"] * n)
    elif pattern is not None:
        if len(pattern) != n:
            raise ValueError(f"Exaone4ForCausalLM: attention.sliding_window_pattern has {len(pattern)} entries "
                             f"for {n} layers")
        d["layer_types"] = ["sliding_attention" if p else "full_attention" for p in pattern]
    return rope_defaults(with_defaults(d, HF_DEFAULTS)) if defaults else d
