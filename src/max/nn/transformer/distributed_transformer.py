"""``DistributedTransformer`` and ``DistributedTransformerBlock``: a decoder split over devices
(tensor parallelism in one process).

The split (Megatron-style): attention heads and their KV-cache heads, and the MLP's intermediate
features, are divided evenly across the devices; each device computes its heads / features from the
full hidden state and produces a partial output projection, and one all-reduce per attention and
one per MLP sums the partials on every device.  Norms and residuals are replicated.  The token
embedding and the output projection are split by vocabulary rows (vocab-parallel: lookups summed,
logits all-gathered); when the vocabulary does not divide evenly they run whole on the first device.
Every collective takes the graph's signal buffers (:class:`max.nn.Signals`).

A distributed block is called as ``block(layer_idx, xs, signal_buffers, kv_collections, freqs_cis,
input_row_offsets)`` with one entry per device in each list, and returns one hidden state per
device.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Protocol, Sequence, TypeVar, runtime_checkable

from max.dtype import DType
from max.graph import DeviceRef, TensorValue, ops
from max.graph.weight import ShardingStrategy
from max.nn.embedding import vocab_parallel_lookup
from max.nn.layer import Module, on_device
from max.nn.linear import ColumnParallelLinear, Linear, allreduce_parts
from max.nn.transformer.transformer import ReturnLogits, Transformer, finish_logits

__all__ = ["DistributedTransformer", "DistributedTransformerBlock", "ShardableCallable", "distribute_value",
           "forward_sharded_layers", "replicate_on", "take"]

_T = TypeVar("_T")


@runtime_checkable
class ShardableCallable(Protocol):
    """A callable layer that can also be split across devices (``shard(devices)``)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def shard(self, devices: Iterable[DeviceRef]) -> Sequence[Any]: ...


def distribute_value(v: TensorValue, devices: Sequence[DeviceRef]) -> list[TensorValue]:
    """``v`` on every device of ``devices`` (one value per device)."""
    return [on_device(v, d) for d in devices]


def forward_sharded_layers(layers: Sequence[Callable[[TensorValue], TensorValue]],
                           xs: Sequence[TensorValue]) -> list[TensorValue]:
    """``[layers[i](xs[i]) for each i]``: each shard of a layer on its device's input.

    AssertionError when ``layers`` and ``xs`` differ in length."""
    if len(layers) != len(xs):
        raise AssertionError(f"forward_sharded_layers: {len(layers)} layers but {len(xs)} inputs")
    return [layer(x) for layer, x in zip(layers, xs)]


def take(it: Iterable[_T], n: int) -> list[_T]:
    """The next ``n`` items of ``it`` (fewer when it runs out first); an iterator advances past them."""
    iterator: Iterator[_T] = iter(it)
    out: list[_T] = []
    for _ in range(n):
        try:
            out.append(next(iterator))
        except StopIteration:
            break
    return out


def _shards_of(layer: Any, devices: Sequence[DeviceRef], default: Any, cache_name: str) -> list[Any]:
    """``layer.shard(devices)`` (under ``default(n)`` when it has no strategy yet), made once per device
    list and kept on the layer."""
    devs = list(devices)
    cache = layer.__dict__.setdefault(cache_name, {})
    key = tuple(devs)
    if key not in cache:
        if getattr(layer, "sharding_strategy", None) is None:
            layer.sharding_strategy = default(len(devs))
        cache[key] = list(layer.shard(devs))
    return cache[key]


def replicate_on(layer: Any, devices: Sequence[DeviceRef]) -> list[Any]:
    """Per-device copies of a layer whose weights are replicated (a norm): its ``shard`` under a
    replicate strategy (the weights bind once per device from the same checkpoint tensor)."""
    return _shards_of(layer, devices, ShardingStrategy.replicate, "_max_nn_replicas")


