"""OLMo 3 configuration from a Hugging Face ``config.json``."""

from __future__ import annotations

from max.pipelines.architectures.common import DecoderConfig, hf_common
from max.pipelines.architectures.olmo2.config import NORMS


def config_from_hf(hf: dict) -> DecoderConfig:
    c = hf_common(hf, "Olmo3ForCausalLM")
    rp = hf.get("rope_parameters") or {}
    local = (rp.get("sliding_attention") or {}).get("rope_theta") if isinstance(rp, dict) else None
    c.update(o_proj_bias=c["attention_bias"], qk_norm="full", norms=NORMS, norm_multiply_before_cast=True,
             local_rope_theta=float(local) if local is not None else c["rope_theta"])
    return DecoderConfig(**c)
