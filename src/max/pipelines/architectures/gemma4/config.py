"""Gemma 4 text configuration from a Hugging Face ``config.json`` (``gemma4_text``, or the
``text_config`` of a ``gemma4`` one); see the package docstring for what is supported."""

from __future__ import annotations

from typing import Any

from max.pipelines.architectures.common import DecoderConfig, hf_common
from max.pipelines.architectures.gemma3.config import NORMS

NAME = "Gemma4ForCausalLM"


def _unsupported(hf: dict) -> None:
    checks = (("use_bidirectional_attention", "bidirectional attention"),)
    for key, what in checks:
        if hf.get(key):
            raise NotImplementedError(f"{NAME}: {what} ({key}={hf[key]!r}) is not supported yet")


def layer_shapes(hf: dict) -> tuple[list[int], list[int]]:
    """Per layer: head size and KV heads (global layers: ``per_layer_config``, or ``global_head_dim`` /
    ``num_global_key_value_heads`` as the config class derives them)."""
    n, types = int(hf["num_hidden_layers"]), list(hf["layer_types"])
    hd = int(hf.get("head_dim") or int(hf["hidden_size"]) // int(hf["num_attention_heads"]))
    kv = int(hf.get("num_key_value_heads") or hf["num_attention_heads"])
    plc = hf.get("per_layer_config")
    if plc is None:
        over = {"head_dim": int(hf.get("global_head_dim") or 512)}
        if hf.get("attention_k_eq_v", True) and hf.get("num_global_key_value_heads"):
            over["num_key_value_heads"] = int(hf["num_global_key_value_heads"])
        plc = {i: over for i, t in enumerate(types) if t == "full_attention"}
    plc = {int(k): v for k, v in plc.items()}
    dims = [int(plc.get(i, {}).get("head_dim") or hd) for i in range(n)]
    heads = [int(plc.get(i, {}).get("num_key_value_heads") or kv) for i in range(n)]
    return dims, heads


def kv_sources(hf: dict) -> list[int]:
    """Per layer, the layer whose cache entries it attends over: itself, or for the last
    ``num_kv_shared_layers`` layers (KV sharing) the last earlier non-shared layer of the same type."""
    n, types = int(hf["num_hidden_layers"]), list(hf["layer_types"])
    shared = int(hf.get("num_kv_shared_layers") or 0)
    if not 0 <= shared < n:
        raise ValueError(f"{NAME}: num_kv_shared_layers {shared} must be below num_hidden_layers {n} (some layer "
                         "must compute the keys and values the others share)")
    first = n - shared
    out = list(range(n))
    for i in range(first, n):
        own = [j for j in range(first) if types[j] == types[i]]
        if not own:
            raise ValueError(f"{NAME}: layer {i} ({types[i]}) shares the keys/values of an earlier layer of its type, "
                             f"but none of the first {first} layers is {types[i]}")
        out[i] = own[-1]
    return out


def _moe(hf: dict) -> dict:
    """The MoE block's sizes (``enable_moe_block``: routed experts beside every layer's dense MLP)."""
    if not hf.get("enable_moe_block"):
        return dict(num_experts=0, top_k=0, moe_dim=0)
    E, k, inter = (int(hf.get(key) or 0) for key in ("num_experts", "top_k_experts", "moe_intermediate_size"))
    if E < 1 or not 1 <= k <= E or inter < 1:
        raise ValueError(f"{NAME}: enable_moe_block needs num_experts >= 1, 1 <= top_k_experts <= num_experts and "
                         f"moe_intermediate_size >= 1, got {E}, {k}, {inter}")
    return dict(num_experts=E, top_k=k, moe_dim=inter)


def config_from_hf(hf: dict) -> DecoderConfig:
    hf = dict(hf.get("text_config") or hf)
    _unsupported(hf)
    n = int(hf["num_hidden_layers"])
    if not hf.get("layer_types"):
        hf["layer_types"] = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)]
    rp = hf.get("rope_parameters") or {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}
    dims, heads = layer_shapes(hf)
    H = int(hf["num_attention_heads"])
    if any(H % h or max(heads) % h for h in heads):
        raise ValueError(f"{NAME}: num_attention_heads {H} and the most KV heads {max(heads)} must be multiples of "
                         f"every layer's KV heads {heads}")
    sources = kv_sources(hf)
    c = hf_common({**hf, "rope_parameters": rp["sliding_attention"]}, NAME)
    wide = 2 if hf.get("use_double_wide_mlp") else 1  # layers that share KV: a double-width MLP
    inter = [int(c["intermediate_size"]) * (wide if sources[i] != i else 1) for i in range(n)]
    c.update(
        o_proj_bias=c["attention_bias"], norms=NORMS, norm_weight_offset=0.0, norm_multiply_before_cast=True,
        attention_scale=1.0, embedding_multiplier=float(c["hidden_size"]) ** 0.5,
        final_logit_softcapping=hf.get("final_logit_softcapping"),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        rope_scaling=None, partial_rotary_factor=1.0,
        extra=dict(head_dims=dims, kv_heads=heads, k_eq_v=bool(hf.get("attention_k_eq_v")),
                   rope_parameters={k: dict(v) for k, v in rp.items()}, kv_sources=sources,
                   kv_layers=n - int(hf.get("num_kv_shared_layers") or 0), intermediate=inter,
                   ple_dim=int(hf.get("hidden_size_per_layer_input") or 0), **_moe(hf),
                   ple_vocab=int(hf.get("vocab_size_per_layer_input") or c["vocab_size"])))
    return DecoderConfig(**c)
