"""EXAONE 4 configuration from a Hugging Face ``config.json``."""

from __future__ import annotations

from max.pipelines.architectures.common import DecoderConfig, hf_common
from max.pipelines.architectures.olmo2.config import NORMS


def config_from_hf(hf: dict) -> DecoderConfig:
    c = hf_common(hf, "Exaone4ForCausalLM")
    types = c["layer_types"] or ["full_attention"] * c["num_hidden_layers"]
    nope = {i for i, t in enumerate(types) if t != "sliding_attention"} if c["sliding_window"] else set()
    c.update(qk_norm="head", norms=NORMS, no_rope_layers=nope, layer_types=types, o_proj_bias=False,
             attention_bias=False)
    return DecoderConfig(**c)