class DistributedTransformerBlock(Module):
    """``h = x + attention(norm(x)); out = h + allreduce(mlp shards(norm(h)))`` on every device.

    ``attention`` is a distributed attention (e.g. :class:`~max.nn.attention.DistributedAttentionWithRope`)
    called as ``attention(layer_idx, xs, signal_buffers, kv_collections, freqs_cis, input_row_offsets)``
    and returning the all-reduced output per device; ``mlp`` is shardable (``max.nn.MLP``: gate/up split
    by rows, down by columns); the norms are replicated.
    """

    def __init__(self, attention: Any, mlp: Any, attention_norm: Any, mlp_norm: Any, devices: Sequence[DeviceRef],
                 distributed_gemm_config: Any = None, residual_multiplier: float = 1.0) -> None:
        super().__init__()
        self.self_attn = attention
        self.mlp = mlp
        self.input_layernorm = attention_norm
        self.post_attention_layernorm = mlp_norm
        self.devices = list(devices)
        self.distributed_gemm_config = distributed_gemm_config
        self.residual_multiplier = residual_multiplier

    def __call__(self, layer_idx: Any, xs: Sequence[TensorValue], signal_buffers: Any, kv_collections: Sequence[Any],
                 freqs_cis: Any, input_row_offsets: Sequence[TensorValue]) -> list[TensorValue]:
        devs = self.devices
        n1 = replicate_on(self.input_layernorm, devs)
        a = self.self_attn(layer_idx, [n(x) for n, x in zip(n1, xs)], signal_buffers, kv_collections, freqs_cis,
                           input_row_offsets)
        if self.residual_multiplier != 1.0:
            a = [v * self.residual_multiplier for v in a]
        h = [x + v for x, v in zip(xs, a)]
        n2 = replicate_on(self.post_attention_layernorm, devs)
        m = mlp_shards_call(self.mlp, [n(v) for n, v in zip(n2, h)], devs, signal_buffers)
        if self.residual_multiplier != 1.0:
            m = [v * self.residual_multiplier for v in m]
        return [v + w for v, w in zip(h, m)]


def mlp_shards_call(mlp: Any, xs: Sequence[TensorValue], devices: Sequence[DeviceRef],
                    signal_buffers: Any) -> list[TensorValue]:
    """A shardable MLP over per-device inputs: its tensor-parallel shards' partial outputs, all-reduced."""
    devs = list(devices)
    parts = [s(x) for s, x in zip(_shards_of(mlp, devs, ShardingStrategy.rowwise, "_max_nn_tp_shards"), xs)]
    return allreduce_parts(parts, devs, signal_buffers)


