"""Embedding layers: ``Embedding`` (alias ``EmbeddingV2``), ``VocabParallelEmbedding``, ``EmbeddingV1``.

An embedding maps integer indices in ``[0, vocab_size)`` to rows of a
``(vocab_size, hidden_dim)`` table: the output shape is
``indices.shape + [hidden_dim]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from max.dtype import DType
from max.graph import DeviceRef, TensorValue, Weight, ops
from max.graph.quantization import QuantizationEncoding
from max.graph.weight import ShardingStrategy
from max.nn.layer import Layer, Module, check_input, on_device

__all__ = ["Embedding", "EmbeddingV1", "EmbeddingV2", "VocabParallelEmbedding", "vocab_parallel_lookup"]

_INDEX_DTYPES = (DType.int32, DType.int64, DType.uint32, DType.uint64)


def _indices(layer: Any, x: Any) -> TensorValue:
    v = check_input(layer, x, arg="indices")
    if v.dtype not in _INDEX_DTYPES:
        name = getattr(layer, "_layer_name", type(layer).__name__)
        raise TypeError(f"{name}: indices must be int32/int64/uint32/uint64, got {v.dtype}")
    return v


def _table_shape(vocab_size: int, hidden_dim: int, encoding: QuantizationEncoding | None, who: str) -> list[int]:
    for arg, v in (("vocab_size", vocab_size), ("hidden_dim", hidden_dim)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{who}: {arg} must be a positive int, got {v!r}")
    if encoding is None:
        return [vocab_size, hidden_dim]
    epb = encoding.elements_per_block
    if hidden_dim % epb:
        raise ValueError(f"{who}: hidden_dim {hidden_dim} is not a multiple of the {encoding} block size {epb}")
    return [vocab_size, hidden_dim // epb * encoding.block_size]


def _lookup(table: TensorValue, idx: TensorValue, encoding: QuantizationEncoding | None, who: str) -> TensorValue:
    rows = ops.gather(table, idx, axis=0)
    if encoding is None:
        return rows
    deq = getattr(ops, "dequantize", None)
    if deq is None:
        raise NotImplementedError(
            f"{who}: quantized ({encoding}) embeddings need ops.dequantize, which this libremax build does "
            "not provide yet; load the table as float (WeightData.astype) instead"
        )
    flat = ops.reshape(rows, [-1, rows.shape[-1]])
    out = deq(encoding, flat)
    return ops.reshape(out, list(idx.shape) + [out.shape[-1]])


class Embedding(Module):
    """A ``(vocab_size, hidden_dim)`` lookup table; the weight is named ``name`` (default ``"weight"``)."""

    def __init__(self, vocab_size: int, hidden_dim: int, dtype: DType, device: DeviceRef,
                 quantization_encoding: QuantizationEncoding | None = None, name: str | None = None) -> None:
        super().__init__()
        shape = _table_shape(vocab_size, hidden_dim, quantization_encoding, "Embedding")
        self.vocab_size = vocab_size
        self.hidden_dim = hidden_dim
        self.device = device if device is not None else DeviceRef.CPU()
        self.quantization_encoding = quantization_encoding
        self.weight = Weight(name or "weight", DType.uint8 if quantization_encoding else dtype, shape,
                             self.device, quantization_encoding=quantization_encoding)

    def __call__(self, indices: Any) -> TensorValue:
        idx = on_device(_indices(self, indices), self.device)
        return _lookup(self.weight, idx, self.quantization_encoding, self._layer_name)


EmbeddingV2 = Embedding


class VocabParallelEmbedding(Module):
    """An Embedding whose table is split by vocabulary rows across ``devices``.

    Each device looks up the indices that fall in its slice (others give
    zeros); the partial results are summed (all-reduce) so every device gets
    the full embeddings.  Returns one TensorValue per device.  ``device=`` is
    accepted as a synonym of ``devices`` (the reference's example uses it).
    """

    def __init__(self, vocab_size: int, hidden_dim: int, dtype: DType, devices: Sequence[DeviceRef] | None = None,
                 quantization_encoding: QuantizationEncoding | None = None, name: str | None = None,
                 *, device: Sequence[DeviceRef] | DeviceRef | None = None) -> None:
        super().__init__()
        if devices is None:
            devices = device
        if devices is None:
            raise TypeError("VocabParallelEmbedding: devices is required")
        if isinstance(devices, DeviceRef):
            devices = [devices]
        devs = list(devices)
        if not devs:
            raise ValueError("VocabParallelEmbedding: devices must not be empty")
        if vocab_size % len(devs):
            raise ValueError(
                f"VocabParallelEmbedding: vocab_size {vocab_size} does not split evenly across {len(devs)} devices"
            )
        shape = _table_shape(vocab_size, hidden_dim, quantization_encoding, "VocabParallelEmbedding")
        self.vocab_size = vocab_size
        self.hidden_dim = hidden_dim
        self.devices = devs
        self.device = devs[0]
        self.quantization_encoding = quantization_encoding
        self.weight = Weight(name or "weight", DType.uint8 if quantization_encoding else dtype, shape,
                             DeviceRef.CPU(), quantization_encoding=quantization_encoding)

    def __call__(self, indices: Any, signal_buffers: Any = None) -> list[TensorValue]:
        return vocab_parallel_lookup(self, indices, self.devices, signal_buffers)


def vocab_parallel_lookup(table: Any, indices: Any, devices: Sequence[DeviceRef],
                          signal_buffers: Any = None) -> list[TensorValue]:
    """Embeddings of ``indices`` from ``table`` (an ``Embedding`` or ``VocabParallelEmbedding``) with
    its rows split evenly across ``devices``: each device looks up the indices inside its slice (zeros
    elsewhere) and the partial results are summed on every device (``ops.allreduce.sum`` when
    ``signal_buffers`` are given).  ``indices``: one tensor, or one per device.  One result per device."""
    who = getattr(table, "_layer_name", type(table).__name__)
    devs = list(devices)
    n = len(devs)
    idx_in = list(indices) if isinstance(indices, (list, tuple)) else [indices] * n
    if len(idx_in) != n:
        raise ValueError(f"{who}: got {len(idx_in)} index tensors for {n} devices")
    vocab = int(table.vocab_size)
    if vocab % n:
        raise ValueError(f"{who}: vocab_size {vocab} does not split evenly across {n} devices")
    w = table.weight
    if w.sharding_strategy is None:
        w.sharding_strategy = ShardingStrategy.rowwise(n)
    shards = w.shard(devs)
    per = vocab // n
    parts = []
    for i, (dev, shard, ix) in enumerate(zip(devs, shards, idx_in)):
        ix = on_device(_indices(table, ix), dev)
        local = ix - ops.constant(i * per, ix.dtype, dev) if i else ix
        if ix.dtype in (DType.uint32, DType.uint64):
            inside = ops.logical_and(ix >= i * per, ix < (i + 1) * per)
        else:
            inside = ops.logical_and(local >= 0, local < per)
        local = ops.where(inside, local, ops.constant(0, ix.dtype, dev))
        rows = _lookup(shard, local, table.quantization_encoding, who)
        zero = ops.constant(0, rows.dtype, dev)
        parts.append(ops.where(ops.unsqueeze(inside, -1), rows, zero))
    from max.nn.linear import allreduce_parts

    return allreduce_parts(parts, devs, signal_buffers)


@dataclass(eq=False)
class EmbeddingV1(Layer):
    """Deprecated: a lookup into ``weights`` (a graph value) executed on ``device``."""

    weights: Any
    device: DeviceRef

    def __call__(self, indices: Any) -> TensorValue:
        from max.graph.ops._common import as_tensor

        table = as_tensor(self.weights, op="EmbeddingV1", arg="weights")
        idx = on_device(_indices(self, indices), self.device)
        return ops.gather(on_device(table, self.device), idx, axis=0)
