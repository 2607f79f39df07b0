"""How checkpoint tensors become the weights a model binds: the compute-dtype policy, the weight
factory every projection and embedding is created by, the one conversion of a checkpoint tensor,
and the loader that drives a family's adapter.

Everything a change of weight representation (quantised GGUF kept quantised, LoRA wrapping, ...)
must touch is in this file:

- :func:`compute_dtype` -- the one dtype policy: ``(encoding, device) -> DType`` of activations and
  of every float weight.
- :class:`WeightFactory` -- ``linear(name, in_dim, out_dim, has_bias=False, tied_to=None)``,
  ``embedding(name, vocab_size, dim)``, ``experts(name, num_experts, in_dim, out_dim, has_bias=False)``
  (stacked MoE expert weights), ``fuse(linears)``; ``name`` is the module path the
  result is assigned to (``layers.0.mlp.gate_proj``, ``embed_tokens``, ``lm_head``), which is also
  the checkpoint tensor's name after the family's adapter renamed it (``+ ".weight"``).
- :func:`convert_weight` -- one checkpoint tensor (after renaming) -> the value the module's
  ``Weight`` binds.
- :func:`load_weights_into` -- adapter output -> ``convert_weight`` for each of the module's weights
  -> ``module.load_state_dict``, with a progress bar and errors that name the tensors.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import torch

from max.dtype import DType
from max.graph import DeviceRef, TensorValue, Weight, ops
from max.nn import Embedding, Linear
from max.nn.layer import Module, check_input

logger = logging.getLogger("max.pipelines")

__all__ = [
    "Derived",
    "GGUF_GLOBAL_NAMES",
    "GGUF_LAYER_NAMES",
    "WeightFactory",
    "WidenedEmbedding",
    "WidenedLinear",
    "compute_dtype",
    "keeps_quantized",
    "storage_dtype",
    "convert_weight",
    "float_tensor",
    "Int4Weight",
    "int4_checkpoint",
    "load_weights_into",
    "rename_gguf",
    "rename_hf",
    "session_policy",
    "GGUF_SSM_NAMES",
    "gguf_ssm_layout",
    "standard_adapters",
]


# --------------------------------------------------------------------------- dtype policy
# The engine's backend policy decides (max.engine.backend); these are the names families use.  A family
# passes its session's policy (``session_policy(session)``): the one its graphs are lowered with.
def session_policy(session: Any) -> Any:
    """The backend policy ``session`` compiles with (``InferenceSession.backend``); the process's
    (``backend.current()``) for anything without one."""
    policy = getattr(session, "backend", None)
    if policy is None:
        from max.engine import backend

        policy = backend.current()
    return policy


def compute_dtype(encoding: Any, device: DeviceRef, policy: Any = None) -> DType:
    """The dtype a model computes in for a weight ``encoding`` on ``device`` under ``policy`` (default the
    process's; :meth:`max.engine.backend.BackendPolicy.compute_dtype`)."""
    return (policy or session_policy(None)).compute_dtype(encoding, device)


def storage_dtype(encoding: Any, device: DeviceRef, policy: Any = None) -> DType:
    """The dtype float weights are kept in (:meth:`~max.engine.backend.BackendPolicy.weight_storage`)."""
    return (policy or session_policy(None)).weight_storage(encoding, device).dtype


def keeps_quantized(encoding: Any, device: DeviceRef, policy: Any = None) -> bool:
    """Whether GGML block-quantised weights stay quantised in memory (native CPU kernels read them);
    elsewhere they are dequantised once at load."""
    return (policy or session_policy(None)).weight_storage(encoding, device).keep_quantized


class WidenedLinear(Linear):
    """``y = x @ W.T (+ b)`` with ``W`` stored in a narrower float dtype (bfloat16/float16) than the
    activations: the graph widens it exactly (``W.cast``), which the engine fuses into a kernel reading
    the narrow weight -- no float32 copy is kept."""

    tensor_parallel_ok = True
    """Its ``shard`` gives widening shards (``max.nn.DistributedTransformer`` splits it by rows)."""

    def __init__(self, in_dim: int, out_dim: int, dtype: DType, storage: DType, device: DeviceRef,
                 has_bias: bool = False) -> None:
        super().__init__(in_dim, out_dim, dtype, device, has_bias=has_bias)
        self.weight = Weight("weight", storage, [out_dim, in_dim], self.device)

    def shard(self, devices: Any) -> list:
        """Shards that widen their slice of the narrow weight the same way (tensor parallelism)."""
        shards = super().shard(devices)
        for lin in shards:
            lin.__class__ = WidenedLinear
        return shards

    def __call__(self, x: Any) -> TensorValue:
        x = check_input(self, x, min_rank=1, dtype=self._max_nn_dtype, last_dim=self.in_dim)
        y = x @ self.weight.cast(x.dtype).T
        if self.bias is not None:
            y = y + self.bias.cast(y.dtype)
        return y


class WidenedEmbedding(Embedding):
    """An embedding table stored in bfloat16/float16 whose rows are widened on lookup."""

    def __init__(self, vocab_size: int, dim: int, dtype: DType, storage: DType, device: DeviceRef) -> None:
        super().__init__(vocab_size, dim, storage, device)
        self.compute_dtype = dtype

    def __call__(self, indices: Any) -> TensorValue:
        return super().__call__(indices).cast(self.compute_dtype)


# --------------------------------------------------------------------------- the weight factory
class Float8Linear(Linear):
    """A projection of an FP8 checkpoint: the ``float8_e4m3fn`` weight ``[out, in]`` stays float8 in memory
    and is scaled on use by its float32 scales, as Hugging Face FP8 checkpoints store them: per tensor
    (``{name}.weight_scale``, one value) or per block (``{name}.weight_scale_inv``, ``[ceil(out / bo),
    ceil(in / bi)]`` for ``bo x bi`` blocks).  ``y = x @ (weight * scale).T (+ bias)`` in the compute dtype,
    by ``max.nn.kernels_float8.matmul_float8_weight`` (the weight is widened inside the kernel)."""

    def __init__(self, in_dim: int, out_dim: int, dtype: DType, device: DeviceRef, has_bias: bool,
                 scale_name: str, scale_shape: Sequence[int]) -> None:
        super().__init__(in_dim, out_dim, DType.float8_e4m3fn, device, has_bias=False)
        self._max_nn_dtype = dtype
        self.float8_config = "checkpoint"  # not a plain float Linear: never fused or split
        if has_bias:
            self.bias = Weight("bias", dtype, [out_dim], self.device)
        shape = [int(d) for d in scale_shape]
        if scale_name not in ("weight_scale", "weight_scale_inv"):
            raise ValueError(f"Float8Linear: unknown scale tensor {scale_name!r}")
        if scale_name == "weight_scale" and int(np.prod(shape or [1])) != 1:
            raise ValueError(f"Float8Linear: weight_scale must hold one value, got shape {shape}")
        if scale_name == "weight_scale_inv" and len(shape) != 2:
            raise ValueError(f"Float8Linear: weight_scale_inv must be [out blocks, in blocks], got shape {shape}")
        self.scale_name = scale_name
        setattr(self, scale_name, Weight(scale_name, DType.float32, shape, self.device))
        if scale_name == "weight_scale_inv":
            self.block = (-(-out_dim // shape[0]), -(-in_dim // shape[1]))
            if -(-out_dim // self.block[0]) != shape[0] or -(-in_dim // self.block[1]) != shape[1]:
                raise ValueError(f"Float8Linear: scales {shape} do not tile a [{out_dim}, {in_dim}] weight")

    def __call__(self, x: Any) -> TensorValue:
        from max.nn.layer import check_input, on_device

        from max.nn.kernels_float8 import matmul_float8_weight

        x = on_device(check_input(self, x, min_rank=1, last_dim=self.in_dim), self.device)
        s: TensorValue = getattr(self, self.scale_name)
        y = matmul_float8_weight(x, self.weight, s, self.block if self.scale_name == "weight_scale_inv" else None)
        if self.bias is not None:
            y = y + self.bias.cast(y.dtype)
        return y


def _float8_scale(checkpoint: Mapping[str, Any] | None, name: str) -> tuple[str, list[int]] | None:
    """``(scale tensor name, its shape)`` when ``{name}.weight`` is a float8 tensor of an FP8 checkpoint."""
    if checkpoint is None:
        return None
    w = checkpoint.get(f"{name}.weight")
    if w is None or getattr(w, "dtype", None) not in (DType.float8_e4m3fn,):
        return None
    for scale in ("weight_scale_inv", "weight_scale"):
        h = checkpoint.get(f"{name}.{scale}")
        if h is not None:
            return scale, [int(d) for d in getattr(h, "shape", [])]
    raise ValueError(f"FP8 checkpoint tensor {name}.weight has no {name}.weight_scale_inv / .weight_scale")


class Int4Weight:
    """A GPTQ / AWQ projection of the checkpoint (``{name}.qweight``, ``.qzeros``, ``.scales``, ``.g_idx``)
    seen as one GGML-block tensor ``{name}.weight`` (``Q4_0`` when symmetric, else ``Q4_1``; see
    :mod:`max.graph.quantization.gptq`): a checkpoint handle whose ``data()`` repacks the groups into
    blocks, which native CPU kernels run as they are (elsewhere they are dequantised once at load)."""

    def __init__(self, name: str, parts: Mapping[str, Any], cfg: Any) -> None:
        from max.graph.quantization import QuantizationEncoding
        from max.graph.quantization.gptq import unpack_zeros

        self.name, self.parts, self.cfg = name, dict(parts), cfg
        qshape = [int(d) for d in getattr(parts["qweight"], "shape", [])]
        if len(qshape) != 2:
            raise ValueError(f"{cfg.method} checkpoint tensor {name}.qweight must be 2-D, got {qshape}")
        n, k = (qshape[1], qshape[0] * 8) if cfg.method == "gptq" else (qshape[1] * 8, qshape[0])
        zeros = unpack_zeros(_torch_of(parts["qzeros"])[0], cfg)
        kind = "Q4_0" if bool((zeros == 8).all()) else "Q4_1"
        self.quantization_encoding = QuantizationEncoding[kind]
        if k % 32:
            raise ValueError(f"{cfg.method} checkpoint tensor {name}: input size {k} is not a multiple of 32")
        self.dtype = DType.uint8
        self.shape = [n, k // 32 * self.quantization_encoding.block_size]

    def data(self) -> Any:
        from max.graph.quantization.gptq import to_ggml_blocks, unpack_gptq
        from max.graph.weights.weight_data import WeightData

        t = {k: _torch_of(v)[0] for k, v in self.parts.items()}
        codes, zeros, scales = unpack_gptq(t["qweight"], t["qzeros"], t["scales"], self.cfg, t.get("g_idx"),
                                           name=self.name)
        kind, blocks = to_ggml_blocks(codes, zeros, scales)
        if kind != self.quantization_encoding._name_:
            raise RuntimeError(f"{self.name}: repacked as {kind}, announced as {self.quantization_encoding._name_}")
        return WeightData(blocks, f"{self.name}.weight", DType.uint8, list(blocks.shape), self.quantization_encoding)


_INT4_PARTS = ("qweight", "qzeros", "scales", "g_idx")


def int4_checkpoint(checkpoint: Mapping[str, Any], quantization_config: Any) -> Mapping[str, Any]:
    """A GPTQ / AWQ checkpoint (``quantization_config.quant_method`` gptq or awq) with each packed projection
    replaced by an :class:`Int4Weight` ``{name}.weight``; any other checkpoint as it is.  ValueError naming
    the variant for what is not supported (bits, group size, packing, act-order)."""
    qc = quantization_config if isinstance(quantization_config, Mapping) else (
        quantization_config.to_dict() if hasattr(quantization_config, "to_dict") else None)
    packed = [n[: -len(".qweight")] for n in checkpoint if n.endswith(".qweight")]
    if not qc or str(qc.get("quant_method", "")).lower() not in ("gptq", "awq"):
        if packed:
            raise ValueError(f"checkpoint has packed int4 tensors ({packed[0]}.qweight ...) but its config.json "
                             "quantization_config is not quant_method gptq or awq")
        return checkpoint
    from max.graph.quantization.gptq import int4_config

    cfg = int4_config(qc)
    out = dict(checkpoint)
    for name in packed:
        parts = {p: out.pop(f"{name}.{p}") for p in _INT4_PARTS if f"{name}.{p}" in out}
        missing = [p for p in ("qweight", "qzeros", "scales") if p not in parts]
        if missing:
            raise ValueError(f"{cfg.method} checkpoint: {name} has no {', '.join(missing)}")
        out[f"{name}.weight"] = Int4Weight(name, parts, cfg)
        if "g_idx" in parts:  # act-order: the repacked columns are the inputs sorted by group
            from max.graph.quantization.gptq import act_order_perm

            k = int(out[f"{name}.weight"].shape[1]) // out[f"{name}.weight"].quantization_encoding.block_size * 32
            perm = act_order_perm(_torch_of(parts["g_idx"])[0], k, k if cfg.group_size == -1 else cfg.group_size,
                                  name)
            if perm is not None:
                out[f"{name}.perm_idx"] = perm
    return out


class WeightFactory:
    """Creates every checkpoint-weight-bearing projection and embedding of a model.

    ``dtype``/``device``: what the created modules compute in (see :func:`compute_dtype`).
    ``checkpoint``: the family adapter's output (module name -> checkpoint tensor handle with
    ``dtype``/``shape``/``quantization_encoding``), so a factory can choose a representation per
    tensor; None when building a graph without a checkpoint (tests).

    Today every projection is a plain float :class:`max.nn.Linear` and every table a plain
    :class:`max.nn.Embedding` in ``dtype``.  ``created`` records ``name -> module`` so the loader
    can check that each module ended up at the path it was created for.
    """

    def __init__(self, dtype: DType, device: DeviceRef, checkpoint: Mapping[str, Any] | None = None,
                 lora: Any = None, lora_targets: Iterable[str] = (), *, storage: DType | None = None,
                 keep_quantized: bool = False, quantize_to: Any = None) -> None:
        self.dtype = dtype
        self.device = device
        self.checkpoint = checkpoint
        self.storage = storage or dtype
        self.keep_quantized = keep_quantized
        self.quantize_to = quantize_to  # a QuantizationEncoding: float checkpoint tensors quantised on load
        self.created: dict[str, Module] = {}
        # LoRA: projections whose last name part is in ``lora_targets`` become ``max.nn.LoRALinear``s
        # sharing the ``LoRAGraphInputs`` ``lora`` (adapters are added per token, never merged)
        self.lora = lora
        self.lora_targets = set(lora_targets)

    def encoding_of(self, name: str, in_dim: int) -> Any:
        """The GGML encoding module ``name``'s weight is kept in, or None for a float weight."""
        if self.checkpoint is None:
            return None
        enc = _checkpoint_encoding(self.checkpoint.get(f"{name}.weight"))
        if enc is not None:
            return enc if self.keep_quantized else None
        q = self.quantize_to
        if q is not None and in_dim % q.elements_per_block == 0:
            return q
        return None

    def _linear(self, name: str, in_dim: int, out_dim: int, has_bias: bool, enc: Any) -> Linear:
        f8 = _float8_scale(self.checkpoint, name)
        if f8 is not None:
            return Float8Linear(in_dim, out_dim, self.dtype, self.device, has_bias, f8[0], f8[1])
        if self.checkpoint is not None and f"{name}.perm_idx" in self.checkpoint:  # act-order GPTQ (int4_checkpoint)
            from max.graph.quantization import QuantizationConfig
            from max.nn.linear import GPTQLinear

            return GPTQLinear(in_dim, out_dim, self.dtype, self.device, has_bias=has_bias, quantization_encoding=enc,
                              quantization_config=QuantizationConfig("gptq", 4, in_dim, desc_act=True))
        if enc is not None:
            return Linear(in_dim, out_dim, self.dtype, self.device, has_bias=has_bias, quantization_encoding=enc)
        if self.storage != self.dtype:
            return WidenedLinear(in_dim, out_dim, self.dtype, self.storage, self.device, has_bias=has_bias)
        return Linear(in_dim, out_dim, self.dtype, self.device, has_bias=has_bias)

    def _record(self, name: str, module: Module) -> Module:
        if name in self.created:
            raise ValueError(f"WeightFactory: {name!r} was created twice")
        self.created[name] = module
        return module

    def linear(self, name: str, in_dim: int, out_dim: int, has_bias: bool = False,
               tied_to: Module | None = None) -> Module:
        """``y = x @ W.T (+ b)`` with ``W`` ``[out_dim, in_dim]`` named ``{name}.weight``.

        ``tied_to``: an embedding module made by :meth:`embedding` whose table is this
        projection's weight (tied input/output embeddings); no ``{name}.weight`` is loaded then.
        """
        if self.lora is not None and tied_to is None and name.rsplit(".", 1)[-1] in self.lora_targets:
            from max.nn.lora import LoRALinear

            return self._record(name, LoRALinear(in_dim, out_dim, self.dtype, self.device, self.lora, name,
                                                 has_bias=has_bias,
                                                 quantization_encoding=self.encoding_of(name, in_dim)))
        if tied_to is not None:
            table = tied_to.weight
            enc = getattr(tied_to, "quantization_encoding", None)
            lin = self._linear(name, in_dim, out_dim, has_bias, enc)
            if list(table.shape) != list(lin.weight.shape) or table.dtype != lin.weight.dtype:
                raise ValueError(f"WeightFactory.linear({name!r}): tied table is {list(table.shape)} {table.dtype}, "
                                 f"expected {list(lin.weight.shape)} {lin.weight.dtype}")
            del lin.weight
            lin.set_shared_weight("weight", table)
        else:
            lin = self._linear(name, in_dim, out_dim, has_bias, self.encoding_of(name, in_dim))
        return self._record(name, lin)

    def embedding(self, name: str, vocab_size: int, dim: int) -> Module:
        """A ``[vocab_size, dim]`` lookup table named ``{name}.weight`` (quantised tables are
        dequantised row by row on lookup)."""
        enc = self.encoding_of(name, dim)
        if enc is not None:
            emb: Module = Embedding(vocab_size, dim, self.dtype, self.device, quantization_encoding=enc)
        elif self.storage != self.dtype:
            emb = WidenedEmbedding(vocab_size, dim, self.dtype, self.storage, self.device)
        else:
            emb = Embedding(vocab_size, dim, self.dtype, self.device)
        return self._record(name, emb)

    def experts(self, name: str, num_experts: int, in_dim: int, out_dim: int, has_bias: bool = False) -> Module:
        """Stacked expert projections: ``weight`` ``[num_experts, out_dim, in_dim]`` named ``{name}.weight``
        (and ``bias`` ``[num_experts, out_dim]``), as ``max.nn.moe.moe_experts_ffn`` takes them."""
        return self._record(name, ExpertWeights(num_experts, in_dim, out_dim, self.dtype, self.device, has_bias))

    def fuse(self, linears: Sequence[Module]) -> Callable[[TensorValue], TensorValue]:
        """A function equal to ``concat([l(x) for l in linears], axis=-1)``.

        Plain float Linears are fused into one matmul over their concatenated weights (the
        concatenation of weights is folded at load, so it costs nothing per step); anything
        else is called one by one.
        """
        lins = list(linears)
        plain = all(type(lin) is Linear and lin.quantization_encoding is None and lin.clip_weight is None
                    and lin.float8_config is None for lin in lins)
        if not plain or len(lins) == 1:
            return lambda x: ops.concat([lin(x) for lin in lins], axis=-1) if len(lins) > 1 else lins[0](x)
        with_bias = [lin.bias is not None for lin in lins]

        def call(x: TensorValue) -> TensorValue:
            w = ops.concat([lin.weight for lin in lins], axis=0)
            y = x @ w.T
            if any(with_bias):
                y = y + ops.concat([lin.bias if lin.bias is not None else
                                    ops.constant(np.zeros(lin.out_dim, np.float32), self.dtype, self.device)
                                    for lin in lins], axis=0).cast(y.dtype)
            return y

        return call

    def check_paths(self, root: Module) -> None:
        """Every created module sits at the path it was created for (its weight is ``{name}.weight``)."""
        names = set(root.raw_state_dict())
        wrong = [n for n, m in self.created.items()
                 if f"{n}.weight" not in names and "weight" not in m._mstate().shared]
        if wrong:
            raise RuntimeError(f"WeightFactory: modules created as {wrong} were not assigned at those paths")


class ExpertWeights(Module):
    """The stacked weights of one projection of every expert (no call: ``moe_experts_ffn`` reads them)."""

    def __init__(self, num_experts: int, in_dim: int, out_dim: int, dtype: DType, device: DeviceRef,
                 has_bias: bool = False) -> None:
        super().__init__()
        self.weight = Weight("weight", dtype, [num_experts, out_dim, in_dim], device)
        self.bias = Weight("bias", dtype, [num_experts, out_dim], device) if has_bias else None


# --------------------------------------------------------------------------- the one conversion
class Derived:
    """A tensor an adapter computes at load time from checkpoint tensors: ``fn(*sources)``, each source
    dequantised to float32 first (Gemma's GGUF norms minus 1, per-expert tensors stacked ...)."""

    def __init__(self, fn: Callable[..., torch.Tensor], *sources: Any) -> None:
        self.fn = fn
        self.sources = sources

    def value(self) -> torch.Tensor:
        return self.fn(*[float_tensor(s) for s in self.sources])


def float_tensor(value: Any) -> torch.Tensor:
    """A checkpoint tensor (handle, WeightData, array, :class:`Derived`) as a float32 (or wider) torch tensor."""
    t, enc = _torch_of(value)
    if enc is not None:
        from max.graph.quantization.codec import dequantize

        t = dequantize(t, enc)
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def _torch_of(value: Any) -> tuple[torch.Tensor, Any]:
    """``(tensor, quantization_encoding)`` of a checkpoint handle / WeightData / array / Derived."""
    from max.graph.weights.weight_data import WeightData, as_torch

    if isinstance(value, Derived):
        return value.value(), None
    if hasattr(value, "data") and callable(value.data) and not isinstance(value, torch.Tensor):
        value = value.data()  # a Weights handle: read (memory-mapped) now
    if isinstance(value, WeightData):
        return as_torch(value.data), value.quantization_encoding
    return as_torch(value), None


def _checkpoint_encoding(value: Any) -> Any:
    """The GGML encoding of a checkpoint tensor handle, WeightData or array (None for float tensors)."""
    if value is None:
        return None
    try:
        return value.quantization_encoding  # Weights handles read it from the index, without the data
    except (AttributeError, KeyError):
        return None


def convert_weight(name: str, value: Any, target: Weight) -> torch.Tensor:
    """One checkpoint tensor as the value ``target`` (a module's ``Weight``) binds.

    ``value``: a ``Weights`` handle, ``WeightData``, numpy array, torch tensor or :class:`Derived` (the
    family adapter's output for ``name``).  A quantised ``target`` (uint8 with a GGML encoding) binds the
    checkpoint's blocks as they are (zero-copy from the memory-mapped file) or, for a float
    checkpoint tensor, the blocks of ggml's reference quantizer; otherwise GGML-block tensors are
    dequantised (bit-exact with ``gguf.quants``) and every tensor is cast to ``target.dtype``.
    """
    t, enc = _torch_of(value)
    target_enc = getattr(target, "quantization_encoding", None)
    if target_enc is not None:
        shape = [int(d) for d in target.shape]
        if enc is None:
            t = _quantize(name, t, target_enc)
        elif enc != target_enc:
            raise ValueError(f"checkpoint tensor {name!r} is {enc.name}, the model expects {target_enc.name}")
        if list(t.shape) != shape:
            raise ValueError(f"checkpoint tensor {name!r} has shape {list(t.shape)} (blocks), the model expects "
                             f"{shape}")
        return t
    if enc is not None:
        from max.graph.quantization.codec import dequantize

        t = dequantize(t, enc)
    want = target.dtype.to_torch()
    if t.dtype != want:
        t = t.to(want)
    shape = [int(d) for d in target.shape]
    if list(t.shape) != shape:
        if int(np.prod(shape)) == t.numel() and len(shape) == 1:
            t = t.reshape(shape)
        else:
            raise ValueError(f"checkpoint tensor {name!r} has shape {list(t.shape)}, the model expects {shape}")
    return t


def _quantize(name: str, t: torch.Tensor, enc: Any) -> torch.Tensor:
    """Float ``t`` -> GGML blocks of ``enc`` (ggml's reference rounding: the codec, native when built)."""
    if t.dim() != 2:
        raise ValueError(f"checkpoint tensor {name!r} ({list(t.shape)}) cannot be quantised to {enc.name}: not 2-D")
    import max.engine.native  # noqa: F401  (registers the native quantiser with the codec)
    from max.graph.quantization import codec

    return codec.quantize(t, enc.name)


def load_weights_into(module: Module, adapted: Mapping[str, Any], what: str) -> None:
    """Convert and bind every weight of ``module`` from ``adapted`` (module name -> checkpoint tensor).

    Missing and unused tensors raise ValueError naming them (``what`` names the model).
    """
    from max.graph.weights.protocol import progress

    targets = module.raw_state_dict()
    missing = sorted(n for n in targets if n not in adapted)
    unused = sorted(n for n in adapted if n not in targets)
    if missing or unused:
        parts = []
        if missing:
            parts.append(f"the checkpoint has no tensor for {_abbrev(missing)}")
        if unused:
            parts.append(f"it has tensors this architecture does not use: {_abbrev(unused)}")
        raise ValueError(f"{what}: {'; '.join(parts)}")
    total = sum(int(np.prod([int(d) for d in w.shape])) * w.dtype.size_in_bytes for w in targets.values())
    bar = progress(total, "Loading weights", len(targets))
    from max.graph.weights.weight_data import WeightData

    state: dict[str, Any] = {}
    try:
        for name, w in targets.items():
            t = convert_weight(name, adapted[name], w)
            enc = getattr(w, "quantization_encoding", None)
            state[name] = t if enc is None else WeightData(t, name, w.dtype, list(t.shape), enc)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    module.load_state_dict(state, strict=True)


def _abbrev(names: list[str], n: int = 8) -> str:
    return str(names[:n])[:-1] + (f", ... ({len(names)} in all)]" if len(names) > n else "]")


# --------------------------------------------------------------------------- renaming helpers
GGUF_GLOBAL_NAMES = {
    "token_embd": "embed_tokens",
    "output_norm": "norm",
    "output": "lm_head",
}
"""llama.cpp's names of the non-layer tensors -> module names (shared by every llama.cpp decoder)."""

GGUF_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
"""llama.cpp's per-layer tensor names (``blk.N.<key>.weight``) -> module names of a Llama-shaped
layer; families override or extend it (see each family's ``weight_adapters.py``)."""

_BLK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_GLOBAL = re.compile(r"^(\w+)\.(weight|bias)$")


def rename_gguf(state_dict: Mapping[str, Any], layer_names: Mapping[str, str] | None = None,
                global_names: Mapping[str, str] | None = None, **_: Any) -> dict[str, Any]:
    """GGUF tensor names -> module names (``blk.3.attn_q.weight`` -> ``layers.3.self_attn.q_proj.weight``).

    ``layer_names``/``global_names`` default to :data:`GGUF_LAYER_NAMES` / :data:`GGUF_GLOBAL_NAMES`.
    Tensors with no mapping (``rope_freqs``, ...) are left out; they are logged at debug level.
    """
    layer_names = GGUF_LAYER_NAMES if layer_names is None else layer_names
    global_names = GGUF_GLOBAL_NAMES if global_names is None else global_names
    out: dict[str, Any] = {}
    skipped = []
    for name, w in state_dict.items():
        if name.endswith((".ssm_a", ".ssm_d")):  # llama.cpp names Mamba's A and D without a suffix
            name += ".weight"
        m = _BLK.match(name)
        if m and m.group(2) in layer_names:
            out[f"layers.{m.group(1)}.{layer_names[m.group(2)]}.{m.group(3)}"] = w
            continue
        g = _GLOBAL.match(name)
        if g and g.group(1) in global_names:
            out[f"{global_names[g.group(1)]}.{g.group(2)}"] = w
            continue
        skipped.append(name)
    if skipped:
        logger.debug("GGUF tensors not used by the model: %s", skipped)
    return out


GGUF_SSM_NAMES = {"ssm_in": "in_proj", "ssm_conv1d": "conv1d", "ssm_dt": "dt", "ssm_a": "A", "ssm_d": "D",
                  "ssm_norm": "norm", "ssm_out": "out_proj"}
"""llama.cpp's Mamba-2 mixer tensors -> the mixer's module names (``ssm_dt.bias`` is ``dt_bias``, ``ssm_a``
holds ``A`` itself: see :func:`gguf_ssm_layout`)."""


def gguf_ssm_layout(out: dict[str, Any], mixer: str) -> dict[str, Any]:
    """Undo llama.cpp's converter layouts in the mixer tensors renamed to ``layers.N.<mixer>.*``: the conv
    weight ``[C, K]`` -> ``[C, 1, K]``, ``A = -exp(A_log)`` ``[H, 1]`` -> ``A_log``, ``D`` ``[H, 1]`` -> ``[H]``,
    ``dt.bias`` -> ``dt_bias``, the group norm ``[G, I/G]`` -> ``[I]``."""
    res: dict[str, Any] = {}
    for k, v in out.items():
        head, _, leaf = k.rpartition(f".{mixer}.")
        if not _:
            res[k] = v
            continue
        p = f"{head}.{mixer}."
        if leaf == "conv1d.weight":
            res[k] = Derived(lambda w: w.reshape(w.shape[0], 1, -1), v)
        elif leaf == "A.weight":
            res[p + "A_log"] = Derived(lambda a: torch.log(-a.double()).float().reshape(-1), v)
        elif leaf == "D.weight":
            res[p + "D"] = Derived(lambda d: d.reshape(-1), v)
        elif leaf == "dt.bias":
            res[p + "dt_bias"] = Derived(lambda b: b.reshape(-1), v)
        elif leaf == "norm.weight":
            res[k] = Derived(lambda w: w.reshape(-1), v)
        else:
            res[k] = v
    return res


def standard_adapters(gguf_layer_names: Mapping[str, str] | None = None,
                      gguf_post: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> dict[Any, Callable]:
    """``{WeightsFormat: adapter}``: Hugging Face names minus ``model.`` (safetensors, PyTorch) and
    llama.cpp names via ``gguf_layer_names`` (default :data:`GGUF_LAYER_NAMES`), then ``gguf_post``."""
    from max.graph.weights import WeightsFormat

    def gguf(state_dict: Mapping[str, Any], **_: Any) -> dict[str, Any]:
        out = rename_gguf(state_dict, gguf_layer_names)
        return gguf_post(out) if gguf_post is not None else out

    return {WeightsFormat.safetensors: rename_hf, WeightsFormat.pytorch: rename_hf, WeightsFormat.gguf: gguf}


def rename_hf(state_dict: Mapping[str, Any], prefix: str = "model.",
              drop: Iterable[str] = ("rotary_emb.inv_freq",), **_: Any) -> dict[str, Any]:
    """Hugging Face names -> module names: ``model.layers.0...`` -> ``layers.0...``; ``lm_head.*`` kept;
    names ending in one of ``drop`` (buffers some checkpoints carry) are left out."""
    drop = tuple(drop)
    out: dict[str, Any] = {}
    for name, w in state_dict.items():
        if drop and name.endswith(drop):
            continue
        out[name[len(prefix):] if prefix and name.startswith(prefix) else name] = w
    return out