class DistributedTransformer(Transformer):
    """Embedding -> distributed blocks -> norm -> output projection over ``devices``; float32 logits.

    ``__call__(tokens, signal_buffers, kv_cache_inputs_per_dev, return_n_logits, input_row_offsets)``:
    ``tokens`` int64 ``[total_seq_len]`` and ``input_row_offsets`` ``[batch + 1]`` (on the first device),
    one signal buffer per device, and per device the KV cache's four graph values (a flat list of
    ``4 * n_devices`` values, or one sequence per device).  Returns ``(logits,)`` on the first device
    like :class:`~max.nn.transformer.Transformer` (``ALL``: ``(logits, offsets)``).

    ``embedding`` is a :class:`~max.nn.VocabParallelEmbedding` or a plain ``Embedding`` (split by rows
    here); ``output`` a :class:`~max.nn.ColumnParallelLinear` or a plain ``Linear`` (split by rows; a
    ``Linear`` subclass whose class sets ``tensor_parallel_ok = True`` too, else it runs on the first
    device);
    ``norm`` is replicated.  ``use_subgraphs`` is accepted and ignored (the layers are inlined).  A
    :class:`~max.nn.transformer.Transformer` with the same attributes, plus ``devices``.
    """

    def __init__(self, dim: int, n_heads: int, layers: Sequence[Any], norm: Any, output: Any, embedding: Any,
                 kv_params: Any, kv_collection_constructor: Any, devices: Sequence[DeviceRef], rope: Any,
                 return_logits: ReturnLogits = ReturnLogits.LAST_TOKEN, use_subgraphs: bool = False,
                 subgraph_layer_groups: Any = None, logits_scaling: float = 1.0, embedding_multiplier: float = 1.0,
                 logits_postprocessor: Any = None) -> None:
        devs = [DeviceRef.from_device(d) for d in devices]
        if len(devs) < 1:
            raise ValueError("DistributedTransformer: devices must not be empty")
        if len(set(devs)) != len(devs):
            raise ValueError(f"DistributedTransformer: devices must be distinct, got {[str(d) for d in devs]}")
        super().__init__(dim, n_heads, layers, norm, output, embedding, kv_params, kv_collection_constructor, rope,
                         return_logits=return_logits, embedding_multiplier=embedding_multiplier,
                         logits_scaling=logits_scaling, logits_postprocessor=logits_postprocessor)
        self.devices = devs
        self.use_subgraphs = use_subgraphs

    def _vocab(self) -> int:
        return int(self.embed_tokens.weight.shape[0])

    def _embed(self, tokens: TensorValue, signal_buffers: Any) -> list[TensorValue]:
        devs = self.devices
        emb = self.embed_tokens
        if self._vocab() % len(devs) == 0 and emb.quantization_encoding is None:
            hs = vocab_parallel_lookup(emb, tokens, devs, signal_buffers)
            widen = getattr(emb, "compute_dtype", None)  # a table stored narrower than the activations
            return [h.cast(widen) for h in hs] if widen is not None else hs
        if hasattr(emb, "devices"):  # a VocabParallelEmbedding checks the split itself
            return emb(tokens, signal_buffers)
        return distribute_value(emb(on_device(tokens, devs[0])), devs)

    def _head(self, hs: Sequence[TensorValue], signal_buffers: Any) -> TensorValue:
        devs = self.devices
        out = self.lm_head
        if isinstance(out, ColumnParallelLinear):
            return out(list(hs), signal_buffers)[0]
        splittable = type(out) is Linear or getattr(type(out), "tensor_parallel_ok", False)
        if isinstance(out, Linear) and splittable and out.quantization_encoding is None \
                and out.out_dim % len(devs) == 0:
            cache = self.__dict__.setdefault("_max_nn_head_shards", {})
            if "s" not in cache:
                if out.sharding_strategy is None:
                    out.sharding_strategy = ShardingStrategy.rowwise(len(devs))
                cache["s"] = out.shard(devs)
            parts = [lin(h) for lin, h in zip(cache["s"], hs)]
            if signal_buffers is not None:
                return ops.allgather(parts, signal_buffers, axis=-1)[0]
            return ops.concat([on_device(p, devs[0]) for p in parts], axis=-1)
        return out(hs[0])

    def __call__(self, tokens: Any, signal_buffers: Any, kv_cache_inputs_per_dev: Sequence[Any], return_n_logits: Any,
                 input_row_offsets: Any) -> tuple:
        devs = self.devices
        n = len(devs)
        tokens = tokens.tensor if hasattr(tokens, "tensor") else tokens
        offsets = input_row_offsets.tensor if hasattr(input_row_offsets, "tensor") else input_row_offsets
        sigs = list(signal_buffers) if signal_buffers is not None else None
        kv_in = list(kv_cache_inputs_per_dev)
        if len(kv_in) == n and all(isinstance(k, (list, tuple)) for k in kv_in):
            per_dev = [list(k) for k in kv_in]
        elif kv_in and len(kv_in) % n == 0:
            k = len(kv_in) // n
            per_dev = [kv_in[i * k:(i + 1) * k] for i in range(n)]
        else:
            raise ValueError(f"DistributedTransformer: {len(kv_in)} KV-cache inputs do not split over {n} devices")
        kvs = [self.kv_collection_constructor(*k) for k in per_dev]
        hs = self._embed(tokens, sigs)
        if self.embedding_multiplier != 1.0:
            hs = [h * self.embedding_multiplier for h in hs]
        offs = distribute_value(offsets, devs)
        freqs = distribute_value(self.rope.freqs_cis, devs) if self.rope is not None else [None] * n
        for i, layer in enumerate(self.layers):
            idx = [ops.constant(i, DType.uint32, d) for d in devs]
            hs = layer(idx, hs, sigs, kvs, freqs, offs)
        norms = replicate_on(self.norm, devs)
        if self.return_logits is ReturnLogits.LAST_TOKEN:
            last = [o.cast(DType.int64)[1:] - 1 for o in offs]
            hs = [ops.gather(h, l, axis=0) for h, l in zip(hs, last)]
        elif self.return_logits is not ReturnLogits.ALL:
            raise NotImplementedError("DistributedTransformer: ReturnLogits.VARIABLE is not supported yet")
        logits = finish_logits(self._head([nm(h) for nm, h in zip(norms, hs)], sigs), self.logits_scaling,
                               self.logits_postprocessor)
        if self.return_logits is ReturnLogits.ALL:
            return (logits, offsets)
        return (logits,)
