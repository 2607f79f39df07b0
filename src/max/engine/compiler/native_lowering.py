"""Lowering to the native CPU kernels (``max.engine.native``), as the backend policy decides
(``max.engine.backend``: which kernels exist, the environment's switches, the cost model).

- Every node on the CPU whose kernel has a native path (:data:`NATIVE_KERNELS`, and the native-only ops
  made below) gets ``native``: the kernel variant the policy runs (``BackendPolicy.kernel_variant``).
  The kernel runs its native code on that variant's library (``native.library``) where its operands
  suit it (dtype, layout) and its torch code otherwise; without ``native`` it runs torch.  This is the
  only place the choice is made: a policy without native kernels (``backend.use``) reaches every kernel.

- GGML block-quantised weights of ``fused_matmul_t`` nodes on the CPU are
  repacked into the kernels' interleaved layout by a ``pack_qweight`` node.
  Its operand is a weight, so load-time weight folding runs it once and binds
  only the packed tensor: the GGML copy is not kept (unless something else,
  such as an embedding lookup, still reads it).  A weight read through a load-time conversion
  (``gptq_to_q4_0``: GPTQ rows as Q4_0 blocks) is packed the same way (the conversion folds first).
- Every ``fused_matmul_t`` node gets the policy's choice as attributes:
  ``native_max_m`` (the native kernels run below that many rows, torch from
  there on) and ``exact`` (``LIBREMAX_QMATMUL=exact``: quantised projections
  keep float32 activations -- dequantised weight tiles, torch matmul --
  instead of the native kernels' 8-bit activation codes; nothing is packed).
- ``qmatmul`` nodes get ``fast`` (``LIBREMAX_QMATMUL_FAST=1``: torch's int4
  GEMM with bfloat16 activations).
- ``flash_attention_ragged`` on the CPU (causal, sliding-window or chunked mask) reads the paged cache
  directly (``flash_attention_ragged_native``): the padded per-step index tensors the
  torch kernel needs (``ragged_read_plan``) become dead and are removed.
- ``cross_attention_ragged`` without a mask on the CPU reads the pages in place
  too (``cross_attention_ragged_native``, the same native kernel).
- An embedding lookup (``gather`` of GGML rows, [``reshape``], ``dequantize``) on a table that is also
  packed for a projection (tied input/output embeddings) reads its rows from the packed copy
  (``packed_gather_f32``): the GGML table is then unused after load, so the model keeps one copy of it
  and the lookups touch no pages of the checkpoint file.
- A ``ragged_qkv_store`` whose queries only the next ``flash_attention_ragged_native`` of the same layer
  reads becomes one ``qkv_attention_native`` node with it (one native call per layer and step: the K/V
  write, then the attention; the queries never leave the kernel), which also absorbs a ``reshape`` of the
  result to ``[T, H * D]``.  The node sits where the attention was (only index casts lie between the two).
- ``add(r, fused_matmul_t(x, W..))`` (either order, same type, float32 on the CPU) where every weight is
  packed, nothing gates the result and the add is the projection's only reader becomes one
  ``fused_matmul_t`` with ``residual``: ``r`` is its last operand, added in the native kernel's epilogue
  (``lmx_packed_matmul_res``; the same float32 sums as the separate add).  Dense weights keep the add.
- The native attention and KV-store kernels take int64 index operands (row offsets, cache lengths,
  page lookup, token positions, write pages/offsets).  They are the same values for every layer of a
  step, so each one that is narrower is cast to int64 once, by one ``cast`` node that every layer's
  call reads (not once per layer and call).
"""

from __future__ import annotations

from typing import Optional

from max.dtype import DType
from max.engine.backend import BackendPolicy, current
from max.engine.compiler import linear_fusion
from max.engine.compiler.program import PNode, Program
from max.graph.dim import StaticDim
from max.graph.type import TensorType

