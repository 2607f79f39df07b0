"""What encoder (embedding) families share: the padded-batch graph, additive padding mask, mean pooling
with L2 normalisation (sentence-transformers' ``Pooling(mean)`` + ``Normalize``), and the pipeline model
that pads a batch of token rows, runs the graph and returns the embeddings.

Graph inputs: ``input_ids`` int64 ``[batch, seq]`` and ``attention_mask`` int64 ``[batch, seq]`` (1 = token),
with symbolic dims so one compiled graph serves every batch size and padded length.  Output (float32):
``[batch, hidden]`` pooled, or ``[batch, seq, hidden]`` hidden states (``pool_embeddings=False``).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np

from max.driver import Buffer
from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, TensorValue, ops
from max.nn.layer import Module
from max.pipelines.architectures.common.weights import WeightFactory, compute_dtype, load_weights_into, session_policy
from max.pipelines.lib.pipeline import ModelInputs, ModelOutputs, PipelineModel, upper_bounded_default

__all__ = ["EncoderPipelineModel", "additive_mask", "build_encoder_graph", "mean_pool", "tokens_of"]


def additive_mask(attention_mask: TensorValue, dtype: DType) -> TensorValue:
    """``[b, 1, 1, s]``: 0 on tokens, the dtype's most negative value on padding."""
    valid = ops.cast(attention_mask, dtype)
    neg = float(np.finfo(dtype.to_numpy()).min)
    return ops.unsqueeze(ops.unsqueeze((1.0 - valid) * neg, 1), 1)


def mean_pool(h: TensorValue, attention_mask: TensorValue, pool: bool) -> TensorValue:
    """float32 hidden states ``h`` ``[b, s, H]`` -> the L2-normalised mean over valid tokens ``[b, H]``
    (``pool``), else ``h`` itself."""
    if h.dtype is not DType.float32:
        h = ops.cast(h, DType.float32)
    if not pool:
        return h
    m = ops.unsqueeze(ops.cast(attention_mask, DType.float32), -1)  # [b, s, 1]
    summed = ops.sum(h * m, axis=1)  # [b, 1, H]
    count = ops.max(ops.sum(m, axis=1), 1e-9)  # [b, 1, 1]
    pooled = ops.squeeze(summed / count, 1)  # [b, H]
    norm = ops.sqrt(ops.sum(pooled * pooled, axis=-1))  # [b, 1]
    return pooled / ops.max(norm, 1e-12)


def build_encoder_graph(model: Module, device: DeviceRef, name: str) -> Graph:
    ids_t = TensorType(DType.int64, ["batch", "seq"], device)
    mask_t = TensorType(DType.int64, ["batch", "seq"], device)
    with Graph(name, input_types=[ids_t, mask_t]) as g:
        ids, mask = g.inputs
        g.output(model(ids.tensor, mask.tensor))
    return g


def tokens_of(ctx: Any) -> np.ndarray:
    """The prompt token ids of a context (``TextContext``) or a plain id sequence."""
    for attr in ("prompt_tokens", "all_tokens"):
        v = getattr(ctx, attr, None)
        if v is not None:
            return np.asarray(v, dtype=np.int64)
    return np.asarray(ctx, dtype=np.int64).reshape(-1)


class EncoderPipelineModel(PipelineModel):
    """A compiled encoder for ``EmbeddingsPipeline`` (no KV cache).

    A family sets ``config_from_hf(hf: dict)`` (a config with ``hidden_size``, ``pad_token_id``,
    ``max_input_length`` and ``architecture``), ``build_module(cfg, dtype, device, pool, factory)`` and
    ``convert_state_dict`` (its checkpoint adapter).  ``prepare_initial_token_inputs`` pads a batch of
    contexts (or token-id arrays) to its longest row; ``execute`` returns the float32 embeddings as a
    torch tensor in ``ModelOutputs.logits``.
    """

    task = "embeddings_generation"
    config_from_hf: Callable[[dict], Any]
    build_module: Callable[..., Module]
    convert_state_dict: Callable[..., dict]

    def __init__(self, pipeline_config: Any, session: Any, huggingface_config: Any, encoding: Any, devices: list,
                 kv_cache_config: Any, weights: Any, adapter: Any, return_logits: Any = None) -> None:
        super().__init__(pipeline_config, session, huggingface_config, encoding, devices, kv_cache_config, weights,
                         adapter, return_logits)
        t0 = time.perf_counter()
        cfg = self.encoder_config(pipeline_config)
        self.config = cfg
        dev_ref = DeviceRef.from_device(devices[0])
        dt = compute_dtype(encoding, dev_ref, session_policy(session))
        self.compute_dtype = dt
        self.pool_embeddings = bool(getattr(pipeline_config, "pool_embeddings", True))
        self.max_seq_len = self.calculate_max_seq_len(pipeline_config, huggingface_config)
        self.pad_token_id = cfg.pad_token_id
        checkpoint = (adapter or type(self).convert_state_dict)(dict(weights.items()),
                                                                huggingface_config=huggingface_config,
                                                                pipeline_config=pipeline_config)
        module = type(self).build_module(cfg, dt, dev_ref, self.pool_embeddings, WeightFactory(dt, dev_ref, checkpoint))
        load_weights_into(module, checkpoint, cfg.architecture)
        self.weights_seconds = time.perf_counter() - t0
        t1 = time.perf_counter()
        self.model = session.load(type(self).build_graph(module, dev_ref, cfg.architecture),
                                  weights_registry=module.state_dict())
        self.compile_seconds = time.perf_counter() - t1

    cross_encoder = False  # True: the model scores text pairs (``execute`` returns logits, see bert.classifier)

    @staticmethod
    def build_graph(module: Module, device: DeviceRef, name: str) -> Graph:
        return build_encoder_graph(module, device, name)

    @classmethod
    def encoder_config(cls, pipeline_config: Any) -> Any:
        hf = pipeline_config.model_config.huggingface_config
        return cls.config_from_hf(hf.to_dict() if hasattr(hf, "to_dict") else dict(hf))

    @classmethod
    def calculate_max_seq_len(cls, pipeline_config: Any, huggingface_config: Any) -> int:
        return upper_bounded_default(cls.encoder_config(pipeline_config).max_input_length, pipeline_config.max_length)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def prepare_initial_token_inputs(self, context_batch: Sequence[Any], kv_cache_inputs: Any = None,
                                     return_n_logits: int = 1) -> ModelInputs:
        rows = [tokens_of(c) for c in context_batch]
        if not rows:
            raise ValueError(f"{type(self).__name__}: empty batch")
        width = max(len(r) for r in rows)
        ids = np.full((len(rows), width), self.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
            mask[i, : len(r)] = 1
        dev = self.devices[0]
        ids_b, mask_b = Buffer.from_numpy(ids), Buffer.from_numpy(mask)
        if not DeviceRef.from_device(dev).is_cpu():
            ids_b, mask_b = ids_b.to(dev), mask_b.to(dev)
        return ModelInputs(input_ids=ids_b, attention_mask=mask_b, lengths=[len(r) for r in rows])

    def execute(self, model_inputs: ModelInputs) -> ModelOutputs:
        (out,) = self.model.execute(model_inputs.input_ids, model_inputs.attention_mask)
        return ModelOutputs(logits=out._torch())
