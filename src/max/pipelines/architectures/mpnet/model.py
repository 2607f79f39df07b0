"""MPNet encoders as ``max.nn`` modules (names mirror Hugging Face's ``MPNetModel``:
``encoder.layer.0.attention.attn.q.weight`` ...), and their pipeline model.

Like BERT but without token types, with positions starting after the padding index, and a learned
relative-position bias (T5-style buckets, shared by every layer) added to the attention scores.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from max.dtype import DType
from max.graph import DeviceRef, TensorValue, ops
from max.nn import LayerList, Module
from max.nn import LayerNorm as _LayerNorm
from max.pipelines.architectures.common.encoder import EncoderPipelineModel, additive_mask, mean_pool
from max.pipelines.architectures.common.weights import WeightFactory
from max.pipelines.architectures.mpnet.config import ACTIVATIONS, MPNetConfig

__all__ = ["MPNetModel", "MPNetPipelineModel", "convert_state_dict", "relative_position_buckets"]


def relative_position_buckets(n: int, num_buckets: int = 32, max_distance: int = 128) -> np.ndarray:
    """``[n, n]`` int64: the bucket of key position ``j`` relative to query position ``i`` (bidirectional:
    half the buckets for each sign; exact below ``num_buckets // 4``, logarithmic up to ``max_distance``)."""
    rel = np.arange(n)[None, :] - np.arange(n)[:, None]
    m = -rel
    half = num_buckets // 2
    ret = (m < 0).astype(np.int64) * half
    m = np.abs(m)
    exact = half // 2
    with np.errstate(divide="ignore"):
        large = exact + (np.log(np.maximum(m, 1) / exact) / math.log(max_distance / exact) * (half - exact)).astype(
            np.int64)
    large = np.minimum(large, half - 1)
    return ret + np.where(m < exact, m, large)


class MPNetEmbeddings(Module):
    def __init__(self, cfg: MPNetConfig, f: WeightFactory, p: str = "embeddings") -> None:
        super().__init__()
        self.start = cfg.position_offset
        self.word_embeddings = f.embedding(f"{p}.word_embeddings", cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = f.embedding(f"{p}.position_embeddings", cfg.max_position_embeddings,
                                               cfg.hidden_size)
        self.LayerNorm = _LayerNorm(cfg.hidden_size, f.device, f.dtype, eps=cfg.layer_norm_eps)

    def __call__(self, input_ids: TensorValue) -> TensorValue:
        seq = input_ids.shape[1]
        return self.LayerNorm(self.word_embeddings(input_ids) + self.position_embeddings.weight[self.start:][:seq])


class MPNetSelfAttention(Module):
    def __init__(self, cfg: MPNetConfig, f: WeightFactory, p: str) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.n_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        for name in ("q", "k", "v", "o"):
            setattr(self, name, f.linear(f"{p}.{name}", h, h, has_bias=True))

    def _heads(self, x: TensorValue) -> TensorValue:
        return ops.transpose(ops.reshape(x, [x.shape[0], x.shape[1], self.n_heads, self.head_dim]), 1, 2)

    def __call__(self, x: TensorValue, mask: TensorValue, bias: TensorValue) -> TensorValue:
        b, s = x.shape[0], x.shape[1]
        q, k, v = self._heads(self.q(x)), self._heads(self.k(x)), self._heads(self.v(x))
        scores = (q @ ops.transpose(k, -1, -2)) * (1.0 / math.sqrt(self.head_dim)) + bias + mask
        ctx = ops.softmax(scores) @ v
        return self.o(ops.reshape(ops.transpose(ctx, 1, 2), [b, s, self.n_heads * self.head_dim]))


class MPNetLayer(Module):
    def __init__(self, cfg: MPNetConfig, f: WeightFactory, p: str) -> None:
        super().__init__()
        h, eps = cfg.hidden_size, cfg.layer_norm_eps
        self.attention = Module()
        self.attention.attn = MPNetSelfAttention(cfg, f, f"{p}.attention.attn")
        self.attention.LayerNorm = _LayerNorm(h, f.device, f.dtype, eps=eps)
        self.intermediate = Module()
        self.intermediate.dense = f.linear(f"{p}.intermediate.dense", h, cfg.intermediate_size, has_bias=True)
        self.output = Module()
        self.output.dense = f.linear(f"{p}.output.dense", cfg.intermediate_size, h, has_bias=True)
        self.output.LayerNorm = _LayerNorm(h, f.device, f.dtype, eps=eps)
        self.act = ACTIVATIONS[cfg.hidden_act]

    def __call__(self, x: TensorValue, mask: TensorValue, bias: TensorValue) -> TensorValue:
        a = self.attention.LayerNorm(self.attention.attn(x, mask, bias) + x)
        y = self.intermediate.dense(a)
        y = ops.relu(y) if self.act == "relu" else ops.gelu(y, approximate=self.act)
        return self.output.LayerNorm(self.output.dense(y) + a)


class MPNetModel(Module):
    """``(input_ids, attention_mask) -> last hidden states`` or mean-pooled, normalised embeddings."""

    def __init__(self, cfg: MPNetConfig, dtype: DType, device: DeviceRef, pool_embeddings: bool = True,
                 factory: WeightFactory | None = None) -> None:
        super().__init__()
        f = factory or WeightFactory(dtype, device)
        self.dtype, self.pool_embeddings = dtype, pool_embeddings
        self.buckets = relative_position_buckets(cfg.max_input_length, cfg.relative_attention_num_buckets)
        self.embeddings = MPNetEmbeddings(cfg, f)
        self.encoder = Module()
        self.encoder.layer = LayerList([MPNetLayer(cfg, f, f"encoder.layer.{i}") for i in range(cfg.num_hidden_layers)])
        self.encoder.relative_attention_bias = f.embedding("encoder.relative_attention_bias",
                                                          cfg.relative_attention_num_buckets, cfg.num_attention_heads)
        f.check_paths(self)

    def __call__(self, input_ids: TensorValue, attention_mask: TensorValue) -> TensorValue:
        seq = input_ids.shape[1]
        buckets = ops.constant(self.buckets, DType.int64, input_ids.device)[:seq, :seq]
        bias = ops.unsqueeze(ops.permute(self.encoder.relative_attention_bias(buckets), [2, 0, 1]), 0)
        mask = additive_mask(attention_mask, self.dtype)
        h = self.embeddings(input_ids)
        for layer in self.encoder.layer:
            h = layer(h, mask, bias)
        return mean_pool(h, attention_mask, self.pool_embeddings)


def convert_state_dict(state_dict: dict[str, Any], **_: Any) -> dict[str, Any]:
    """Checkpoint names -> module names: a ``mpnet.`` prefix dropped; ``pooler.*``, ``lm_head.*`` and buffers
    left out."""
    out = {}
    for name, w in state_dict.items():
        n = name[len("mpnet."):] if name.startswith("mpnet.") else name
        if n.startswith(("embeddings.", "encoder.")) and not n.endswith("position_ids"):
            out[n] = w
    return out


class MPNetPipelineModel(EncoderPipelineModel):
    """A compiled MPNet encoder for ``EmbeddingsPipeline``."""

    config_from_hf = staticmethod(MPNetConfig.from_hf)
    convert_state_dict = staticmethod(convert_state_dict)

    @staticmethod
    def build_module(cfg: MPNetConfig, dtype: DType, device: DeviceRef, pool: bool, factory: WeightFactory) -> Module:
        return MPNetModel(cfg, dtype, device, pool_embeddings=pool, factory=factory)