_CONST_OPS = {"weight", "constant", "bound"}
_LOAD_CONVERSIONS = {"gptq_to_q4_0"}
"""Pure ops from weights to GGML blocks that load-time weight folding runs before ``pack_qweight``."""


def _constant(producer: dict, w: int) -> bool:
    src = producer.get(w)
    if src is not None and src.op in _LOAD_CONVERSIONS and len(src.inputs) == 1:
        src = producer.get(src.inputs[0])
    return src is not None and src.op in _CONST_OPS


# cache dtypes lmx_paged_attention reads (int8 / fp8 e4m3fn: codes + a float32 scale per row)
_NATIVE_CACHE_DTYPES = (DType.float32, DType.bfloat16, DType.int8, DType.float8_e4m3fn)

def _fresh_id(prog: Program) -> int:
    top = max([*prog.types, *prog.input_ids, *(o for n in prog.nodes for o in n.outs)], default=0)
    return top + 1


def _with(n: PNode, **attrs: object) -> PNode:
    return PNode(n.op, n.inputs, dict(n.attrs, **attrs), n.types, n.outs, n.loc, n.side_effects, n.regions)


NATIVE_KERNELS = frozenset({
    "fused_matmul_t", "fused_rms_norm", "gated_rms_norm", "dequantize", "ragged_qkv_store", "ragged_attention",
    "moe_experts_ffn", "causal_conv1d", "selective_scan", "gated_delta_rule",
})
"""Ops whose kernel has a native path beside its torch one (a kernel added with one joins this set and
takes ``native: str | None = None``).  The ops this lowering makes (``pack_qweight``, ``packed_gather_f32``,
``flash_attention_ragged_native``, ``cross_attention_ragged_native``, ``qkv_attention_native``) are native
only and get ``native`` where they are made."""


def native_attrs(op: str, device: object, policy: BackendPolicy) -> dict:
    """``{"native": variant}`` for an ``op`` of :data:`NATIVE_KERNELS` on the CPU ``device`` under ``policy``
    (else ``{}``): what this lowering writes into such a node, and what eager execution passes its kernel."""
    on_cpu = device is not None and device.is_cpu()  # type: ignore[attr-defined]
    variant = policy.kernel_variant(on_cpu) if op in NATIVE_KERNELS else None
    return {"native": variant} if variant else {}


def _device(prog: Program, n: PNode) -> object:
    """The device of ``n``'s first tensor result (else of its first tensor operand), or None."""
    for t in (*n.types, *(prog.types.get(i) for i in n.inputs)):
        if isinstance(t, TensorType):
            return t.device
    return None


