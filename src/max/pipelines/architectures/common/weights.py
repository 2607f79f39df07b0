"""How checkpoint tensors become the weights a model binds: the compute-dtype policy, the weight
factory every projection and embedding is created by, the one conversion of a checkpoint tensor,
and the loader that drives a family's adapter.

Everything a change of weight representation (quantised GGUF kept quantised, LoRA wrapping, ...)
must touch is in this file:

- :func:`compute_dtype` -- the one dtype policy: ``(encoding, device) -> DType`` of activations and
  of every float weight.
- :class:`WeightFactory` -- ``linear(name, in_dim, out_dim, has_bias=False, tied_to=None)``,
  ``embedding(name, vocab_size, dim)``, ``fuse(linears)``; ``name`` is the module path the
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
from max.nn.layer import Module

logger = logging.getLogger("max.pipelines")

__all__ = [
    "GGUF_GLOBAL_NAMES",
    "GGUF_LAYER_NAMES",
    "WeightFactory",
    "compute_dtype",
    "convert_weight",
    "load_weights_into",
    "rename_gguf",
    "rename_hf",
]


# --------------------------------------------------------------------------- dtype policy
def compute_dtype(encoding: Any, device: DeviceRef) -> DType:
    """The dtype a model computes in (and stores its float weights in) for a weight ``encoding``
    (a ``SupportedEncoding`` or None) on ``device``.

    - GGML block encodings (q4_0 ... q6_k) are dequantised: float32 on the CPU, bfloat16 on
      accelerators;
    - float16 runs as float32 on the CPU (no fast CPU fp16 GEMM, and fp16's range is narrow);
    - bfloat16 stays bfloat16 on the CPU only when it has bf16 matrix instructions
      (AVX512-BF16 / AMX); otherwise every matmul would upcast its weights on each call, so the
      weights are widened once, at load;
    - float32 stays float32; on accelerators float encodings keep their dtype.
    """
    from max.engine.kernels.linalg import CPU_NATIVE_BF16

    if encoding is None:
        return DType.float32
    quantized = bool(getattr(encoding, "is_quantized", False))
    dt = DType.uint8 if quantized else encoding.dtype
    if device.is_cpu():
        if quantized or dt in (DType.float16, DType.float8_e4m3fn):
            return DType.float32
        if dt == DType.bfloat16 and not CPU_NATIVE_BF16:
            return DType.float32
        return dt
    return DType.bfloat16 if quantized or dt == DType.float8_e4m3fn else dt


# --------------------------------------------------------------------------- the weight factory
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
                 lora: Any = None, lora_targets: Iterable[str] = ()) -> None:
        self.dtype = dtype
        self.device = device
        self.checkpoint = checkpoint
        self.created: dict[str, Module] = {}
        # LoRA: projections whose last name part is in ``lora_targets`` become ``max.nn.LoRALinear``s
        # sharing the ``LoRAGraphInputs`` ``lora`` (adapters are added per token, never merged)
        self.lora = lora
        self.lora_targets = set(lora_targets)

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
                                                 has_bias=has_bias))
        lin = Linear(in_dim, out_dim, self.dtype, self.device, has_bias=has_bias)
        if tied_to is not None:
            table = tied_to.weight
            if list(table.shape) != [out_dim, in_dim]:
                raise ValueError(f"WeightFactory.linear({name!r}): tied table is {list(table.shape)}, "
                                 f"expected {[out_dim, in_dim]}")
            del lin.weight
            lin.set_shared_weight("weight", table)
        return self._record(name, lin)

    def embedding(self, name: str, vocab_size: int, dim: int) -> Module:
        """A ``[vocab_size, dim]`` lookup table named ``{name}.weight``."""
        return self._record(name, Embedding(vocab_size, dim, self.dtype, self.device))

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


# --------------------------------------------------------------------------- the one conversion
def _torch_of(value: Any) -> tuple[torch.Tensor, Any]:
    """``(tensor, quantization_encoding)`` of a checkpoint handle / WeightData / array."""
    from max.graph.weights.weight_data import WeightData, as_torch

    if hasattr(value, "data") and callable(value.data) and not isinstance(value, torch.Tensor):
        value = value.data()  # a Weights handle: read (memory-mapped) now
    if isinstance(value, WeightData):
        return as_torch(value.data), value.quantization_encoding
    return as_torch(value), None


def convert_weight(name: str, value: Any, target: Weight) -> torch.Tensor:
    """One checkpoint tensor as the value ``target`` (a module's ``Weight``) binds.

    ``value``: a ``Weights`` handle, ``WeightData``, numpy array or torch tensor (the family
    adapter's output for ``name``).  Today GGML-block tensors are dequantised (bit-exact with
    ``gguf.quants``) and every tensor is cast to ``target.dtype``.
    """
    t, enc = _torch_of(value)
    if enc is not None:
        from max.engine.kernels.quantization import dequantize

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
    state: dict[str, torch.Tensor] = {}
    try:
        for name, w in targets.items():
            state[name] = convert_weight(name, adapted[name], w)
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
