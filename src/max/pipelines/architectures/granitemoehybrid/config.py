"""Granite 4 hybrid configuration from a Hugging Face ``config.json`` (``transformers.GraniteMoeHybridConfig``)."""

from __future__ import annotations

from types import SimpleNamespace

from max.pipelines.architectures.common.config import DecoderConfig, hf_common
from max.pipelines.architectures.common.moe import MoESpec

_TYPES = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention", "full_attention": "attention"}


def config_from_hf(hf: dict) -> DecoderConfig:
    n = int(hf["num_hidden_layers"])
    raw = hf.get("layer_types") or hf.get("layers_block_type") or ["mamba"] * n
    bad = sorted({t for t in raw if t not in _TYPES})
    if bad:
        raise NotImplementedError(f"GraniteMoeHybridForCausalLM: layer types {bad} are not supported")
    hidden = int(hf["hidden_size"])
    inner = int(hf.get("mamba_expand", 2)) * hidden
    heads = int(hf.get("mamba_n_heads", 128))
    head_dim = hf.get("mamba_d_head", "auto")
    head_dim = inner // heads if head_dim in (None, "auto") else int(head_dim)
    if hf.get("hidden_act", "silu") not in ("silu", "swish"):
        raise NotImplementedError(f"GraniteMoeHybridForCausalLM: activation {hf.get('hidden_act')!r} is not supported")
    lim = tuple(float(v) for v in (hf.get("time_step_limit") or (0.0, float("inf"))))
    mamba = SimpleNamespace(heads=heads, head_dim=head_dim, groups=int(hf.get("mamba_n_groups", 1)),
                            state=int(hf.get("mamba_d_state", 256)), kernel=int(hf.get("mamba_d_conv", 4)),
                            inner=inner, eps=float(hf["rms_norm_eps"]),
                            chunk=min(int(hf.get("mamba_chunk_size") or 64), 64),
                            bias=bool(hf.get("mamba_proj_bias", False)),
                            conv_bias=bool(hf.get("mamba_conv_bias", True)), dt_limit=lim)
    rope = hf.get("position_embedding_type") == "rope"
    c = hf_common({**hf, "layer_types": None,
                   "rope_parameters": hf.get("rope_parameters") or {"rope_type": "default", "rope_theta": 10000.0}},
                  "GraniteMoeHybridForCausalLM")
    e = int(hf.get("num_local_experts") or 0)
    moe = None
    if e > 0:
        moe = MoESpec(num_experts=e, top_k=int(hf["num_experts_per_tok"]), moe_dim=int(hf["intermediate_size"]),
                      routing="softmax_topk", renormalize=True, activation="silu")
    c.update(attention_scale=float(hf.get("attention_multiplier", 1.0)),
             embedding_multiplier=float(hf.get("embedding_multiplier", 1.0)),
             residual_multiplier=float(hf.get("residual_multiplier", 1.0)),
             logits_scaling=float(hf.get("logits_scaling", 1.0)), moe=moe,
             extra={"layer_types": [_TYPES[t] for t in raw], "mamba": mamba, "rope": rope,
                    "shared_dim": int(hf.get("shared_intermediate_size", 1024))})
    return DecoderConfig(**c)
