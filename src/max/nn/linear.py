"""Linear layers and MLPs: ``Linear``, ``ColumnParallelLinear``, ``GPTQLinear``, ``MLP`` and the V1 forms.

``Linear`` computes ``y = x @ W.T + b`` with ``W`` of shape ``(out_dim, in_dim)``.
Quantised weights (GGML block encodings, and GPTQ rows with their ``QuantizationConfig``: see
``max.graph.quantization.gptq``) use ``ops.qmatmul``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from max.dtype import DType
from max.graph import DeviceRef, TensorValue, Weight, ops
from max.graph.quantization import QuantizationConfig, QuantizationEncoding
from max.graph.weight import ShardingStrategy
from max.nn.layer import Layer, Module, check_input, on_device

__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "allreduce_parts",
    "DistributedGemmConfig",
    "GPTQLinear",
    "GPTQLinearV1",
    "Linear",
    "LinearV1",
    "MLP",
    "MLPV1",
    "QLinearV1",
]

_ACTIVATIONS: dict[str, Callable[[TensorValue], TensorValue]] = {
    "silu": ops.silu,
    "gelu": lambda x: ops.gelu(x),
    "gelu_tanh": lambda x: ops.gelu(x, approximate="tanh"),
    "relu": ops.relu,
    "tanh": ops.tanh,
    "sigmoid": ops.sigmoid,
}


def _quantized_shape(encoding: QuantizationEncoding, rows: int, cols: int, what: str,
                     config: QuantizationConfig | None = None) -> list[int]:
    if encoding is QuantizationEncoding.GPTQ and config is not None:
        from max.graph.quantization.gptq import gptq_row_bytes

        g = int(config.group_size)
        if config.bits != 4 or cols % 32 or (g != -1 and (g <= 0 or g % 32 or cols % g)):
            raise ValueError(f"{what}: GPTQ needs 4-bit weights and in_dim ({cols}) a multiple of 32 and of "
                             f"group_size ({g}); got bits={config.bits}")
        return [rows, gptq_row_bytes(cols, g)]
    epb = encoding.elements_per_block
    if cols % epb:
        raise ValueError(
            f"{what}: in_dim {cols} is not a multiple of the {encoding} block size ({epb} elements)"
        )
    return [rows, cols // epb * encoding.block_size]


def _qmatmul(encoding: QuantizationEncoding, config: Any, x: TensorValue, w: Any, who: str) -> TensorValue:
    if encoding is QuantizationEncoding.GPTQ and config is None:
        raise ValueError(f"{who}: GPTQ weights need their quantization_config (bits, group_size)")
    qmatmul = getattr(ops, "qmatmul", None)
    if qmatmul is None:
        raise NotImplementedError(
            f"{who}: quantized ({encoding}) matmul needs ops.qmatmul, which this libremax build does not "
            "provide yet; load the weights as float (WeightData.astype) and use an unquantized layer"
        )
    return qmatmul(encoding, config, x, w)


class Linear(Module):
    """``y = x @ weight.T + bias`` (``weight`` is ``(out_dim, in_dim)``), weights named ``{name}.weight``/``.bias``."""

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        dtype: DType,
        device: DeviceRef,
        has_bias: bool = False,
        quantization_encoding: QuantizationEncoding | None = None,
        float8_config: Any = None,
        name: str | None = None,
        clip_weight: float | None = None,
    ) -> None:
        super().__init__()
        for arg, v in (("in_dim", in_dim), ("out_dim", out_dim)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"Linear: {arg} must be a positive int, got {v!r}")
        if not isinstance(dtype, DType):
            raise TypeError(f"Linear: dtype must be a DType, got {dtype!r}")
        self.in_dim = in_dim
        self.out_dim = out_dim
        self.device = device if device is not None else DeviceRef.CPU()
        self.quantization_encoding = quantization_encoding
        self.float8_config = float8_config
        self.clip_weight = clip_weight
        self._max_nn_dtype = dtype
        prefix = f"{name}." if name else ""
        if quantization_encoding is not None:
            shape = _quantized_shape(quantization_encoding, out_dim, in_dim, "Linear")
            self.weight = Weight(f"{prefix}weight", DType.uint8, shape, self.device,
                                 quantization_encoding=quantization_encoding)
        else:
            self.weight = Weight(f"{prefix}weight", dtype, [out_dim, in_dim], self.device)
        self.bias: Weight | None = None
        if has_bias:
            bias_dtype = dtype if quantization_encoding is None and not dtype.is_float8() else DType.float32
            self.bias = Weight(f"{prefix}bias", bias_dtype, [out_dim], self.device)
        self.input_scale: Weight | None = None
        self.weight_scale: Weight | None = None
        if float8_config is not None:
            ws_shape = [out_dim, 1] if _float8_rowwise(float8_config) else []
            self.weight_scale = Weight(f"{prefix}weight_scale", DType.float32, ws_shape, self.device)
            if _float8_static_input(float8_config):
                self.input_scale = Weight(f"{prefix}input_scale", DType.float32, [], self.device)

    # -- sharding -----------------------------------------------------------
    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        return self.weight.sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        if not isinstance(strategy, ShardingStrategy):
            raise TypeError(f"{self._layer_name}: sharding_strategy must be a ShardingStrategy, got {strategy!r}")
        self.weight.sharding_strategy = strategy
        if self.bias is not None:
            if strategy.axis == 0:
                self.bias.sharding_strategy = ShardingStrategy.rowwise(strategy.num_devices)
            else:
                self.bias.sharding_strategy = ShardingStrategy.replicate(strategy.num_devices)

    def shard(self, devices: Iterable[DeviceRef]) -> list["Linear"]:
        """One Linear per device holding its slice of ``weight``/``bias`` (set ``sharding_strategy`` first).

        Rowwise splits ``out_dim`` (outputs concatenate); columnwise splits
        ``in_dim`` (outputs are partial sums; only shard 0 adds the bias).
        """
        devs = list(devices)
        st = self.sharding_strategy
        if st is None:
            raise ValueError(f"{self._layer_name}.shard: set sharding_strategy before sharding")
        wshards = self.weight.shard(devs)
        bshards = self.bias.shard(devs) if self.bias is not None else [None] * len(devs)
        out = []
        for i, (dev, w, b) in enumerate(zip(devs, wshards, bshards)):
            lin = Linear.__new__(Linear)
            Module.__init__(lin)
            lin.in_dim = int(w.shape[1]) if self.quantization_encoding is None else self.in_dim
            lin.out_dim = int(w.shape[0])
            lin.device = dev
            lin.quantization_encoding = self.quantization_encoding
            lin.float8_config = self.float8_config
            lin.clip_weight = self.clip_weight
            lin._max_nn_dtype = self._max_nn_dtype
            lin.weight = w
            lin.bias = b if (st.axis != 1 or i == 0) else None
            lin.input_scale = None
            lin.weight_scale = None
            out.append(lin)
        return out

    # -- call -----------------------------------------------------------------
    def __call__(self, x: Any) -> TensorValue:
        want_dtype = self._max_nn_dtype
        x = check_input(self, x, min_rank=1, dtype=want_dtype if self.float8_config is None else None,
                        last_dim=self.in_dim)
        x = on_device(x, self.device)
        if self.quantization_encoding is not None:
            y = _qmatmul(self.quantization_encoding, None, x, self.weight, self._layer_name)
        else:
            w: TensorValue = self.weight
            if self.float8_config is not None:
                w = w.cast(x.dtype) * self.weight_scale.cast(x.dtype)  # type: ignore[union-attr]
            if self.clip_weight is not None:
                c = float(self.clip_weight)
                w = ops.min(ops.max(w, -c), c)
            y = x @ w.T
        if self.bias is not None:
            y = y + self.bias.cast(y.dtype)
        return y


def _float8_rowwise(cfg: Any) -> bool:
    spec = getattr(cfg, "weight_scale", None)
    gran = getattr(spec, "granularity", None) if spec is not None else None
    return str(getattr(gran, "value", gran)).lower() in ("rowwise", "colwise")


def _float8_static_input(cfg: Any) -> bool:
    spec = getattr(cfg, "input_scale", None)
    return bool(getattr(spec, "is_static", False)) if spec is not None else False


class ColumnParallelLinear(Linear):
    """A Linear whose weight/bias rows are split across ``devices``; outputs are all-gathered.

    Call it with one input per device (or one input, copied to each device);
    it returns ``y = x @ W.T + b`` on every device.
    """

    def __init__(self, in_dim: int, out_dim: int, dtype: DType, devices: Sequence[DeviceRef],
                 tied_weight: Weight | None = None, **kwargs: Any) -> None:
        devs = list(devices)
        if not devs:
            raise ValueError("ColumnParallelLinear: devices must not be empty")
        super().__init__(in_dim, out_dim, dtype, devs[0], **kwargs)
        self.devices = devs
        if tied_weight is not None:
            if list(tied_weight.shape) != list(self.weight.shape) or tied_weight.dtype != self.weight.dtype:
                raise ValueError(
                    f"ColumnParallelLinear: tied_weight is {tied_weight.dtype}{list(tied_weight.shape)}, "
                    f"expected {self.weight.dtype}{list(self.weight.shape)}"
                )
            del self.weight
            self.set_shared_weight("weight", tied_weight)
        n = len(devs)
        if out_dim % n:
            raise ValueError(f"ColumnParallelLinear: out_dim {out_dim} does not split evenly across {n} devices")
        self._max_nn_tied = tied_weight

    def _shards(self) -> list[Linear]:
        n = len(self.devices)
        w = self.weight
        if w.sharding_strategy is None or w.sharding_strategy != ShardingStrategy.rowwise(n):
            if w._shard_parent is None:
                w.sharding_strategy = ShardingStrategy.rowwise(n)
        if self.bias is not None:
            self.bias.sharding_strategy = ShardingStrategy.rowwise(n)
        return Linear.shard(self, self.devices)

    def __call__(self, x: Any, signal_buffers: Any = None) -> list[TensorValue]:  # type: ignore[override]
        n = len(self.devices)
        xs = list(x) if isinstance(x, (list, tuple)) else [x] * n
        if len(xs) != n:
            raise ValueError(f"{self._layer_name}: got {len(xs)} inputs for {n} devices")
        shards = self._shards()
        ys = []
        for lin, xi, dev in zip(shards, xs, self.devices):
            xi = check_input(self, xi, min_rank=1, dtype=self._max_nn_dtype, last_dim=self.in_dim)
            ys.append(lin(on_device(xi, dev)))
        # all-gather: every device gets the concatenation of all shards' outputs
        return [ops.concat([on_device(y, dev) for y in ys], axis=-1) for dev in self.devices]


class RowParallelLinear(Linear):
    """A Linear whose weight columns (``in_dim``) are split across ``devices``; the partial products
    are summed (all-reduce) so every device gets ``y = x @ W.T + b``.

    Call it with one input per device, each holding that device's slice of the ``in_dim`` features
    (what a column-split layer before it produced), and the graph's signal buffers (one per device;
    without them the sum is built from device copies).  The bias is added once, after the sum.
    """

    def __init__(self, in_dim: int, out_dim: int, dtype: DType, devices: Sequence[DeviceRef],
                 **kwargs: Any) -> None:
        devs = list(devices)
        if not devs:
            raise ValueError("RowParallelLinear: devices must not be empty")
        if in_dim % len(devs):
            raise ValueError(f"RowParallelLinear: in_dim {in_dim} does not split evenly across {len(devs)} devices")
        super().__init__(in_dim, out_dim, dtype, devs[0], **kwargs)
        self.devices = devs

    def __call__(self, x: Any, signal_buffers: Any = None) -> list[TensorValue]:  # type: ignore[override]
        n = len(self.devices)
        xs = list(x) if isinstance(x, (list, tuple)) else None
        if xs is None or len(xs) != n:
            raise ValueError(f"{self._layer_name}: expected a list of {n} inputs (one per device), got "
                             f"{len(xs) if xs is not None else type(x).__name__}")
        if self.sharding_strategy is None:
            self.sharding_strategy = ShardingStrategy.columnwise(n)
        shards = Linear.shard(self, self.devices)
        parts = []
        for lin, xi, dev in zip(shards, xs, self.devices):
            xi = check_input(self, xi, min_rank=1, dtype=self._max_nn_dtype, last_dim=lin.in_dim)
            parts.append(lin(on_device(xi, dev)))
        return allreduce_parts(parts, self.devices, signal_buffers)


def allreduce_parts(parts: Sequence[TensorValue], devices: Sequence[DeviceRef],
                    signal_buffers: Any = None) -> list[TensorValue]:
    """The sum of per-device partial results on every device: ``ops.allreduce.sum`` with signal
    buffers, else device copies and adds."""
    if signal_buffers is not None:
        return ops.allreduce.sum(list(parts), signal_buffers)
    outs = []
    for dev in devices:
        acc = on_device(parts[0], dev)
        for p in parts[1:]:
            acc = acc + on_device(p, dev)
        outs.append(acc)
    return outs


@dataclass
class DistributedGemmConfig:
    """How distributed GEMMs run: ``enable_matmul_allreduce`` uses a fused matmul + all-reduce."""

    enable_matmul_allreduce: bool

    @staticmethod
    def generate() -> "DistributedGemmConfig | None":
        """The default configuration (fused matmul+allreduce off)."""
        return DistributedGemmConfig(enable_matmul_allreduce=False)


class GPTQLinear(Linear):
    """A Linear layer for GPTQ-quantised weights.

    Without a GPTQ ``quantization_encoding`` it is a plain float Linear.  With it, ``weight`` is
    ``[out_dim, in_dim / 2 + 2 * in_dim / group_size]`` uint8 GPTQ rows (symmetric 4-bit codes, then float16
    scales: ``max.graph.quantization.gptq``) run by ``ops.qmatmul`` as the Q4_0 blocks they equal (the
    native int4 kernels on the CPU); with ``desc_act``, ``perm_idx`` ``[in_dim]`` names the input of each
    weight column (the input is gathered by it first).  ``float8_config`` is not supported (ValueError).
    """

    def __init__(self, in_dim: int, out_dim: int, dtype: DType, device: DeviceRef, has_bias: bool = False,
                 quantization_encoding: QuantizationEncoding | None = None,
                 quantization_config: QuantizationConfig | None = None, float8_config: Any = None) -> None:
        if float8_config is not None:
            raise ValueError("GPTQLinear: float8_config is not supported")
        super().__init__(in_dim, out_dim, dtype, device, has_bias=has_bias,
                         quantization_encoding=quantization_encoding)
        if quantization_encoding is QuantizationEncoding.GPTQ:
            if quantization_config is None:
                raise ValueError("GPTQLinear: a GPTQ quantization_encoding needs its quantization_config")
            shape = _quantized_shape(quantization_encoding, out_dim, in_dim, "GPTQLinear", quantization_config)
            self.weight = Weight("weight", DType.uint8, shape, self.device, quantization_encoding=quantization_encoding)
        self.quantization_config = quantization_config
        self.perm_idx: Weight | None = None
        if quantization_config is not None and getattr(quantization_config, "desc_act", False):
            self.perm_idx = Weight("perm_idx", DType.int32, [in_dim], self.device)

    def __call__(self, x: Any) -> TensorValue:
        if self.quantization_encoding is not None:
            x = check_input(self, x, min_rank=1, dtype=self._max_nn_dtype)
            if self.perm_idx is not None:
                x = ops.gather(x, self.perm_idx, axis=-1)
            y = _qmatmul(self.quantization_encoding, self.quantization_config, x, self.weight, self._layer_name)
            return y + self.bias.cast(y.dtype) if self.bias is not None else y
        if self.perm_idx is not None:  # a float (dequantised) weight whose columns are in perm_idx's order
            x = ops.gather(check_input(self, x, min_rank=1), self.perm_idx, axis=-1)
        return super().__call__(x)


def gated_mlp_setup(mlp: Module, what: str, dtype: DType, quantization_encoding: QuantizationEncoding | None,
                    hidden_dim: int, feed_forward_length: int, devices: Sequence[DeviceRef] | None, has_bias: bool,
                    activation_function: str, float8_config: Any) -> dict[str, Any]:
    """The common part of a gated MLP's construction (:class:`MLP`, ``FusedMLP``): checks the activation,
    sets ``devices`` (the first one holds the weights; CPU without devices), ``hidden_dim``,
    ``feed_forward_length`` and ``activation_function`` on ``mlp``; the keyword arguments of its Linears."""
    if activation_function not in _ACTIVATIONS:
        raise ValueError(
            f"{what}: activation_function must be one of {sorted(_ACTIVATIONS)}, got {activation_function!r}"
        )
    devs = list(devices) if devices is not None else []
    device = devs[0] if devs else DeviceRef.CPU()
    mlp.devices = devs or [device]
    mlp.hidden_dim = hidden_dim
    mlp.feed_forward_length = feed_forward_length
    mlp.activation_function = activation_function
    kw: dict[str, Any] = dict(dtype=dtype, device=device, has_bias=has_bias)
    if quantization_encoding is not None:
        kw["quantization_encoding"] = quantization_encoding
    if float8_config is not None:
        kw["float8_config"] = float8_config
    return kw


class MLP(Module):
    """``down_proj(act(gate_proj(x)) * up_proj(x))`` with three Linear layers (SiLU by default)."""

    def __init__(
        self,
        dtype: DType,
        quantization_encoding: QuantizationEncoding | None,
        hidden_dim: int,
        feed_forward_length: int,
        devices: Sequence[DeviceRef],
        linear_cls: Callable[..., Linear] = Linear,
        has_bias: bool = False,
        activation_function: str = "silu",
        float8_config: Any = None,
        dist_gemm_config: DistributedGemmConfig | None = None,
    ) -> None:
        super().__init__()
        kw = gated_mlp_setup(self, "MLP", dtype, quantization_encoding, hidden_dim, feed_forward_length, devices,
                             has_bias, activation_function, float8_config)
        self.dist_gemm_config = dist_gemm_config
        self._max_nn_cfg = (dtype, quantization_encoding, linear_cls, has_bias, float8_config)
        self.gate_proj = linear_cls(in_dim=hidden_dim, out_dim=feed_forward_length, **kw)
        self.down_proj = linear_cls(in_dim=feed_forward_length, out_dim=hidden_dim, **kw)
        self.up_proj = linear_cls(in_dim=hidden_dim, out_dim=feed_forward_length, **kw)
        self._max_nn_strategy: ShardingStrategy | None = None

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        return self._max_nn_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        """Tensor parallel (rowwise): gate/up split ``feed_forward_length`` by rows, down by columns; replicate copies all."""
        n = strategy.num_devices
        if strategy.is_replicate:
            for lin in (self.gate_proj, self.up_proj, self.down_proj):
                lin.sharding_strategy = ShardingStrategy.replicate(n)
        else:
            self.gate_proj.sharding_strategy = ShardingStrategy.rowwise(n)
            self.up_proj.sharding_strategy = ShardingStrategy.rowwise(n)
            self.down_proj.sharding_strategy = ShardingStrategy.columnwise(n)
        self._max_nn_strategy = strategy

    def shard(self, devices: Iterable[DeviceRef]) -> list["MLP"]:
        """One MLP per device; with a tensor-parallel strategy the shards' outputs sum to the full output."""
        devs = list(devices)
        if self._max_nn_strategy is None:
            raise ValueError(f"{self._layer_name}.shard: set sharding_strategy before sharding")
        gates, ups, downs = (lin.shard(devs) for lin in (self.gate_proj, self.up_proj, self.down_proj))
        out = []
        for dev, g, u, d in zip(devs, gates, ups, downs):
            m = MLP.__new__(MLP)
            Module.__init__(m)
            m.devices = [dev]
            m.hidden_dim = self.hidden_dim
            m.feed_forward_length = int(g.out_dim)
            m.activation_function = self.activation_function
            m.dist_gemm_config = self.dist_gemm_config
            m._max_nn_cfg = self._max_nn_cfg
            m._max_nn_strategy = None
            m.gate_proj = g
            m.down_proj = d
            m.up_proj = u
            out.append(m)
        return out

    def __call__(self, x: Any) -> TensorValue:
        x = check_input(self, x, min_rank=1, last_dim=self.hidden_dim)
        act = _ACTIVATIONS[self.activation_function]
        return self.down_proj(act(self.gate_proj(x)) * self.up_proj(x))


