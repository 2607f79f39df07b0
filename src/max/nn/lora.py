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

``max.nn.kernels``' SGMV entry points (segmented gather matrix-vector products, the batch grouped into
row segments that each use one adapter of stacked ``[num_loras, out, in]`` matrices) are defined here
on the same op: :func:`lora_group_mask` turns the segments into the slot mask, and
:func:`sgmv_lora_kernel` is :func:`lora_delta_add` over the stacks viewed as ``A``/``B``.
"""

from __future__ import annotations

from typing import Any, Optional

from max.dtype import DType
from max.graph import DeviceRef, TensorType, TensorValue, ops
from max.graph.ops._common import as_tensor, fail, stage
from max.nn.linear import Linear

__all__ = ["LoRAGraphInputs", "LoRALinear", "lora_delta_add", "lora_group_mask", "sgmv_kernel", "sgmv_lora_kernel",
           "sgmv_qkv_lora_kernel"]


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


def lora_group_mask(input_row_offsets: Any, lora_ids: Any, lora_ranks: Any, rows_of: TensorValue, max_rank: int,
                    num_loras: int, dtype: DType) -> TensorValue:
    """The ``[rows, num_loras * max_rank]`` slot mask of the rows of ``rows_of`` (any ``[rows, ...]``
    tensor): rows ``input_row_offsets[g] .. input_row_offsets[g + 1]`` use adapter ``lora_ids[g]``
    (-1: none) of rank ``lora_ranks[g]``, so their columns ``id * max_rank .. id * max_rank + rank`` are 1; rows past the last group use none."""
    op = "lora_group_mask"
    offs = as_tensor(input_row_offsets, op=op, arg="input_row_offsets")
    ids = as_tensor(lora_ids, op=op, arg="lora_ids")
    ranks = as_tensor(lora_ranks, op=op, arg="lora_ranks")
    for t, n in ((offs, "input_row_offsets"), (ids, "lora_ids"), (ranks, "lora_ranks")):
        if t.rank != 1 or not t.dtype.is_integral():
            fail(op, f"{n} must be a 1-D integer tensor, got {t.type}")
    if ids.shape != ranks.shape:
        fail(op, f"lora_ids {ids.shape} and lora_ranks {ranks.shape} must have one entry per group")
    return stage(op, [offs, ids, ranks, rows_of], [TensorType(dtype, [rows_of.shape[0], num_loras * max_rank],
                                                                rows_of.device)],
                 {"max_rank": int(max_rank), "num_loras": int(num_loras), "dtype": dtype})[0]


def _stack(op: str, t: Any, name: str) -> TensorValue:
    v = as_tensor(t, op=op, arg=name)
    if v.rank != 3 or not v.dtype.is_float():
        fail(op, f"{name} must be a float [num_loras, out, in] stack, got {v.type}")
    return v


def sgmv_lora_kernel(input: Any, lora_a: Any, lora_b: Any, lora_ids: Any, lora_ranks: Any, grouped_row_offsets: Any,
                     max_lora_seq_len: int, bias: Any = None) -> TensorValue:
    """The LoRA update ``x A^T B^T`` of grouped rows (shrink, then expand): ``lora_a`` ``[num_loras, rank,
    in]``, ``lora_b`` ``[num_loras, out, rank]``; rows of group ``g`` (``grouped_row_offsets``) use adapter
    ``lora_ids[g]`` truncated to rank ``lora_ranks[g]``; other rows get zeros (+ ``bias`` ``[out]``).
    Runs as :func:`lora_delta_add` with the stacks as ``A`` ``[in, num_loras * rank]`` and ``B``
    ``[num_loras * rank, out]``; add the result to ``W x`` for ``W x + x A B``."""
    op = "sgmv_lora_kernel"
    x = as_tensor(input, op=op, arg="input")
    a, b = _stack(op, lora_a, "lora_a"), _stack(op, lora_b, "lora_b")
    L, r, din = (int(d) for d in a.shape)
    if x.rank != 2 or int(x.shape[1]) != din:
        fail(op, f"input must be [rows, {din}] to fit lora_a {a.shape}, got {x.shape}")
    if int(b.shape[0]) != L or int(b.shape[2]) != r:
        fail(op, f"lora_b must be [{L}, out, {r}] to fit lora_a {a.shape}, got {b.shape}")
    dout = int(b.shape[1])
    mask = lora_group_mask(grouped_row_offsets, lora_ids, lora_ranks, x, r, L, a.dtype)
    a_st = ops.reshape(ops.permute(a, [2, 0, 1]), [din, L * r])
    b_st = ops.reshape(ops.permute(b, [0, 2, 1]), [L * r, dout])
    y = ops.broadcast_to(ops.constant(0.0, x.dtype, x.device), [x.shape[0], dout])
    if bias is not None:
        bv = as_tensor(bias, op=op, arg="bias")
        if [int(d) for d in bv.shape] != [dout]:
            fail(op, f"bias must be [{dout}], got {bv.shape}")
        y = y + bv.cast(x.dtype)
    return lora_delta_add(y, x, mask, a_st, b_st)


def sgmv_kernel(input: Any, lora: Any, lora_ids: Any, lora_ranks: Any, input_row_offsets: Any, max_lora_seq_len: int,
                bias: Any = None) -> TensorValue:
    """One SGMV product (a LoRA ``A`` or ``B`` alone): rows of group ``g`` times ``lora[lora_ids[g]]^T``
    (``lora`` ``[num_loras, out, in]``, + ``bias[lora_ids[g]]`` ``[num_loras, out]``); other rows get
    zeros.  The stack is zero-padded past each adapter's rank, so ranks only select (checked shapes)."""
    op = "sgmv_kernel"
    x = as_tensor(input, op=op, arg="input")
    w = _stack(op, lora, "lora")
    L, dout, din = (int(d) for d in w.shape)
    if x.rank != 2 or int(x.shape[1]) != din:
        fail(op, f"input must be [rows, {din}] to fit lora {w.shape}, got {x.shape}")
    # one "rank" per adapter = its whole output block: the mask selects the group's block of x @ W_stack
    ones = ops.broadcast_to(ops.constant(dout, DType.int64, x.device), as_tensor(lora_ids, op=op, arg="lora_ids").shape)
    mask = lora_group_mask(input_row_offsets, lora_ids, ones, x, dout, L, x.dtype)
    w_st = ops.reshape(ops.permute(w, [2, 0, 1]), [din, L * dout]).cast(x.dtype)
    y = ops.reshape((x @ w_st) * mask, [-1, L, dout])
    out = ops.squeeze(ops.sum(y, axis=1), 1)
    if bias is not None:
        bv = as_tensor(bias, op=op, arg="bias")
        if [int(d) for d in bv.shape] != [L, dout]:
            fail(op, f"bias must be [{L}, {dout}], got {bv.shape}")
        sel = ops.reshape(mask, [-1, L, dout])
        out = out + ops.squeeze(ops.sum(sel * ops.unsqueeze(bv.cast(x.dtype), 0), axis=1), 1)
    return out


