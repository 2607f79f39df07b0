"""SmolLM3 configuration from a Hugging Face ``config.json`` or GGUF metadata (llama.cpp ``smollm3``)."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common import DecoderConfig, gguf_hf_config, hf_common, rope_defaults, with_defaults

HF_DEFAULTS: dict[str, Any] = dict(
    vocab_size=128256, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
    num_key_value_heads=4, hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6, pad_token_id=128004,
    bos_token_id=128000, eos_token_id=128001, use_sliding_window=False, sliding_window=None,
    no_rope_layer_interval=4,
    no_rope_layers=lambda d: [int((i + 1) % d["no_rope_layer_interval"] != 0) for i in range(d["num_hidden_layers"])],
    layer_types=lambda d: ["full_attention"] * d["num_hidden_layers"], attention_bias=False, mlp_bias=False,
    tie_word_embeddings=True)
"""``transformers.SmolLM3Config``'s defaults (what a GGUF file lacks: llama.cpp's converter stores no NoPE
pattern, and llama.cpp, like the config class, makes every 4th layer NoPE); RoPE base 2e6."""


def config_from_hf(hf: dict) -> DecoderConfig:
    c = hf_common(hf, "SmolLM3ForCausalLM")
    n = c["num_hidden_layers"]
    flags = hf.get("no_rope_layers")
    if flags is None:  # transformers' default: every ``no_rope_layer_interval``-th layer is NoPE
        every = int(hf.get("no_rope_layer_interval") or 4)
        flags = [int((i + 1) % every != 0) for i in range(n)]
    if len(flags) != n:
        raise ValueError(f"SmolLM3ForCausalLM: no_rope_layers has {len(flags)} entries for {n} layers")
    c.update(o_proj_bias=c["attention_bias"], no_rope_layers={i for i, f in enumerate(flags) if not f})
    if not hf.get("use_sliding_window"):
        c.update(sliding_window=None, layer_types=None)
    return DecoderConfig(**c)


def config_from_gguf(meta: Any, *, defaults: bool = True) -> dict:
    """``smollm3`` GGUF metadata -> ``SmolLM3Config`` dict (``defaults=False``: only the keys the file has)."""
    d = gguf_hf_config(meta, "smollm3", "SmolLM3ForCausalLM")
    return rope_defaults(with_defaults(d, HF_DEFAULTS), theta=2e6) if defaults else d
