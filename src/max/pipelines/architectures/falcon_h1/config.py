"""Falcon-H1 configuration from a Hugging Face ``config.json`` (``transformers.FalconH1Config``)."""

from __future__ import annotations

from types import SimpleNamespace

from max.pipelines.architectures.common.config import DecoderConfig, hf_common


def config_from_hf(hf: dict) -> DecoderConfig:
    hidden = int(hf["hidden_size"])
    inner = int(hf["mamba_d_ssm"]) if hf.get("mamba_d_ssm") is not None else int(hf.get("mamba_expand", 2)) * hidden
    heads = int(hf.get("mamba_n_heads", 128))
    head_dim = hf.get("mamba_d_head", "auto")
    head_dim = inner // heads if head_dim in (None, "auto") else int(head_dim)
    if hf.get("hidden_act", "silu") not in ("silu", "swish"):
        raise NotImplementedError(f"FalconH1ForCausalLM: activation {hf.get('hidden_act')!r} is not supported")
    lim = tuple(float(v) for v in (hf.get("time_step_limit") or (0.0, float("inf"))))
    mamba = SimpleNamespace(heads=heads, head_dim=head_dim, groups=int(hf.get("mamba_n_groups", 1)),
                            state=int(hf.get("mamba_d_state", 256)), kernel=int(hf.get("mamba_d_conv", 4)),
                            inner=inner, eps=float(hf["rms_norm_eps"]),
                            chunk=min(int(hf.get("mamba_chunk_size") or 64), 64),
                            bias=bool(hf.get("mamba_proj_bias", False)),
                            conv_bias=bool(hf.get("mamba_conv_bias", True)), dt_limit=lim,
                            rms_norm=bool(hf.get("mamba_rms_norm", False)),
                            norm_before_gate=bool(hf.get("mamba_norm_before_gate", True)),
                            out_bias=bool(hf.get("projectors_bias", False)))
    c = hf_common(hf, "FalconH1ForCausalLM")
    c.update(embedding_multiplier=float(hf.get("embedding_multiplier") or 1.0),
             logits_scaling=1.0 / float(hf.get("lm_head_multiplier") or 1.0), extra={"mamba": mamba})
    return DecoderConfig(**c)
