"""Phi-3 configuration from a Hugging Face ``config.json`` or GGUF metadata."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common import DecoderConfig, gguf_hf_config, hf_common


def config_from_hf(hf: dict) -> DecoderConfig:
    c = hf_common(hf, "Phi3ForCausalLM")
    c.update(fused_qkv=True, fused_gate_up=True, attention_bias=False, mlp_bias=False)
    return DecoderConfig(**c)


def config_from_gguf(meta: Any) -> dict:
    """``phi3`` GGUF metadata -> ``Phi3Config`` dict (``rope.dimension_count`` < head size: partial rotary).

    Long-context files store their LongRoPE factors as tensors (``rope_factors_long/short``): not
    supported yet (clear error)."""
    if any(t.name.startswith("rope_factors") for t in meta.tensors):
        raise NotImplementedError("Phi3ForCausalLM: GGUF files with LongRoPE factor tensors (rope_factors_long/"
                                  "short, the 128k-context models) are not supported yet; use the safetensors "
                                  "checkpoint")
    g = meta.arch_get
    d = gguf_hf_config(meta, "phi3", "Phi3ForCausalLM", rope_dim_is_head_dim=False)
    head = int(g("embedding_length")) // int(g("attention.head_count"))
    rot = g("rope.dimension_count")
    if rot and int(rot) != head:
        d.setdefault("rope_parameters", {"rope_type": "default"})["partial_rotary_factor"] = int(rot) / head
    return d
