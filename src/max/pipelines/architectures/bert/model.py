"""BERT encoders (``BertModel``: all-MiniLM, BGE, E5, ...) as ``max.nn`` modules and one graph.

Module and weight names mirror Hugging Face's ``BertModel`` state dict
(``embeddings.word_embeddings.weight``, ``encoder.layer.0.attention.self.query.weight``
...), so a checkpoint loads after dropping a ``bert.`` prefix.

Graph inputs: ``input_ids`` int64 ``[batch, seq]`` and ``attention_mask`` int64
``[batch, seq]`` (1 = token, 0 = padding), both with symbolic dims so one
compiled graph serves every batch size and padded length.  Output (float32):

- ``pool_embeddings=True``: ``[batch, hidden]``, the mean of the last hidden
  states over the valid tokens, L2-normalised (sentence-transformers'
  ``Pooling(mean)`` + ``Normalize``);
- ``pool_embeddings=False``: ``[batch, seq, hidden]``, the last hidden states
  (rows of padding positions are meaningless).

Attention is written as ``softmax(q @ kᵀ * scale + mask) @ v`` with an additive
padding mask; the engine's fusion pass turns it into one SDPA call.
"""

from __future__ import annotations

from typing import Any

from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorValue, ops
from max.nn import LayerList, Module
from max.nn import LayerNorm as _LayerNorm
from max.pipelines.architectures.bert.config import ACTIVATIONS, BertConfig
from max.pipelines.architectures.common.encoder import (
    EncoderPipelineModel,
    additive_mask,
    build_encoder_graph,
    mean_pool,
)
from max.pipelines.architectures.common.weights import WeightFactory

__all__ = ["BertEmbeddings", "BertLayer", "BertModel", "BertPipelineModel", "build_graph", "convert_state_dict"]


