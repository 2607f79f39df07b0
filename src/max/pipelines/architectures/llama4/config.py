"""Llama 4 text configuration from a Hugging Face ``config.json`` (``Llama4TextConfig``; the text part of
a ``Llama4Config``)."""

from __future__ import annotations

from max.pipelines.architectures.common import DecoderConfig, hf_common
from max.pipelines.architectures.common.moe import MoESpec


def config_from_hf(hf: dict) -> DecoderConfig:
    hf = dict(hf.get("text_config") or hf)
    n = int(hf["num_hidden_layers"])
    flags = hf.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(n)]  # 1: RoPE, 0: NoPE
    step = int(hf.get("interleave_moe_layer_step") or 1)
    moe_layers = hf.get("moe_layers")
    if moe_layers is None:
        moe_layers = list(range(step - 1, n, step))
    k = int(hf.get("num_experts_per_tok") or 1)
    if k != 1:
        raise NotImplementedError(f"Llama4ForCausalLM: num_experts_per_tok {k} is not supported (Llama 4 routes "
                                  "each token to 1 expert)")
    c = hf_common({**hf, "intermediate_size": hf.get("intermediate_size_mlp") or hf["intermediate_size"]},
                  "Llama4ForCausalLM")
    moe_dim = int(hf["intermediate_size"])
    c.update(
        interleaved_rope=True, o_proj_bias=c["attention_bias"], sliding_window=None, layer_types=None,
        no_rope_layers={i for i, f in enumerate(flags) if not f},
        moe=MoESpec(num_experts=int(hf["num_local_experts"]), top_k=1, moe_dim=moe_dim, router_name="router",
                    activation=c["hidden_act"], shared_dim=moe_dim,
                    dense_layers={i for i in range(n) if i not in set(moe_layers)}),
        extra=dict(use_qk_norm=bool(hf.get("use_qk_norm", True)),
                   attn_temperature_tuning=bool(hf.get("attn_temperature_tuning", True)),
                   floor_scale=int(hf.get("floor_scale") or 8192), attn_scale=float(hf.get("attn_scale") or 0.1),
                   attention_chunk_size=hf.get("attention_chunk_size")))
    return DecoderConfig(**c)