# --------------------------------------------------------------------- V1 (deprecated) layers
def _tv(v: Any) -> TensorValue:
    from max.graph.ops._common import as_tensor

    return as_tensor(v, op="linear")


@dataclass(eq=False)
class LinearV1(Layer):
    """Deprecated: ``x @ weight.T + bias`` with ``weight``/``bias`` given as graph values."""

    weight: Any
    bias: Any = None

    def __call__(self, x: Any) -> TensorValue:
        w = _tv(self.weight)
        x = check_input(self, x, min_rank=1, dtype=w.dtype, last_dim=w.shape[-1])
        y = x @ w.T
        if self.bias is not None:
            y = y + _tv(self.bias).cast(y.dtype)
        return y

    @classmethod
    def create(cls, dtype: DType, quantization_encoding: QuantizationEncoding | None, in_features: int,
               out_features: int, weights: Any, bias: Any = None,
               quantization_config: QuantizationConfig | None = None) -> "LinearV1":
        """A LinearV1 (float), QLinearV1 (GGML block encodings) or GPTQLinearV1 (GPTQ) for these weights."""
        if quantization_encoding is not None:
            shape = _quantized_shape(quantization_encoding, out_features, in_features, "LinearV1.create",
                                     quantization_config)
            w = _allocate(weights, "weight", DType.uint8, shape, quantization_encoding)
        else:
            w = _allocate(weights, "weight", dtype, [out_features, in_features], None)
        b = _allocate(bias, "bias", dtype, [out_features], None) if bias is not None else None
        if quantization_encoding is QuantizationEncoding.GPTQ:
            return GPTQLinearV1(w, b, quantization_encoding, quantization_config)
        if quantization_encoding is not None:
            return QLinearV1(w, b, quantization_encoding)
        return LinearV1(w, b)


