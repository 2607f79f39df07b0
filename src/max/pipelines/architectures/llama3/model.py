"""The Llama-family decoder as a ``max.nn`` module and graph.

Graph inputs, in order: ``tokens`` int64 ``[total_seq_len]`` (ragged),
``input_row_offsets`` uint32 ``[batch + 1]``, ``return_n_logits`` int64 ``[1]``,
then the KV cache's ``input_symbols()`` (blocks, cache_lengths, lookup_table,
max_lengths).  Output: float32 logits ``[batch, vocab]`` of each request's
last token.
"""

from __future__ import annotations

from typing import Any

from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType
from max.nn import MLP, Embedding, Linear, RMSNorm
from max.nn.attention import AttentionWithRope
from max.nn.kv_cache import FetchPagedKVCacheCollection, KVCacheParams
from max.nn.rotary_embedding import Llama3RopeScalingParams, Llama3RotaryEmbedding, RotaryEmbedding
from max.nn.transformer import ReturnLogits, Transformer, TransformerBlock
from max.pipelines.architectures.llama3.config import DecoderConfig


def kv_params_for(cfg: DecoderConfig, dtype: DType, page_size: int = 128,
                  enable_prefix_caching: bool = True) -> KVCacheParams:
    return KVCacheParams(dtype=dtype, n_kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                         page_size=page_size, enable_prefix_caching=enable_prefix_caching)


def _rope(cfg: DecoderConfig, max_seq_len: int, device: DeviceRef) -> RotaryEmbedding:
    common = dict(dim=cfg.num_attention_heads * cfg.head_dim, n_heads=cfg.num_attention_heads,
                  theta=cfg.rope_theta, max_seq_len=max_seq_len, device=device, head_dim=cfg.head_dim,
                  interleaved=cfg.interleaved_rope)
    sc = cfg.rope_scaling or {}
    kind = sc.get("rope_type") or sc.get("type")
    if kind == "llama3":
        params = Llama3RopeScalingParams(
            factor=float(sc["factor"]), low_freq_factor=float(sc.get("low_freq_factor", 1.0)),
            high_freq_factor=float(sc.get("high_freq_factor", 4.0)),
            orig_max_position=int(sc.get("original_max_position_embeddings", 8192)))
        return Llama3RotaryEmbedding(**common, scaling_params=params)
    if kind not in (None, "default"):
        raise NotImplementedError(f"rope scaling {kind!r} is not supported for {cfg.architecture} yet")
    return RotaryEmbedding(**common)


def build_transformer(cfg: DecoderConfig, kv_params: KVCacheParams, dtype: DType, device: DeviceRef,
                      max_seq_len: int) -> Transformer:
    rope = _rope(cfg, max_seq_len, device)
    layers = []
    for _ in range(cfg.num_hidden_layers):
        attn = AttentionWithRope(
            rope=rope, num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
            hidden_size=cfg.hidden_size, kv_params=kv_params, devices=[device], dtype=dtype,
            has_bias=cfg.attention_bias, head_dim=cfg.head_dim,
            qk_norm_eps=cfg.rms_norm_eps if cfg.qk_norm else None, sliding_window=cfg.sliding_window)
        mlp = MLP(dtype, None, cfg.hidden_size, cfg.intermediate_size, [device])
        layers.append(TransformerBlock(attn, mlp, RMSNorm(cfg.hidden_size, dtype, cfg.rms_norm_eps,
                                                          multiply_before_cast=False),
                                       RMSNorm(cfg.hidden_size, dtype, cfg.rms_norm_eps, multiply_before_cast=False)))
    return Transformer(
        dim=cfg.hidden_size, n_heads=cfg.num_attention_heads, layers=layers,
        norm=RMSNorm(cfg.hidden_size, dtype, cfg.rms_norm_eps, multiply_before_cast=False),
        output=Linear(cfg.hidden_size, cfg.vocab_size, dtype, device),
        embedding=Embedding(cfg.vocab_size, cfg.hidden_size, dtype, device),
        kv_params=kv_params,
        kv_collection_constructor=FetchPagedKVCacheCollection(kv_params, cfg.num_hidden_layers),
        rope=rope, return_logits=ReturnLogits.LAST_TOKEN)


def build_graph(model: Transformer, kv_input_symbols: Any, device: DeviceRef, name: str = "llama3") -> Graph:
    """The decode/prefill step graph (see the module docstring for its inputs)."""
    tokens_t = TensorType(DType.int64, ["total_seq_len"], device)
    offsets_t = TensorType(DType.uint32, ["input_row_offsets_len"], device)
    n_logits_t = TensorType(DType.int64, [1], DeviceRef.CPU())
    kv = list(kv_input_symbols)
    with Graph(name, input_types=[tokens_t, offsets_t, n_logits_t, *kv]) as g:
        tokens, offsets, n_logits, *kv_vals = g.inputs
        (logits,) = model(tokens.tensor, kv_vals, n_logits, offsets.tensor)
        g.output(logits)
    return g