def lower(prog: Program, policy: Optional[BackendPolicy] = None) -> dict[str, int]:
    """Rewrite ``prog`` in place as ``policy`` (default: this process's) decides; returns counts per rewrite."""
    from max.engine import native

    policy = policy or current()
    producer = prog.producer_map()
    out: list[PNode] = []
    counts = {"pack_qweight": 0, "flash_attention_ragged_native": 0, "cross_attention_ragged_native": 0,
              "native_matmul": 0, "int64_index_cast": 0}
    next_id = _fresh_id(prog)
    as_i64: dict[int, int] = {}

    def int64_of(v: int, loc: object) -> int:
        """``v`` as int64: itself when it is, else the one cast node made for it (appended to ``out``)."""
        nonlocal next_id
        t = prog.types[v]
        if not isinstance(t, TensorType) or t.dtype == DType.int64 or not t.dtype.is_integral():
            return v
        if v not in as_i64:
            as_i64[v] = pid = next_id
            next_id += 1
            prog.types[pid] = typ = TensorType(DType.int64, t.shape, t.device)
            out.append(PNode("cast", (v,), {"dtype": DType.int64}, (typ,), (pid,), loc))
            counts["int64_index_cast"] += 1
        return as_i64[v]

    for n in prog.nodes:
        dev = _device(prog, n)
        on_cpu = dev is not None and dev.is_cpu()
        variant = policy.kernel_variant(on_cpu)  # for the native-only ops made below
        choice = native_attrs(n.op, dev, policy)
        if choice:
            n = _with(n, **choice)
        if n.op == "qmatmul" and policy.fast_int4_qmatmul:
            n = _with(n, fast=True)
        if n.op == linear_fusion.OP:
            x0, ws0, _ = linear_fusion.parts(n)
            choice = policy.matmul_choice(n.attrs["kinds"], [prog.types[w].dtype for w in ws0],
                                          prog.types[x0].dtype, on_cpu)
            n = _with(n, native_max_m=choice.native_max_m, **({"exact": True} if choice.exact else {}))
            counts["native_matmul"] += choice.native_max_m > 0
        if not policy.native:
            out.append(n)
            continue
        if n.op == linear_fusion.OP and on_cpu and not n.attrs.get("exact"):
            x, ws, bs = linear_fusion.parts(n)
            kinds = list(n.attrs["kinds"])
            new_ws = list(ws)
            for i, (kind, w) in enumerate(zip(kinds, ws)):
                code = native.GGML_KINDS.get(kind)
                if code is None or not native.packable(code) or not _constant(producer, w):
                    continue
                nbytes = native.packed_nbytes(code, n.attrs["ns"][i], n.attrs["k"])
                typ = TensorType(DType.uint8, [nbytes], dev)
                pid = next_id
                next_id += 1
                prog.types[pid] = typ
                out.append(PNode("pack_qweight", (w,), {"kind": code, "n": n.attrs["ns"][i], "k": n.attrs["k"],
                                                        "native": variant}, (typ,), (pid,), n.loc))
                new_ws[i] = pid
                kinds[i] = "packed:" + kind
                counts["pack_qweight"] += 1
            if new_ws != ws:
                attrs = dict(n.attrs, kinds=tuple(kinds))
                n = PNode(n.op, (x, *new_ws, *bs, *linear_fusion.norm_operand(n)), attrs, n.types, n.outs, n.loc,
                          n.side_effects, n.regions)
        elif n.op == "flash_attention_ragged" and on_cpu and n.attrs.get("native_operands"):
            # operands: q, blocks, 6 read-plan tensors, offsets, cache_lengths, lookup (+ chain)
            q, blocks = n.inputs[0], n.inputs[1]
            rest = n.inputs[8:]
            cache_dt = prog.types[blocks].dtype
            if cache_dt in _NATIVE_CACHE_DTYPES and prog.types[q].dtype == DType.float32:
                attrs = {k: v for k, v in n.attrs.items() if k != "native_operands"}
                attrs["native"] = variant
                idx = [int64_of(v, n.loc) for v in rest[:3]]  # offsets, cache_lengths, lookup
                n = PNode("flash_attention_ragged_native", (q, blocks, *idx, *rest[3:]), attrs, n.types, n.outs,
                          n.loc, n.side_effects, n.regions)
                counts["flash_attention_ragged_native"] += 1
        elif n.op == "ragged_qkv_store" and on_cpu:
            # operands: qkv, [freqs], [q gamma], [k gamma], blocks, token positions, write pages, write offsets
            head, tail = n.inputs[:-3], n.inputs[-3:]
            new = (*head, *(int64_of(v, n.loc) for v in tail))
            if new != n.inputs:
                n = PNode(n.op, new, n.attrs, n.types, n.outs, n.loc, n.side_effects, n.regions)
        elif (n.op == "cross_attention_ragged" and on_cpu and not n.attrs["causal"] and n.attrs["window"] <= 0
              and prog.types[n.inputs[0]].dtype == DType.float32
              and prog.types[n.inputs[1]].dtype in _NATIVE_CACHE_DTYPES):
            n = PNode("cross_attention_ragged_native", n.inputs, dict(n.attrs, native=variant), n.types, n.outs,
                      n.loc, n.side_effects, n.regions)
            counts["cross_attention_ragged_native"] += 1
        out.append(n)
    prog.nodes = out
    counts["packed_embedding"] = _embeddings_from_packed(prog)
    counts["qkv_attention_native"] = _fuse_qkv_attention(prog)
    if policy.native:
        counts["residual_epilogue"] = _fuse_residual(prog)
    return {k: v for k, v in counts.items() if v}


