"""SmolLM3 configuration from a Hugging Face ``config.json``."""

from __future__ import annotations

from max.pipelines.architectures.common import DecoderConfig, hf_common


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
