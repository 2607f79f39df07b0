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

import time
from typing import Any, Sequence

import numpy as np

from max.driver import Buffer
from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, TensorValue, ops
from max.nn import LayerList, Module
from max.nn import LayerNorm as _LayerNorm
from max.pipelines.architectures.bert.config import ACTIVATIONS, BertConfig
from max.pipelines.architectures.common.weights import WeightFactory, compute_dtype, load_weights_into
from max.pipelines.lib.pipeline import ModelInputs, ModelOutputs, PipelineModel, upper_bounded_default

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

    def __call__(self, input_ids: TensorValue) -> TensorValue:
        seq = input_ids.shape[1]
        x = self.word_embeddings(input_ids)
        # positions 0..seq-1 and token type 0: slices of the tables, no gathers
        x = x + self.position_embeddings.weight[:seq] + self.token_type_embeddings.weight[0]
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
        valid = ops.cast(attention_mask, self.dtype)  # [b, s], 1 = token
        # additive mask [b, 1, 1, s]: 0 on tokens, the dtype's most negative value on padding
        neg = float(np.finfo(self.dtype.to_numpy()).min)
        mask = ops.unsqueeze(ops.unsqueeze((1.0 - valid) * neg, 1), 1)
        h = self.encoder(self.embeddings(input_ids), mask)
        if self.dtype is not DType.float32:
            h = ops.cast(h, DType.float32)
        if not self.pool_embeddings:
            return h
        m = ops.unsqueeze(ops.cast(attention_mask, DType.float32), -1)  # [b, s, 1]
        summed = ops.sum(h * m, axis=1)  # [b, 1, H]
        count = ops.max(ops.sum(m, axis=1), 1e-9)  # [b, 1, 1]
        pooled = ops.squeeze(summed / count, 1)  # [b, H]
        norm = ops.sqrt(ops.sum(pooled * pooled, axis=-1))  # [b, 1]
        return pooled / ops.max(norm, 1e-12)


def build_graph(model: BertModel, device: DeviceRef, name: str = "bert") -> Graph:
    """The encoder graph over a padded batch (see the module docstring)."""
    ids_t = TensorType(DType.int64, ["batch", "seq"], device)
    mask_t = TensorType(DType.int64, ["batch", "seq"], device)
    with Graph(name, input_types=[ids_t, mask_t]) as g:
        ids, mask = g.inputs
        g.output(model(ids.tensor, mask.tensor))
    return g


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
def bert_config_for(pipeline_config: Any) -> BertConfig:
    hf = pipeline_config.model_config.huggingface_config
    return BertConfig.from_hf(hf.to_dict() if hasattr(hf, "to_dict") else dict(hf))


class BertPipelineModel(PipelineModel):
    """A compiled BERT encoder for ``EmbeddingsPipeline`` (no KV cache).

    ``prepare_initial_token_inputs`` pads a batch of contexts (or token-id
    arrays) to its longest row; ``execute`` returns float32 embeddings as a
    torch tensor in ``ModelOutputs.logits`` (``[batch, hidden]`` pooled, or
    ``[batch, seq, hidden]``).
    """

    task = "embeddings_generation"

    def __init__(self, pipeline_config: Any, session: Any, huggingface_config: Any, encoding: Any, devices: list,
                 kv_cache_config: Any, weights: Any, adapter: Any, return_logits: Any = None) -> None:
        super().__init__(pipeline_config, session, huggingface_config, encoding, devices, kv_cache_config, weights,
                         adapter, return_logits)
        t0 = time.perf_counter()
        cfg = bert_config_for(pipeline_config)
        self.config = cfg
        dev_ref = DeviceRef.from_device(devices[0])
        dt = compute_dtype(encoding, dev_ref)
        self.compute_dtype = dt
        self.pool_embeddings = bool(getattr(pipeline_config, "pool_embeddings", True))
        self.max_seq_len = self.calculate_max_seq_len(pipeline_config, huggingface_config)
        self.pad_token_id = cfg.pad_token_id
        checkpoint = (adapter or convert_state_dict)(dict(weights.items()), huggingface_config=huggingface_config,
                                                     pipeline_config=pipeline_config)
        module = BertModel(cfg, dt, dev_ref, pool_embeddings=self.pool_embeddings,
                           factory=WeightFactory(dt, dev_ref, checkpoint))
        load_weights_into(module, checkpoint, cfg.architecture)
        self.weights_seconds = time.perf_counter() - t0
        t1 = time.perf_counter()
        graph = build_graph(module, dev_ref, name=cfg.architecture)
        self.model = session.load(graph, weights_registry=module.state_dict())
        self.compile_seconds = time.perf_counter() - t1

    @classmethod
    def calculate_max_seq_len(cls, pipeline_config: Any, huggingface_config: Any) -> int:
        return upper_bounded_default(bert_config_for(pipeline_config).max_position_embeddings,
                                     pipeline_config.max_length)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def prepare_initial_token_inputs(self, context_batch: Sequence[Any], kv_cache_inputs: Any = None,
                                     return_n_logits: int = 1) -> ModelInputs:
        rows = [_tokens_of(c) for c in context_batch]
        if not rows:
            raise ValueError("BertPipelineModel: empty batch")
        width = max(len(r) for r in rows)
        ids = np.full((len(rows), width), self.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
            mask[i, : len(r)] = 1
        dev = self.devices[0]
        on_host = DeviceRef.from_device(dev).is_cpu()
        ids_b, mask_b = Buffer.from_numpy(ids), Buffer.from_numpy(mask)
        if not on_host:
            ids_b, mask_b = ids_b.to(dev), mask_b.to(dev)
        return ModelInputs(input_ids=ids_b, attention_mask=mask_b, lengths=[len(r) for r in rows])

    def execute(self, model_inputs: ModelInputs) -> ModelOutputs:
        (out,) = self.model.execute(model_inputs.input_ids, model_inputs.attention_mask)
        return ModelOutputs(logits=out._torch())


def _tokens_of(ctx: Any) -> np.ndarray:
    """The prompt token ids of a context (``TextContext``) or a plain id sequence."""
    for attr in ("prompt_tokens", "all_tokens"):
        v = getattr(ctx, attr, None)
        if v is not None:
            return np.asarray(v, dtype=np.int64)
    return np.asarray(ctx, dtype=np.int64).reshape(-1)