def _allocate(src: Any, leaf: str, dtype: DType, shape: list[int], encoding: Any) -> Any:
    if isinstance(src, (Weight, TensorValue)):
        return src
    if hasattr(src, "allocate"):
        node = src if str(getattr(src, "name", "")).endswith(leaf) else getattr(src, leaf)
        return node.allocate(dtype, shape, encoding) if encoding is not None else node.allocate(dtype, shape)
    raise TypeError(f"LinearV1.create: {leaf} must be a Weight or a Weights tree, got {type(src).__name__}")


@dataclass(eq=False)
class QLinearV1(LinearV1):
    """Deprecated: a LinearV1 whose weight is quantised with ``quantization_encoding``."""

    quantization_encoding: QuantizationEncoding | None = None

    def __call__(self, x: Any) -> TensorValue:
        if self.quantization_encoding is None:
            return LinearV1.__call__(self, x)
        x = check_input(self, x, min_rank=1)
        y = _qmatmul(self.quantization_encoding, None, x, _tv(self.weight), "QLinearV1")
        if self.bias is not None:
            y = y + _tv(self.bias).cast(y.dtype)
        return y


@dataclass(eq=False)
class GPTQLinearV1(QLinearV1):
    """Deprecated: a GPTQ-quantised LinearV1 (GPTQ rows as :class:`GPTQLinear` holds them; ``perm_idx``
    gathers the input first)."""

    quantization_config: QuantizationConfig | None = None
    perm_idx: Any = None

    def __call__(self, x: Any) -> TensorValue:
        if self.quantization_encoding is None:
            return LinearV1.__call__(self, x)
        x = check_input(self, x, min_rank=1)
        if self.perm_idx is not None:
            x = ops.gather(x, _tv(self.perm_idx), axis=-1)
        y = _qmatmul(self.quantization_encoding, self.quantization_config, x, _tv(self.weight), "GPTQLinearV1")
        return y + _tv(self.bias).cast(y.dtype) if self.bias is not None else y


@dataclass(eq=False)
class MLPV1(Layer):
    """Deprecated: ``down_proj(silu(gate_proj(x)) * up_proj(x))``."""

    gate_proj: LinearV1
    down_proj: LinearV1
    up_proj: LinearV1

    def __call__(self, x: Any) -> TensorValue:
        return self.down_proj(ops.silu(self.gate_proj(x)) * self.up_proj(x))