def sgmv_qkv_lora_kernel(input: Any, lora_a: Any, lora_b: Any, lora_ids: Any, lora_ranks: Any,
                         input_row_offsets: Any, lora_grouped_offsets: Any, kv_collection: Any, kv_params: Any,
                         layer_idx: Any, max_lora_seq_len: int, max_rank: int, q_dim: int, kv_dim: int,
                         bias: Any = None) -> TensorValue:
    """The LoRA updates of a fused QKV projection: ``lora_a`` ``[num_loras, 3 * max_rank, in]`` (the Q, K
    and V ``A`` matrices), ``lora_b`` ``[num_loras, q_dim + 2 * kv_dim, max_rank]`` (their ``B``
    matrices); rows grouped by ``lora_grouped_offsets`` as in :func:`sgmv_lora_kernel`.  The K and V
    updates are added into this step's cache slots (``input_row_offsets``: the whole batch); returns the
    Q update ``[rows, q_dim]``."""
    from max.nn.kernels_attention import kv_cache_ragged_radd

    op = "sgmv_qkv_lora_kernel"
    a, b = _stack(op, lora_a, "lora_a"), _stack(op, lora_b, "lora_b")
    r = int(max_rank)
    if int(a.shape[1]) != 3 * r or int(b.shape[2]) != r or int(b.shape[1]) != q_dim + 2 * kv_dim:
        fail(op, f"lora_a must be [num_loras, 3 * {r}, in] and lora_b [num_loras, {q_dim + 2 * kv_dim}, {r}], got "
                 f"{a.shape} and {b.shape}")
    parts = []
    for p, (lo, hi) in enumerate(((0, q_dim), (q_dim, q_dim + kv_dim), (q_dim + kv_dim, q_dim + 2 * kv_dim))):
        parts.append(sgmv_lora_kernel(input, a[:, p * r:(p + 1) * r, :], b[:, lo:hi, :], lora_ids, lora_ranks,
                                      lora_grouped_offsets, max_lora_seq_len))
    kv_cache_ragged_radd(kv_params, ops.concat([parts[1], parts[2]], axis=-1), kv_collection, input_row_offsets, 0,
                         layer_idx)
    q = parts[0]
    if bias is not None:
        q = q + as_tensor(bias, op=op, arg="bias").cast(q.dtype)
    return q
