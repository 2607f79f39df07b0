"""The shared decoder: attention over the paged KV cache, gated MLP, decoder layer, and the
builder that assembles them from a :class:`DecoderConfig`.

Every projection and embedding comes from the :class:`WeightFactory` under its module path, so the
modules here never decide how a checkpoint weight is represented.  Module attribute names are the
Hugging Face names (after ``model.`` is dropped), so safetensors checkpoints need no renaming.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from max.dtype import DType
from max.graph import DeviceRef, TensorValue, Weight, ops
from max.nn import kernels
from max.nn.kernels import MHAMaskVariant
from max.nn.kernels_decoder import ragged_attention, ragged_rope, ragged_rope_tables, ragged_write_plan
from max.nn.kv_cache import FetchPagedKVCacheCollection, KVCacheParams
from max.graph.weight import ShardingStrategy
from max.nn.layer import LayerList, Module, on_device
from max.nn.linear import Linear, allreduce_parts
from max.nn.norm import RMSNorm
from max.nn.rotary_embedding import RotaryEmbedding, rope_from_hf
from max.nn.transformer import DistributedTransformer, ReturnLogits, Transformer
from max.nn.transformer.distributed_transformer import mlp_shards_call, replicate_on
from max.pipelines.architectures.common.config import DecoderConfig
from max.pipelines.architectures.common.weights import WeightFactory

__all__ = ["DecoderAttention", "DecoderLayer", "DistributedDecoderLayer", "check_tensor_parallel", "GatedMLP",
           "build_decoder", "longrope_switch_contexts", "make_rope", "rms_norm"]

_ACTS: dict[str, Callable[[TensorValue], TensorValue]] = {
    "silu": ops.silu,
    "swish": ops.silu,
    "gelu": lambda x: ops.gelu(x),
    "gelu_pytorch_tanh": lambda x: ops.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: ops.gelu(x, approximate="tanh"),
    "gelu_tanh": lambda x: ops.gelu(x, approximate="tanh"),
    "relu": ops.relu,
}


def activation(name: str, who: str) -> Callable[[TensorValue], TensorValue]:
    if name not in _ACTS:
        raise NotImplementedError(f"{who}: hidden activation {name!r} is not supported (supported: {sorted(_ACTS)})")
    return _ACTS[name]


class PlainLayerNorm(Module):
    """LayerNorm without weight or bias, computed in float32 (OLMo's norms)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps

    def __call__(self, x: TensorValue) -> TensorValue:
        one = ops.broadcast_to(ops.constant(1.0, DType.float32, x.device), [self.dim])
        zero = ops.broadcast_to(ops.constant(0.0, DType.float32, x.device), [self.dim])
        return ops.layer_norm(x.cast(DType.float32), one, zero, self.eps).cast(x.dtype)


def rms_norm(cfg: DecoderConfig, dim: int, dtype: DType) -> Module:
    """The config's norm of ``dim`` features: RMSNorm, or weightless LayerNorm (``norm_kind``)."""
    if cfg.norm_kind == "layernorm":
        return PlainLayerNorm(dim)
    if cfg.norm_kind != "rms":
        raise ValueError(f"{cfg.architecture}: norm_kind must be 'rms' or 'layernorm', got {cfg.norm_kind!r}")
    return RMSNorm(dim, dtype, cfg.rms_norm_eps, weight_offset=cfg.norm_weight_offset,
                   multiply_before_cast=cfg.norm_multiply_before_cast)


class _Rope:
    """A RoPE table plus the layout of the rotated dims (what attention needs to rotate q and k)."""

    per_sequence = False
    """True: the table depends on each sequence's length (:class:`_LengthSwitchedRope`)."""

    def __init__(self, table: RotaryEmbedding, interleaved: bool) -> None:
        self.table = table
        self.interleaved = interleaved

    def tables(self, positions: TensorValue) -> tuple[TensorValue, TensorValue]:
        return ragged_rope_tables(self.table.freqs_cis, positions)


class _LengthSwitchedRope(_Rope):
    """LongRoPE whose factors follow each sequence's own length, as transformers chooses them: a
    request whose length after this step (its last position + 1) exceeds ``original`` is rotated with
    the long factors, any other with the short ones -- per request, so one batch mixes both.

    Used when the model may run sequences longer than ``original`` (below that every sequence is
    short and the plain table of the short factors serves).  A request that crosses ``original``
    must have its earlier keys recomputed with the long factors (transformers drops its cache at that
    point): :func:`longrope_switch_contexts` arranges it before the KV cache is fetched."""

    per_sequence = True

    def __init__(self, short: RotaryEmbedding, long: RotaryEmbedding, original: int, interleaved: bool) -> None:
        super().__init__(short, interleaved)
        self.long = long
        self.original = original
        self._cache: dict = {}

    def rotate_qkv(self, qkv: TensorValue, H: int, Hkv: int, D: int, input_row_offsets: TensorValue,
                   kv_collection: Any, device: DeviceRef) -> TensorValue:
        """``qkv`` with the first rotary dims of each q and k head rotated by its request's factors."""
        cos, sin = self._cos_sin(input_row_offsets, kv_collection)
        cos, sin = on_device(cos, device), on_device(sin, device)
        T = qkv.shape[0]
        q = ops.reshape(qkv[:, : H * D], [T, H, D])
        k = ops.reshape(qkv[:, H * D:(H + Hkv) * D], [T, Hkv, D])
        q = ragged_rope(q, cos, sin, self.interleaved)
        k = ragged_rope(k, cos, sin, self.interleaved)
        return ops.concat([ops.reshape(q, [T, H * D]), ops.reshape(k, [T, Hkv * D]), qkv[:, (H + Hkv) * D:]],
                          axis=-1)

    def _cos_sin(self, input_row_offsets: TensorValue, kv_collection: Any) -> tuple[TensorValue, TensorValue]:
        """Each token's (cos, sin) from the short table or, for a request longer than ``original``, the
        long one (once per graph: every layer shares them)."""
        from max.graph import Graph

        g = Graph.current
        if self._cache.get("graph") is not g:
            positions, _, _ = ragged_write_plan(input_row_offsets, kv_collection)
            offs = input_row_offsets.cast(DType.int64)
            ends = offs[1:]
            last = ops.gather(positions, ends - 1, axis=0)  # [batch]: each request's last position
            index = ops.cumsum(positions * 0 + 1, axis=0, exclusive=True)  # [T]: 0, 1, ...
            request = ops.sum(ops.greater_equal(ops.unsqueeze(index, 1), ops.unsqueeze(ends, 0)).cast(DType.int64),
                              axis=1)
            length = ops.gather(last, ops.reshape(request, [-1]), axis=0) + 1
            short = self.table.freqs_cis
            rows = int(short.shape[0])
            table = ops.concat([short, self.long.freqs_cis], axis=0)
            pos = positions + ops.greater(length, self.original).cast(DType.int64) * rows
            self._cache = {"graph": g, "cos_sin": ragged_rope_tables(table, pos)}
        return self._cache["cos_sin"]


def longrope_switch_contexts(ctxs: Any, original: int) -> None:
    """Before the KV cache is fetched for a step of a model whose LongRoPE follows each sequence's
    length (:class:`_LengthSwitchedRope`): a request whose length at the end of this step is on the
    other side of ``original`` than when its cached keys were computed is recomputed from its first
    token (``start_idx`` back to 0: the cache drops its pages), as transformers does; its prefix-cache
    salt names the factors, so cached pages are shared only between requests of the same factors."""
    for c in ctxs:
        long = int(c.active_idx) > original
        salt = str(getattr(c, "cache_salt", None) or "").replace("|longrope-long", "")
        c.cache_salt = (salt + "|longrope-long" if long else salt) or None
        before = getattr(c, "_longrope_long", None)
        if before is not None and before != long and int(c.start_idx) > 0:
            c.set_token_indices(start_idx=0)
        c._longrope_long = long


def make_rope(cfg: DecoderConfig, max_seq_len: int, device: DeviceRef, theta: float | None = None,
              scaling: dict | None | bool = True) -> _Rope:
    """The RoPE of ``cfg`` (``theta``/``scaling`` override the base and the scaling; ``scaling=False``:
    unscaled).  Raises NotImplementedError naming the architecture for an unsupported scaling."""
    rot = int(cfg.head_dim * cfg.partial_rotary_factor)
    rot -= rot % 2
    th = cfg.rope_theta if theta is None else theta
    sc = cfg.rope_scaling if scaling is True else (scaling or None)
    common = dict(dim=cfg.num_attention_heads * cfg.head_dim, n_heads=cfg.num_attention_heads, theta=th,
                  max_seq_len=max_seq_len, device=device, head_dim=rot, interleaved=cfg.interleaved_rope)
    kind = (sc or {}).get("rope_type") or (sc or {}).get("type") or "default"
    try:
        if kind == "longrope" and max_seq_len > int(sc["original_max_position_embeddings"]):
            # sequences on both sides of the original context: factors chosen per sequence
            short, long = (rope_from_hf(sc, max_position_embeddings=cfg.max_position_embeddings,
                                        longrope_factors=f, **common) for f in ("short", "long"))
            return _LengthSwitchedRope(short, long, int(sc["original_max_position_embeddings"]), cfg.interleaved_rope)
        table = rope_from_hf(sc, max_position_embeddings=cfg.max_position_embeddings,
                             longrope_factors="short" if kind == "longrope" else None, **common)
    except NotImplementedError as e:
        raise NotImplementedError(f"{cfg.architecture}: {e}") from None
    except ValueError as e:  # e.g. LongRoPE factors of the wrong length
        raise ValueError(f"{cfg.architecture}: {e}") from None
    return _Rope(table, cfg.interleaved_rope)


class DecoderAttention(Module):
    """Self-attention of one layer over the paged KV cache.

    q/k/v come from the factory's projections (one fused matmul where the factory can fuse them,
    or the checkpoint's own ``qkv_proj``); optional q/k RMSNorm (over the whole projections here, per
    head inside the next kernel), then ``max.nn.kernels.ragged_qkv_store`` (per-head norm, RoPE on the
    first rotary dims, K/V written to the cache), causal (optionally sliding-window) attention over
    each request's cached positions (``ragged_attention`` when the layer has sinks or soft-capping),
    and ``o_proj``.
    """

    def __init__(self, cfg: DecoderConfig, layer: int, factory: WeightFactory, kv_params: KVCacheParams,
                 rope: _Rope | None, window: int | None = None, scale: float | None = None) -> None:
        super().__init__()
        p = f"layers.{layer}.self_attn"
        H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = H, Hkv, D
        self.kv_params = kv_params
        self.layer = layer
        self.rope = rope
        self.window = window
        self.scale = scale if scale is not None else (cfg.attention_scale or 1.0 / math.sqrt(D))
        hidden = cfg.hidden_size
        if cfg.fused_qkv:
            self.qkv_proj = factory.linear(f"{p}.qkv_proj", hidden, (H + 2 * Hkv) * D, cfg.attention_bias)
            qkv: Callable[[TensorValue], TensorValue] = self.qkv_proj
        else:
            self.q_proj = factory.linear(f"{p}.q_proj", hidden, H * D, cfg.attention_bias)
            self.k_proj = factory.linear(f"{p}.k_proj", hidden, Hkv * D, cfg.attention_bias)
            self.v_proj = factory.linear(f"{p}.v_proj", hidden, Hkv * D, cfg.attention_bias)
            qkv = factory.fuse([self.q_proj, self.k_proj, self.v_proj])
        object.__setattr__(self, "_qkv", qkv)  # a function, not a sub-module
        self.o_proj = factory.linear(f"{p}.o_proj", H * D, hidden, cfg.o_proj_bias)
        self.clip_qkv = cfg.clip_qkv
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm == "head":
            self.q_norm = rms_norm(cfg, D, factory.dtype)
            self.k_norm = rms_norm(cfg, D, factory.dtype)
        elif cfg.qk_norm == "full":
            self.q_norm = rms_norm(cfg, H * D, factory.dtype)
            self.k_norm = rms_norm(cfg, Hkv * D, factory.dtype)
        elif cfg.qk_norm is not None:
            raise ValueError(f"{cfg.architecture}: qk_norm must be 'head', 'full' or None, got {cfg.qk_norm!r}")
        self.softcap = cfg.attn_logit_softcapping
        self.sinks = Weight("sinks", factory.dtype, [H], factory.device) if cfg.attention_sinks else None
        self.chunk: int | None = None
        """Chunked local attention (Llama 4's RoPE layers): keys of the query's own chunk of ``chunk``
        positions only (``flash_attention_ragged``'s ``CHUNKED_CAUSAL_MASK``; ``ragged_attention`` when
        combined with a sliding window, sinks, soft-capping or block groups)."""
        self.block_groups: TensorValue | None = None
        """Set while a graph is built: an int64 ``[total_seq_len]`` block id per token (-1: none); tokens of
        one block attend to each other both ways (Gemma 3's image tokens), see ``ragged_attention``."""

    def __call__(self, layer_idx: Any, x: TensorValue, kv_collection: Any, freqs_cis: Any,
                 input_row_offsets: TensorValue) -> TensorValue:
        qkv = self._qkv(x)
        if self.clip_qkv is not None:
            c = ops.constant(self.clip_qkv, qkv.dtype, qkv.device)
            qkv = ops.min(ops.max(qkv, -c), c)
        attn = self._attend(layer_idx, x, qkv, kv_collection, input_row_offsets, self.n_heads,
                            self.n_kv_heads, self.sinks, x.device)
        return self.o_proj(ops.reshape(attn, [x.shape[0], self.n_heads * self.head_dim]))

    def _attend(self, layer_idx: Any, x: TensorValue, qkv: TensorValue, kv_collection: Any,
                input_row_offsets: TensorValue, H: int, Hkv: int, sinks: Any, device: DeviceRef) -> TensorValue:
        """Attention of ``H`` query heads over ``Hkv`` KV heads (all of them, or one device's share):
        ``[total_seq_len, H, head_dim]``."""
        D = self.head_dim
        if self.qk_norm == "full":  # over the whole projection: before the per-head split
            q, k, v = qkv[:, : H * D], qkv[:, H * D:(H + Hkv) * D], qkv[:, (H + Hkv) * D:]
            qkv = ops.concat([self.q_norm(q), self.k_norm(k), v], axis=-1)
        q_norm = k_norm = None
        eps = 1e-6
        if self.qk_norm == "head":
            q_norm, k_norm, eps = _gamma(self.q_norm), _gamma(self.k_norm), self.q_norm.eps
            q_norm, k_norm = on_device(q_norm, device), on_device(k_norm, device)
        freqs = on_device(self.rope.table.freqs_cis, device) if self.rope is not None else None
        if self.rope is not None and self.rope.per_sequence:  # each request's own table: rotate here
            if q_norm is not None:
                raise NotImplementedError(f"layer {self.layer}: per-head q/k norms with length-switched LongRoPE")
            qkv = self.rope.rotate_qkv(qkv, H, Hkv, D, input_row_offsets, kv_collection, device)
            freqs = None
        # split, per-head QK-norm, RoPE (on the table's first dims of each head) and the K/V write: one op
        q = kernels.ragged_qkv_store(self.kv_params, qkv, input_row_offsets, kv_collection, self.layer, H,
                                     freqs_cis=freqs,
                                     interleaved=self.rope.interleaved if freqs is not None else False,
                                     q_norm=q_norm, k_norm=k_norm, norm_eps=eps)
        if (sinks is not None or self.softcap or self.block_groups is not None
                or (self.chunk and self.window)):
            return ragged_attention(self.kv_params, q, input_row_offsets, kv_collection, layer_idx, self.scale,
                                    self.window, sinks=sinks, softcap=self.softcap, groups=self.block_groups,
                                    chunk=self.chunk)
        if self.chunk:
            variant, local = MHAMaskVariant.CHUNKED_CAUSAL_MASK, self.chunk
        elif self.window:
            variant, local = MHAMaskVariant.SLIDING_WINDOW_CAUSAL_MASK, self.window
        else:
            variant, local = MHAMaskVariant.CAUSAL_MASK, -1
        return kernels.flash_attention_ragged(self.kv_params, q, input_row_offsets, kv_collection, layer_idx,
                                              variant, self.scale, local_window_size=local)

    def _tp_shards(self, devices: list[DeviceRef]) -> list[tuple]:
        """Per device: its q/k/v projections (rows of its heads), its slice of ``o_proj``'s columns and
        of the sinks."""
        key = tuple(devices)
        cache = self.__dict__.setdefault("_tp_cache", {})
        if key not in cache:
            n = len(devices)
            if self.qk_norm == "full":
                raise NotImplementedError(f"layer {self.layer}: tensor parallelism with a q/k norm over the whole "
                                          "projection (OLMo 2 style) is not supported")
            if not hasattr(self, "q_proj"):
                raise NotImplementedError(f"layer {self.layer}: tensor parallelism needs separate q/k/v "
                                          "projections (this checkpoint stores one fused qkv_proj)")
            lins = (self.q_proj, self.k_proj, self.v_proj)
            for lin in lins:
                lin.sharding_strategy = ShardingStrategy.rowwise(n)
            self.o_proj.sharding_strategy = ShardingStrategy.columnwise(n)
            qs, ks, vs = (tp_linear(lin).shard(devices) for lin in lins)
            os_ = tp_linear(self.o_proj).shard(devices)
            sinks: list[Any] = [None] * n
            if self.sinks is not None:
                self.sinks.sharding_strategy = ShardingStrategy.rowwise(n)
                sinks = self.sinks.shard(devices)
            cache[key] = list(zip(qs, ks, vs, os_, sinks))
        return cache[key]

    def tp_call(self, layer_idx: list, xs: list[TensorValue], kv_collections: list, input_row_offsets: list,
                signal_buffers: Any) -> list[TensorValue]:
        """Tensor-parallel attention: each device's heads (and its KV-cache heads), partial ``o_proj``
        outputs all-reduced; the result on every device."""
        devices = [x.device for x in xs]
        n = len(devices)
        H, Hkv, D = self.n_heads // n, self.n_kv_heads // n, self.head_dim
        parts = []
        for i, (q, k, v, o, sinks) in enumerate(self._tp_shards(devices)):
            x = xs[i]
            qkv = ops.concat([q(x), k(x), v(x)], axis=-1)
            attn = self._attend(layer_idx[i], x, qkv, kv_collections[i], input_row_offsets[i], H, Hkv, sinks,
                                devices[i])
            parts.append(o(ops.reshape(attn, [x.shape[0], H * D])))
        return allreduce_parts(parts, devices, signal_buffers)


def tp_linear(lin: Any) -> Linear:
    """``lin`` when it is a float ``Linear`` (plain, or half-precision storage widened on use: what
    tensor parallelism splits), else a clear error."""
    ok = type(lin) is Linear or getattr(type(lin), "tensor_parallel_ok", False)
    if not ok or lin.quantization_encoding is not None or lin.float8_config is not None:
        enc = getattr(lin, "quantization_encoding", None)
        raise NotImplementedError(
            f"tensor parallelism splits float weights only; {lin.weight.name} is "
            f"{type(lin).__name__}{f' ({enc})' if enc else ''} (load float weights, e.g. --quantization-encoding "
            "float32/bfloat16, without LoRA, to run on several devices)")
    return lin


def _gamma(norm: RMSNorm) -> TensorValue:
    """An RMSNorm's effective weight (``weight + weight_offset``) as the per-head norms of ragged_qkv_store
    take it."""
    w: TensorValue = norm.weight
    return w + norm.weight_offset if norm.weight_offset else w


class GatedMLP(Module):
    """``down_proj(act(gate_proj(x)) * up_proj(x))``; ``fused``: the checkpoint's ``gate_up_proj``
    holds gate then up."""

    def __init__(self, prefix: str, factory: WeightFactory, hidden: int, inter: int, act: str, fused: bool = False,
                 has_bias: bool = False, who: str = "GatedMLP") -> None:
        super().__init__()
        self.inter = inter
        self.fused = fused
        object.__setattr__(self, "_act", activation(act, who))
        if fused:
            self.gate_up_proj = factory.linear(f"{prefix}.gate_up_proj", hidden, 2 * inter, has_bias)
        else:
            self.gate_proj = factory.linear(f"{prefix}.gate_proj", hidden, inter, has_bias)
            self.up_proj = factory.linear(f"{prefix}.up_proj", hidden, inter, has_bias)
        self.down_proj = factory.linear(f"{prefix}.down_proj", inter, hidden, has_bias)

    def __call__(self, x: TensorValue) -> TensorValue:
        if self.fused:
            gu = self.gate_up_proj(x)
            return self.down_proj(self._act(gu[..., : self.inter]) * gu[..., self.inter:])
        return self.down_proj(self._act(self.gate_proj(x)) * self.up_proj(x))

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        return self.__dict__.get("_tp_strategy")

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        """Tensor parallel: gate/up split by rows (intermediate features), down by columns."""
        if self.fused:
            raise NotImplementedError(f"{self.down_proj.weight.name}: tensor parallelism needs separate gate/up "
                                      "projections (this checkpoint stores one fused gate_up_proj)")
        n = strategy.num_devices
        if self.inter % n:
            raise ValueError(f"intermediate_size {self.inter} does not split evenly across {n} devices")
        self.gate_proj.sharding_strategy = ShardingStrategy.rowwise(n)
        self.up_proj.sharding_strategy = ShardingStrategy.rowwise(n)
        self.down_proj.sharding_strategy = ShardingStrategy.columnwise(n)
        self.__dict__["_tp_strategy"] = strategy

    def shard(self, devices: list[DeviceRef]) -> list[Callable[[TensorValue], TensorValue]]:
        """Per device, its share of the intermediate features; the shards' outputs sum to the output."""
        gs, us, ds = (tp_linear(lin).shard(devices) for lin in (self.gate_proj, self.up_proj, self.down_proj))
        act = self._act
        return [lambda x, g=g, u=u, d=d: d(act(g(x)) * u(x)) for g, u, d in zip(gs, us, ds)]


class DecoderLayer(Module):
    """One decoder layer with the norms of ``cfg.norms`` (pre/post attention, pre/post MLP), residuals
    scaled by ``cfg.residual_multiplier``."""

    def __init__(self, cfg: DecoderConfig, attention: Module, mlp: Module, dtype: DType) -> None:
        super().__init__()
        self.self_attn = attention
        self.mlp = mlp
        self.residual_multiplier = cfg.residual_multiplier
        plan = cfg.norms
        self._norm_names = (plan.pre_attention, plan.post_attention, plan.pre_mlp, plan.post_mlp)
        for name in self._norm_names:
            if name is not None:
                setattr(self, name, rms_norm(cfg, cfg.hidden_size, dtype))

    def _norm(self, which: int, x: TensorValue) -> TensorValue:
        name = self._norm_names[which]
        return x if name is None else getattr(self, name)(x)

    post_layer: Callable[[TensorValue], TensorValue] | None = None
    """Set while a graph is built: applied to the layer's output (Qwen3-VL adds DeepStack visual features)."""

    def __call__(self, layer_idx: Any, x: TensorValue, kv_collection: Any, freqs_cis: Any,
                 input_row_offsets: TensorValue) -> TensorValue:
        a = self.self_attn(layer_idx, self._norm(0, x), kv_collection, freqs_cis, input_row_offsets)
        a = self._norm(1, a)
        if self.residual_multiplier != 1.0:
            a = a * self.residual_multiplier
        h = x + a
        m = self._norm(3, self.mlp(self._norm(2, h)))
        if self.residual_multiplier != 1.0:
            m = m * self.residual_multiplier
        return h + m if self.post_layer is None else self.post_layer(h + m)


class DistributedDecoderLayer(DecoderLayer):
    """:class:`DecoderLayer` split over devices (same weights and names): attention heads and MLP
    features divided, one all-reduce after each, norms and residuals replicated.  Called like a
    :class:`~max.nn.transformer.DistributedTransformerBlock`."""

    def __call__(self, layer_idx: Any, xs: Any, signal_buffers: Any, kv_collections: Any, freqs_cis: Any,
                 input_row_offsets: Any) -> list[TensorValue]:
        devs = [x.device for x in xs]
        norms = {name: replicate_on(getattr(self, name), devs) for name in self._norm_names if name is not None}

        def norm(which: int, vs: list[TensorValue]) -> list[TensorValue]:
            name = self._norm_names[which]
            return vs if name is None else [nm(v) for nm, v in zip(norms[name], vs)]

        a = self.self_attn.tp_call(layer_idx, norm(0, list(xs)), kv_collections, input_row_offsets, signal_buffers)
        a = norm(1, a)
        if self.residual_multiplier != 1.0:
            a = [v * self.residual_multiplier for v in a]
        h = [x + v for x, v in zip(xs, a)]
        if not hasattr(self.mlp, "shard"):
            raise NotImplementedError(f"tensor parallelism is not supported for {type(self.mlp).__name__} layers")
        m = norm(3, mlp_shards_call(self.mlp, norm(2, h), devs, signal_buffers))
        if self.residual_multiplier != 1.0:
            m = [v * self.residual_multiplier for v in m]
        return [v + w for v, w in zip(h, m)]


def check_tensor_parallel(cfg: DecoderConfig, n: int, custom_attention: bool = False,
                          custom_mlp: bool = False) -> None:
    """Raise a clear error unless ``cfg`` splits over ``n`` devices: attention and KV heads and the
    MLP's intermediate size divisible by ``n``, separate q/k/v and gate/up projections, no MoE, MLA or
    whole-projection q/k norm.  Cheap: call it before any model work."""
    if n <= 1:
        return
    who = cfg.architecture
    for what, v in (("num_attention_heads", cfg.num_attention_heads), ("num_key_value_heads", cfg.num_key_value_heads),
                    ("intermediate_size", cfg.intermediate_size)):
        if v % n:
            raise ValueError(f"{who}: {what} = {v} does not split evenly across {n} devices; use a device count "
                             f"that divides it (tensor parallelism splits attention heads, KV-cache heads and "
                             f"MLP features across the devices)")
    if cfg.moe is not None:
        raise NotImplementedError(f"{who}: tensor parallelism for mixture-of-experts layers is not supported yet")
    if custom_attention or custom_mlp:
        raise NotImplementedError(f"{who}: tensor parallelism is not supported for this architecture's "
                                  "custom attention/MLP layers")
    if cfg.fused_qkv or cfg.fused_gate_up:
        raise NotImplementedError(f"{who}: tensor parallelism needs separate q/k/v and gate/up projections "
                                  "(this checkpoint stores fused ones)")
    if cfg.qk_norm == "full":
        raise NotImplementedError(f"{who}: tensor parallelism with a q/k norm over the whole projection is not "
                                  "supported")
    if cfg.clip_qkv is not None or cfg.norm_kind != "rms":
        raise NotImplementedError(f"{who}: tensor parallelism with clamped q/k/v or weightless LayerNorms (OLMo) is "
                                  "not supported")


def _softcap(cap: float) -> Callable[[TensorValue], TensorValue]:
    return lambda logits: ops.tanh(logits / cap) * cap


MlpBuilder = Callable[[DecoderConfig, int, WeightFactory], Module]
AttentionBuilder = Callable[[DecoderConfig, int, WeightFactory, KVCacheParams, int], Module]
LayerBuilder = Callable[[DecoderConfig, int, Module, Module, DType], Module]


def default_mlp(cfg: DecoderConfig, layer: int, factory: WeightFactory) -> Module:
    """The layer's gated MLP, or its mixture of experts when ``cfg.moe`` says so."""
    if cfg.moe is not None and layer not in cfg.moe.dense_layers:
        from max.pipelines.architectures.common.moe import DecoderMoE

        return DecoderMoE(cfg, layer, factory)
    return GatedMLP(f"layers.{layer}.mlp", factory, cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act,
                    fused=cfg.fused_gate_up, has_bias=cfg.mlp_bias, who=cfg.architecture)


def build_decoder(cfg: DecoderConfig, factory: WeightFactory, kv_params: KVCacheParams, max_seq_len: int,
                  make_mlp: MlpBuilder | None = None, make_attention: AttentionBuilder | None = None,
                  return_logits: ReturnLogits = ReturnLogits.LAST_TOKEN, head: Module | None = None,
                  devices: list[DeviceRef] | None = None, make_layer: LayerBuilder | None = None,
                  transformer_cls: type[Transformer] = Transformer) -> Transformer | DistributedTransformer:
    """The whole decoder: embedding (scaled by ``embedding_multiplier``), layers, final norm, lm_head
    (tied to the embedding when ``tie_word_embeddings``), logits divided by ``logits_scaling`` and
    soft-capped by ``final_logit_softcapping``.

    Layers use ``cfg.layer_window(i)``; sliding-window layers use an unscaled RoPE of base
    ``cfg.local_rope_theta`` when it is set.  ``make_mlp`` / ``make_attention`` replace the gated MLP
    or the attention of each layer (MoE, MLA ...), ``make_layer(cfg, i, attention, mlp, dtype)`` the
    :class:`DecoderLayer` around them (Gemma 4's scaled layers), ``transformer_cls`` the
    :class:`~max.nn.transformer.Transformer` subclass holding them (one device).  ``head`` replaces
    ``lm_head`` (an embedding model's pooling head: no vocabulary projection).

    With several ``devices`` (tensor parallelism; ``kv_params.n_devices`` of them) the same modules
    and weights are built on the first device and the graph splits them: a
    :class:`~max.nn.transformer.DistributedTransformer` of :class:`DistributedDecoderLayer` s.
    """
    tp = devices is not None and len(devices) > 1
    if tp:
        check_tensor_parallel(cfg, len(devices), custom_attention=make_attention is not None,
                              custom_mlp=make_mlp is not None or head is not None)
    device = factory.device
    rope = make_rope(cfg, max_seq_len, device)
    local_rope = make_rope(cfg, max_seq_len, device, theta=cfg.local_rope_theta, scaling=False) \
        if cfg.local_rope_theta is not None else rope
    layers = []
    for i in range(cfg.num_hidden_layers):
        window = cfg.layer_window(i)
        if make_attention is not None:
            attn = make_attention(cfg, i, factory, kv_params, max_seq_len)
        else:
            layer_rope = None if i in cfg.no_rope_layers else (local_rope if window else rope)
            attn = DecoderAttention(cfg, i, factory, kv_params, layer_rope, window)
        mlp = (make_mlp or default_mlp)(cfg, i, factory)
        if make_layer is not None and not tp:
            layers.append(make_layer(cfg, i, attn, mlp, factory.dtype))
        else:
            layers.append((DistributedDecoderLayer if tp else DecoderLayer)(cfg, attn, mlp, factory.dtype))
    embedding = factory.embedding("embed_tokens", cfg.vocab_size, cfg.hidden_size)
    lm_head = head if head is not None else factory.linear(
        "lm_head", cfg.hidden_size, cfg.vocab_size, tied_to=embedding if cfg.tie_word_embeddings else None)
    common = dict(
        dim=cfg.hidden_size, n_heads=cfg.num_attention_heads, layers=layers,
        norm=rms_norm(cfg, cfg.hidden_size, factory.dtype), output=lm_head, embedding=embedding,
        kv_params=kv_params, kv_collection_constructor=FetchPagedKVCacheCollection(kv_params, cfg.num_hidden_layers),
        rope=rope.table, return_logits=return_logits, embedding_multiplier=cfg.embedding_multiplier,
        logits_scaling=cfg.logits_scaling,
        logits_postprocessor=_softcap(cfg.final_logit_softcapping) if cfg.final_logit_softcapping else None)
    model = DistributedTransformer(devices=devices, **common) if tp else transformer_cls(**common)
    factory.check_paths(model)
    return model


_ = LayerList
