"""LoRA-aware linear layers: many adapters (and none) in one batch, without merging weights.

A :class:`LoRALinear` is a :class:`~max.nn.Linear` (same ``weight``/``bias``, loaded the same way)
that adds, for each token, the low-rank update of the adapter its request uses::

    y = x @ W.T (+ b) + ((x @ A) * mask) @ B

``A`` ``[in_dim, L*r]`` and ``B`` ``[L*r, out_dim]`` stack the ``L`` adapter slots of rank up to ``r``
(slot ``s`` owns columns/rows ``s*r .. s*r + r``; a smaller rank is zero-padded; ``B`` carries the
``alpha / rank`` scale), and ``mask`` ``[tokens, L*r]`` has ones in the columns of each token's slot
(a token without an adapter has none).  The stacks and the mask are graph *inputs* shared through one
:class:`LoRAGraphInputs`, so adapters load and unload at run time without recompiling, and a batch
mixing adapters costs two thin matmuls per projection.  The update is one op,
:func:`lora_delta_add` (kernel: ``max.engine.kernels.lora``), which returns ``y`` untouched when no
token of the step uses an adapter.
"""

from __future__ import annotations

from typing import Any, Optional

from max.dtype import DType
from max.graph import DeviceRef, TensorType, TensorValue
from max.graph.ops._common import as_tensor, fail, stage
from max.nn.linear import Linear

__all__ = ["LoRAGraphInputs", "LoRALinear", "lora_delta_add"]


def lora_delta_add(y: Any, x: Any, mask: Any, a: Any, b: Any) -> TensorValue:
    """``y + (((x @ a) * mask) @ b)`` for ``y`` ``[tokens, out]``, ``x`` ``[tokens, in]``, ``mask``
    ``[tokens, w]``, ``a`` ``[in, w]``, ``b`` ``[w, out]`` (``x`` is cast to ``a``'s dtype and the update
    to ``y``'s); a step whose mask is all zero returns ``y`` without computing the update."""
    op = "lora_delta_add"
    yv, xv, mv, av, bv = (as_tensor(t, op=op, arg=n) for t, n in ((y, "y"), (x, "x"), (mask, "mask"), (a, "a"),
                                                                 (b, "b")))
    for v, n in ((yv, "y"), (xv, "x"), (mv, "mask"), (av, "a"), (bv, "b")):
        if v.rank != 2 or not v.dtype.is_float():
            fail(op, f"{n} must be a rank-2 float tensor, got {v.type}")
    if mv.dtype != av.dtype or bv.dtype != av.dtype:
        fail(op, f"mask, a and b must share one dtype, got {mv.dtype}, {av.dtype}, {bv.dtype}", TypeError)
    din, w, dout = av.shape[0], av.shape[1], bv.shape[1]
    if xv.shape[1] != din or bv.shape[0] != w or mv.shape[1] != w or yv.shape[1] != dout:
        fail(op, f"shapes do not fit: y {yv.shape}, x {xv.shape}, mask {mv.shape}, a {av.shape}, b {bv.shape} "
                 "(want y [T, out], x [T, in], mask [T, w], a [in, w], b [w, out])")
    if not (yv.shape[0] == xv.shape[0] == mv.shape[0]):
        fail(op, f"y, x and mask must have the same number of rows, got {yv.shape[0]}, {xv.shape[0]}, {mv.shape[0]}")
    return stage(op, [yv, xv, mv, av, bv], [yv.type], {})[0]


class LoRAGraphInputs:
    """The LoRA inputs of one graph: the token mask and each LoRA module's ``A``/``B`` stacks.

    ``modules``: name -> :class:`LoRALinear`, in the order their inputs follow the mask.  While the
    graph is being built, :meth:`bind` hands the graph's values to the modules.
    """

    def __init__(self, max_loras: int, max_rank: int, dtype: DType, device: DeviceRef) -> None:
        if max_loras < 1 or max_rank < 1:
            raise ValueError(f"LoRAGraphInputs: max_loras and max_rank must be >= 1, got {max_loras}, {max_rank}")
        self.max_loras = max_loras
        self.max_rank = max_rank
        self.dtype = dtype
        self.device = device
        self.modules: dict[str, "LoRALinear"] = {}
        self.mask: Optional[TensorValue] = None
        self.values: dict[str, tuple[TensorValue, TensorValue]] = {}

    @property
    def width(self) -> int:
        return self.max_loras * self.max_rank

    def input_types(self) -> list[TensorType]:
        """The mask's type, then ``A``, ``B`` of every module."""
        w = self.width
        types = [TensorType(self.dtype, ["total_seq_len", w], self.device)]
        for m in self.modules.values():
            types += [TensorType(self.dtype, [m.in_dim, w], self.device),
                      TensorType(self.dtype, [w, m.out_dim], self.device)]
        return types

    def bind(self, values: list[Any]) -> None:
        """Hand the graph values (in :meth:`input_types` order) to the modules."""
        vals = [v.tensor if hasattr(v, "tensor") else v for v in values]
        self.mask = vals[0]
        self.values = {name: (vals[1 + 2 * i], vals[2 + 2 * i]) for i, name in enumerate(self.modules)}


class LoRALinear(Linear):
    """A :class:`~max.nn.Linear` plus the per-token low-rank update of its request's adapter."""

    def __init__(self, in_dim: int, out_dim: int, dtype: DType, device: DeviceRef, lora: LoRAGraphInputs,
                 name: str, has_bias: bool = False, quantization_encoding: Any = None) -> None:
        super().__init__(in_dim, out_dim, dtype, device, has_bias=has_bias,
                         quantization_encoding=quantization_encoding)
        self.lora_name = name
        self._lora = lora
        lora.modules[name] = self

    def __call__(self, x: TensorValue) -> TensorValue:
        y = super().__call__(x)
        ab = self._lora.values.get(self.lora_name)
        if ab is None or self._lora.mask is None:
            return y  # graph built without LoRA inputs
        a, b = ab
        return lora_delta_add(y, x, self._lora.mask, a, b)