def _fuse_qkv_attention(prog: Program) -> int:
    """``ragged_qkv_store`` + ``flash_attention_ragged_native`` [+ ``reshape``] -> ``qkv_attention_native``."""
    from max.graph.type import _ChainType

    def chain(v: int) -> bool:
        return isinstance(prog.types.get(v), _ChainType)

    users: dict[int, list[int]] = {}
    for j, n in enumerate(prog.nodes):
        for i in n.inputs:
            users.setdefault(i, []).append(j)
    pinned = set(prog.output_ids) | _used_in_regions(prog)
    pos = {o: j for j, n in enumerate(prog.nodes) for o in n.outs}
    drop: set[int] = set()
    replace: dict[int, PNode] = {}
    for ja, a in enumerate(prog.nodes):
        if a.op != "flash_attention_ragged_native" or not a.inputs:
            continue
        q = a.inputs[0]
        js = pos.get(q)
        if js is None or js in drop:
            continue
        s = prog.nodes[js]
        s_data = [i for i in s.inputs if not chain(i)]
        a_data = [i for i in a.inputs if not chain(i)]
        if (s.op != "ragged_qkv_store" or s.attrs["layer"] != a.attrs["layer"] or s.outs[0] != q
                or s.attrs["head_dim"] != a.attrs["head_dim"] or len(a_data) != 5 or s_data[-4] != a_data[1]
                or any(users.get(o, []) != [ja] or o in pinned for o in s.outs)
                or any(m.side_effects or set(m.inputs) & set(s.outs) for m in prog.nodes[js + 1:ja])):
            continue
        out_id, out_t = a.outs[0], a.types[0]
        flat = False
        r_users = users.get(out_id, [])
        if len(r_users) == 1 and out_id not in pinned:
            r = prog.nodes[r_users[0]]
            qt, rt = prog.types[q], r.types[0]
            if (r.op == "reshape" and r.inputs == (out_id,) and isinstance(rt, TensorType) and len(rt.shape) == 2
                    and len(qt.shape) == 3 and rt.shape[0] == qt.shape[0]
                    and all(isinstance(d, StaticDim) for d in (rt.shape[1], qt.shape[1], qt.shape[2]))
                    and rt.shape[1].dim == qt.shape[1].dim * qt.shape[2].dim):
                flat = True
                drop.add(r_users[0])
                out_id, out_t = r.outs[0], rt
        attrs = {k: v for k, v in s.attrs.items()}
        attrs.update({k: a.attrs[k] for k in ("scale", "causal", "window", "chunk") if k in a.attrs}, flat=flat)
        outs = [(out_id, out_t)] + [(o, t) for o, t in zip(a.outs, a.types) if chain(o)]
        inputs = (*s_data, *a_data[2:], *(i for i in s.inputs if chain(i)))
        replace[ja] = PNode("qkv_attention_native", inputs, attrs, tuple(t for _, t in outs),
                            tuple(o for o, _ in outs), a.loc, True, ())
        drop.add(js)
    if not replace:
        return 0
    prog.nodes = [replace.get(j, n) for j, n in enumerate(prog.nodes) if j not in drop]
    return len(replace)