class BertEmbeddings(Module):
    """word + absolute position + token type (always type 0) embeddings, then LayerNorm."""

    def __init__(self, cfg: BertConfig, f: WeightFactory, p: str = "embeddings") -> None:
        super().__init__()
        self.word_embeddings = f.embedding(f"{p}.word_embeddings", cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = f.embedding(f"{p}.position_embeddings", cfg.max_position_embeddings,
                                               cfg.hidden_size)
        self.token_type_embeddings = f.embedding(f"{p}.token_type_embeddings", cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = _LayerNorm(cfg.hidden_size, f.device, f.dtype, eps=cfg.layer_norm_eps)

        self.position_offset = cfg.position_offset

    def __call__(self, input_ids: TensorValue, token_type_ids: TensorValue | None = None) -> TensorValue:
        seq = input_ids.shape[1]
        x = self.word_embeddings(input_ids)
        # positions offset..offset+seq-1 (right padding: every token's own position) and, without
        # token_type_ids, token type 0: slices of the tables, no gathers
        off = self.position_offset
        x = x + (self.position_embeddings.weight[off: off + seq] if off else self.position_embeddings.weight[:seq])
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(x)


class BertSelfAttention(Module):
    def __init__(self, cfg: BertConfig, f: WeightFactory, p: str) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.n_heads = cfg.num_attention_heads
        self.head_dim = cfg.head_dim
        self.query = f.linear(f"{p}.query", h, h, has_bias=True)
        self.key = f.linear(f"{p}.key", h, h, has_bias=True)
        self.value = f.linear(f"{p}.value", h, h, has_bias=True)

    def _heads(self, x: TensorValue) -> TensorValue:
        b, s = x.shape[0], x.shape[1]
        return ops.transpose(ops.reshape(x, [b, s, self.n_heads, self.head_dim]), 1, 2)  # [b, heads, s, hd]

    def __call__(self, x: TensorValue, mask: TensorValue) -> TensorValue:
        b, s = x.shape[0], x.shape[1]
        q, k, v = self._heads(self.query(x)), self._heads(self.key(x)), self._heads(self.value(x))
        scores = (q @ ops.transpose(k, -1, -2)) * (1.0 / float(self.head_dim) ** 0.5) + mask
        ctx = ops.softmax(scores) @ v  # fused into one SDPA call by the engine
        return ops.reshape(ops.transpose(ctx, 1, 2), [b, s, self.n_heads * self.head_dim])


class BertSelfOutput(Module):
    """``LayerNorm(dense(x) + residual)`` (also BERT's ``output`` block after the MLP)."""

    def __init__(self, in_dim: int, cfg: BertConfig, f: WeightFactory, p: str) -> None:
        super().__init__()
        self.dense = f.linear(f"{p}.dense", in_dim, cfg.hidden_size, has_bias=True)
        self.LayerNorm = _LayerNorm(cfg.hidden_size, f.device, f.dtype, eps=cfg.layer_norm_eps)

    def __call__(self, x: TensorValue, residual: TensorValue) -> TensorValue:
        return self.LayerNorm(self.dense(x) + residual)


class BertAttention(Module):
    def __init__(self, cfg: BertConfig, f: WeightFactory, p: str) -> None:
        super().__init__()
        # ``self`` is the Hugging Face name of this sub-module (attention.self.query ...)
        setattr(self, "self", BertSelfAttention(cfg, f, f"{p}.self"))
        self.output = BertSelfOutput(cfg.hidden_size, cfg, f, f"{p}.output")

    def __call__(self, x: TensorValue, mask: TensorValue) -> TensorValue:
        return self.output(getattr(self, "self")(x, mask), x)


class BertIntermediate(Module):
    def __init__(self, cfg: BertConfig, f: WeightFactory, p: str) -> None:
        super().__init__()
        self.dense = f.linear(f"{p}.dense", cfg.hidden_size, cfg.intermediate_size, has_bias=True)
        self.act, self.approximate = ACTIVATIONS[cfg.hidden_act]

    def __call__(self, x: TensorValue) -> TensorValue:
        y = self.dense(x)
        if self.act == "gelu":
            return ops.gelu(y, approximate=self.approximate)
        return ops.relu(y) if self.act == "relu" else ops.silu(y)


class BertLayer(Module):
    """Post-LN encoder layer: attention (+ residual, LN), GELU MLP (+ residual, LN)."""

    def __init__(self, cfg: BertConfig, f: WeightFactory, p: str) -> None:
        super().__init__()
        self.attention = BertAttention(cfg, f, f"{p}.attention")
        self.intermediate = BertIntermediate(cfg, f, f"{p}.intermediate")
        self.output = BertSelfOutput(cfg.intermediate_size, cfg, f, f"{p}.output")

    def __call__(self, x: TensorValue, mask: TensorValue) -> TensorValue:
        a = self.attention(x, mask)
        return self.output(self.intermediate(a), a)


class BertEncoder(Module):
    def __init__(self, cfg: BertConfig, f: WeightFactory, p: str = "encoder") -> None:
        super().__init__()
        self.layer = LayerList([BertLayer(cfg, f, f"{p}.layer.{i}") for i in range(cfg.num_hidden_layers)])

    def __call__(self, x: TensorValue, mask: TensorValue) -> TensorValue:
        for layer in self.layer:
            x = layer(x, mask)
        return x


class BertModel(Module):
    """The BERT encoder: ``(input_ids, attention_mask) -> last hidden states`` or pooled embeddings.

    Its projections and tables come from ``factory`` (default: a plain float one in ``dtype``)."""

    def __init__(self, cfg: BertConfig, dtype: DType, device: DeviceRef, pool_embeddings: bool = True,
                 factory: WeightFactory | None = None) -> None:
        super().__init__()
        f = factory or WeightFactory(dtype, device)
        self.config = cfg
        self.dtype = dtype
        self.pool_embeddings = pool_embeddings
        self.embeddings = BertEmbeddings(cfg, f)
        self.encoder = BertEncoder(cfg, f)
        f.check_paths(self)

    def __call__(self, input_ids: TensorValue, attention_mask: TensorValue) -> TensorValue:
        h = self.encoder(self.embeddings(input_ids), additive_mask(attention_mask, self.dtype))
        return mean_pool(h, attention_mask, self.pool_embeddings)


def build_graph(model: BertModel, device: DeviceRef, name: str = "bert") -> Graph:
    """The encoder graph over a padded batch (see ``common.encoder``)."""
    return build_encoder_graph(model, device, name)


# --------------------------------------------------------------------------- weights
def hf_to_module_name(name: str) -> str | None:
    """A checkpoint tensor name -> this module's name (None: not used by the encoder)."""
    for prefix in ("bert.", "model."):
        if name.startswith(prefix):
            name = name[len(prefix):]
    if not name.startswith(("embeddings.", "encoder.")) or name.endswith("position_ids"):
        return None  # pooler.*, cls.* (MLM head), buffers
    if name.endswith(".gamma"):
        name = name[: -len(".gamma")] + ".weight"
    elif name.endswith(".beta"):
        name = name[: -len(".beta")] + ".bias"
    return name


def convert_state_dict(state_dict: dict[str, Any], **_: Any) -> dict[str, Any]:
    """Checkpoint tensors -> the encoder's module names (unused ones, e.g. ``pooler.*``, left out)."""
    out = {}
    for name, w in state_dict.items():
        new = hf_to_module_name(name)
        if new is not None:
            out[new] = w
    return out


# --------------------------------------------------------------------------- pipeline model
class BertPipelineModel(EncoderPipelineModel):
    """A compiled BERT encoder for ``EmbeddingsPipeline`` (see ``common.encoder.EncoderPipelineModel``)."""

    config_from_hf = staticmethod(BertConfig.from_hf)
    convert_state_dict = staticmethod(convert_state_dict)

    @staticmethod
    def build_module(cfg: BertConfig, dtype: DType, device: DeviceRef, pool: bool, factory: WeightFactory) -> Module:
        return BertModel(cfg, dtype, device, pool_embeddings=pool, factory=factory)