def _fuse_residual(prog: Program) -> int:
    """``add(r, fused_matmul_t(..))`` -> ``fused_matmul_t(.., r, residual=True)`` (see the module docstring)."""
    users: dict[int, int] = {}
    for n in prog.nodes:
        for i in n.inputs:
            users[i] = users.get(i, 0) + 1
    pinned = set(prog.output_ids) | _used_in_regions(prog)
    producer = {o: j for j, n in enumerate(prog.nodes) for o in n.outs}
    drop: set[int] = set()
    replace: dict[int, PNode] = {}
    for ja, a in enumerate(prog.nodes):
        if a.op != "add" or len(a.inputs) != 2 or len(a.outs) != 1 or a.regions:
            continue
        t = a.types[0]
        if not (isinstance(t, TensorType) and t.dtype == DType.float32 and t.device.is_cpu()):
            continue
        for mm, r in (a.inputs, a.inputs[::-1]):
            jp = producer.get(mm)
            p = prog.nodes[jp] if jp is not None else None
            if (p is None or jp in drop or p.op != linear_fusion.OP or p.outs != (mm,) or users.get(mm) != 1
                    or mm in pinned or mm == r or p.attrs.get("act") is not None or p.attrs.get("exact")
                    or p.attrs.get("residual") or p.attrs.get("native_max_m", 0) <= 0
                    or not all(str(k).startswith("packed:") for k in p.attrs["kinds"])
                    or str(prog.types[mm]) != str(t) or str(prog.types[r]) != str(t)):
                continue
            replace[ja] = PNode(p.op, (*p.inputs, r), dict(p.attrs, residual=True), a.types, a.outs, p.loc,
                                p.side_effects, p.regions)
            drop.add(jp)
            break
    if not replace:
        return 0
    prog.nodes = [replace.get(j, n) for j, n in enumerate(prog.nodes) if j not in drop]
    return len(replace)


def _used_in_regions(prog: Program) -> set[int]:
    used: set[int] = set()
    for n in prog.nodes:
        for sub in n.regions:
            used.update(i for m in sub.nodes for i in m.inputs)
            used.update(sub.output_ids)
            used.update(_used_in_regions(sub))
    return used


def _embeddings_from_packed(prog: Program) -> int:
    """Rewrite ``dequantize([reshape](gather(W, idx)))`` as ``packed_gather_f32(pack(W), idx)`` where ``W``
    is packed for a projection anyway; the pack node moves before its first use."""
    from max.engine import native

    packs = {n.inputs[0]: n for n in prog.nodes if n.op == "pack_qweight"}
    if not packs:
        return 0
    users: dict[int, list[PNode]] = {}
    for n in prog.nodes:
        for i in n.inputs:
            users.setdefault(i, []).append(n)
    pinned = set(prog.output_ids) | _used_in_regions(prog)

    def only_user(v: int, op: str) -> PNode | None:
        us = users.get(v, [])
        return us[0] if len(us) == 1 and us[0].op == op and v not in pinned else None

    replace: dict[int, PNode] = {}  # id(dequantize node) -> its replacement
    first_use: dict[int, int] = {}  # id(pack node) -> id(the gather node it must precede)
    for g in prog.nodes:
        if g.op != "gather" or g.inputs[0] not in packs or g.attrs.get("axis", 0) != 0:
            continue
        pack = packs[g.inputs[0]]
        r = only_user(g.outs[0], "reshape")  # gone when the indices are already 1-D
        d = only_user(g.outs[0] if r is None else r.outs[0], "dequantize")
        if d is None or native.GGML_KINDS.get(str(d.attrs.get("encoding")).upper()) != pack.attrs["kind"]:
            continue
        replace[id(d)] = PNode("packed_gather_f32", (pack.outs[0], g.inputs[1]), dict(pack.attrs), d.types, d.outs,
                               d.loc)
        first_use.setdefault(id(pack), id(g))
    if not replace:
        return 0
    moved = {id(p) for p in packs.values() if id(p) in first_use}
    before = {first_use[id(p)]: p for p in packs.values() if id(p) in first_use}
    nodes: list[PNode] = []
    for n in prog.nodes:
        if id(n) in before:
            nodes.append(before[id(n)])
        if id(n) in moved:
            continue
        nodes.append(replace.get(id(n), n))
    prog.nodes = nodes
    return len(replace)
