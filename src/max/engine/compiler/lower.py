"""Lowering a :class:`Program` to a ``torch.fx`` GraphModule.

The generated ``forward(env, consts, *inputs)`` calls one kernel per node
(``engine/kernels``), frees each value after its last use (fx codegen), and
takes constants and weights through ``consts`` so one compiled module serves
every load of structurally equal graphs (the compile cache).  ``env`` maps
symbolic dim names to their sizes for this call.
"""

from __future__ import annotations

import enum
import operator
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from max.dtype import DType
from max.engine.compiler.passes import attr_key
from max.engine.compiler.program import PNode, Program
from max.engine.kernels import KERNELS
from max.graph.dim import Dim, StaticDim
from max.graph.shape import Shape
from max.graph.type import BufferType, DeviceRef, TensorType, _ChainType

_LITERAL = (type(None), bool, int, float, str)


class _NeedsEnv(Exception):
    pass


def torch_device(ref: DeviceRef) -> torch.device:
    return torch.device("cpu") if ref.is_cpu() else torch.device("cuda", ref.id)


def resolve_static(v: Any) -> Any:
    """Attribute value -> fx-printable literal; raises _NeedsEnv for symbolic dims."""
    if isinstance(v, _LITERAL) or v is Ellipsis:
        return v
    if isinstance(v, StaticDim):
        return v.dim
    if isinstance(v, Dim):
        raise _NeedsEnv
    if isinstance(v, DType):
        return v.to_torch()
    if isinstance(v, DeviceRef):
        return torch_device(v)
    if isinstance(v, (torch.dtype, torch.device)):
        return v
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, Shape):
        return tuple(resolve_static(d) for d in v)
    if isinstance(v, tuple):
        return tuple(resolve_static(x) for x in v)
    if isinstance(v, list):
        return [resolve_static(x) for x in v]
    if isinstance(v, slice):
        return slice(resolve_static(v.start), resolve_static(v.stop), resolve_static(v.step))
    if isinstance(v, dict):
        return {k: resolve_static(x) for k, x in v.items()}
    raise TypeError  # not a literal: pass through consts


def resolve_env(v: Any, env: dict) -> Any:
    """Like resolve_static, evaluating symbolic dims from ``env`` (runs at execution)."""
    if isinstance(v, Dim):
        return v.evaluate(env)
    if isinstance(v, Shape):
        return tuple(d.evaluate(env) for d in v)
    if isinstance(v, tuple):
        return tuple(resolve_env(x, env) for x in v)
    if isinstance(v, list):
        return [resolve_env(x, env) for x in v]
    if isinstance(v, slice):
        return slice(resolve_env(v.start, env), resolve_env(v.stop, env), resolve_env(v.step, env))
    if isinstance(v, dict):
        return {k: resolve_env(x, env) for k, x in v.items()}
    if isinstance(v, DType):
        return v.to_torch()
    if isinstance(v, DeviceRef):
        return torch_device(v)
    if isinstance(v, enum.Enum):
        return v.value
    return v


def resolve_attrs_now(attrs: dict, env: dict | None) -> dict:
    """Resolve attributes eagerly (constant folding / eager execution)."""
    return {k: resolve_env(v, env or {}) for k, v in attrs.items() if not k.startswith("_")}


class UnboundDimError(KeyError):
    """A node attribute names a symbolic dim with no value in ``env``."""


def call_kernel(spec: Any, args: list, attrs: dict, env: dict | None = None) -> tuple[Any, dict]:
    """Run one node's kernel now: ``spec.fn(*args, **kwargs)`` with ``attrs`` resolved against
    ``env`` (symbolic dim values); returns ``(result, kwargs)``.  The one path for constant
    folding, load-time weight folding and eager tensors (the lowered code makes the same call
    from generated Python).  UnboundDimError when a symbolic dim has no value."""
    try:
        kwargs = resolve_attrs_now(attrs, env)
    except KeyError as e:
        raise UnboundDimError(*e.args) from None
    return spec.fn(*args, **kwargs), kwargs


def _bind_dims(env: dict, t: torch.Tensor, shape: Shape, what: str) -> torch.Tensor:
    """Bind new symbolic dims from a data-dependent result; check known ones."""
    if t.dim() != len(shape):
        raise RuntimeError(f"{what}: result has rank {t.dim()}, expected {len(shape)}")
    for i, d in enumerate(shape):
        n = t.shape[i]
        if isinstance(d, StaticDim):
            if n != d.dim:
                raise RuntimeError(f"{what}: dim {i} is {n}, expected {d.dim}")
        elif type(d).__name__ == "SymbolicDim":
            prev = env.get(d.name)  # type: ignore[attr-defined]
            if prev is None:
                env[d.name] = n  # type: ignore[attr-defined]
            elif prev != n:
                raise RuntimeError(f"{what}: dim {i} ({d}) is {n}, but {d} is {prev} elsewhere")
        else:
            try:
                want = d.evaluate(env)
            except KeyError:
                continue
            if want != n:
                raise RuntimeError(f"{what}: dim {i} ({d}) is {n}, expected {want}")
    return t


@dataclass
class Lowered:
    module: fx.GraphModule
    recipes: list[tuple]  # per consts slot: (kind, node index, attr name | result index)
    node_of_var: dict[str, int]  # fx variable name -> node index
    code_file: str


def materialize_slots(prog: Program, recipes: list[tuple]) -> list[tuple[str, Any, Any]]:
    """The consts entries of ``prog`` for a (possibly cached) lowering's slot recipes."""
    out = []
    for kind, j, k in recipes:
        n = prog.nodes[j]
        if kind == "constant":
            out.append(("constant", n.attrs["value"], n.types[0]))
        elif kind == "weight":
            out.append(("weight", n.attrs["name"], n.types[0]))
        elif kind == "bound":
            out.append(("bound", n.attrs["_tensor"], n.types[0]))
        elif kind == "attr":
            out.append(("attr", n.attrs[k], None))
        elif kind == "region":
            out.append(("region", n, prog))
        elif kind == "prepared":
            out.append(("prepared", (n, k), None))
        else:  # "shape"
            out.append(("attr", n.types[k].shape, None))
    return out


_CACHE: "OrderedDict[Any, Lowered]" = OrderedDict()
_CACHE_SIZE = 64
cache_stats = {"hits": 0, "misses": 0}


def structural_key(prog: Program) -> Any:
    parts: list[Any] = [prog.input_ids, tuple(map(str, prog.input_types)), prog.output_ids]
    for n in prog.nodes:
        if n.op == "constant":
            a = attr_key(n.attrs["value"])
            parts.append(("constant", n.outs, a if a[0] == "nd" else ("nd-shape", str(n.types[0]))))
        elif n.op == "bound":
            parts.append(("bound", n.outs, str(n.types[0])))
        else:
            parts.append((n.op, n.inputs, attr_key(n.attrs), tuple(map(str, n.types)), n.outs, bool(n.regions)))
    return tuple(parts)


def lower(prog: Program) -> Lowered:
    """Lower with the compile cache (structurally equal programs share the module)."""
    if any(n.regions for n in prog.nodes):
        return _lower(prog)
    try:
        key = structural_key(prog)
        hash(key)
    except TypeError:
        return _lower(prog)
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        cache_stats["hits"] += 1
        return hit
    cache_stats["misses"] += 1
    res = _lower(prog)
    _CACHE[key] = res
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return res


def _lower(prog: Program) -> Lowered:
    g = fx.Graph()
    env = g.placeholder("env")
    consts = g.placeholder("consts")
    vals: dict[int, Any] = {}
    for k, (i, t) in enumerate(zip(prog.input_ids, prog.input_types)):
        vals[i] = None if isinstance(t, _ChainType) else g.placeholder(f"in{k}")
    slots: list[tuple] = []
    node_of_var: dict[str, int] = {}
    known_syms: set[str] = set()
    for t in prog.input_types:
        if isinstance(t, (TensorType, BufferType)):
            known_syms.update(p.name for p in t.shape.parameters)

    const_slot: dict[int, int] = {}  # value id -> its consts slot (constants, weights, folded values)

    def const_ref(entry: tuple) -> Any:
        slots.append(entry)
        return g.call_function(operator.getitem, (consts, len(slots) - 1))

    def const_value(vid: int, entry: tuple) -> Any:
        node = const_ref(entry)
        const_slot[vid] = len(slots) - 1
        return node

    for j, n in enumerate(prog.nodes):
        if n.op == "constant":
            vals[n.outs[0]] = const_value(n.outs[0], ("constant", j, None))
            continue
        if n.op == "weight":
            vals[n.outs[0]] = const_value(n.outs[0], ("weight", j, None))
            continue
        if n.op == "bound":
            vals[n.outs[0]] = const_value(n.outs[0], ("bound", j, None))
            continue
        if n.op in ("chain", "merge_chains"):
            for o in n.outs:
                vals[o] = None
            continue
        spec = KERNELS.get(n.op)
        if spec is None:
            raise NotImplementedError(
                f"op {n.op!r} (created at {n.loc}) has no kernel in the engine's kernel table"
            )
        in_ids = [i for i in n.inputs if not _is_chain(prog, i)]
        if spec.prepare is not None and not n.regions and any(i in const_slot for i in in_ids):
            try:
                for k, v in n.attrs.items():
                    if not k.startswith("_"):
                        resolve_static(v)
                static_ok = True
            except (_NeedsEnv, TypeError):
                static_ok = False
            if static_ok:
                # specialised once at load from the constant operands; called with the others
                runner = const_ref(("prepared", j, tuple(const_slot.get(i) for i in in_ids)))
                r = g.call_method("__call__", (runner, *(vals[i] for i in in_ids if i not in const_slot)))
                node_of_var[r.name] = j
                _assign_results(g, prog, n, r, vals, node_of_var, j, env, const_ref, known_syms)
                continue
        args = tuple(vals[i] for i in in_ids)
        kwargs = {}
        for k, v in n.attrs.items():
            if k.startswith("_"):
                continue
            try:
                kwargs[k] = resolve_static(v)
            except _NeedsEnv:
                kwargs[k] = g.call_function(resolve_env, (const_ref(("attr", j, k)), env))
            except TypeError:
                kwargs[k] = const_ref(("attr", j, k))
        if n.regions:
            kwargs["env"] = env
            kwargs["runners"] = const_ref(("region", j, None))
        r = g.call_function(spec.fn, args, kwargs)
        node_of_var[r.name] = j
        _assign_results(g, prog, n, r, vals, node_of_var, j, env, const_ref, known_syms)
    outs = []
    for i in prog.output_ids:
        outs.append(vals[i])
    g.output(tuple(outs))
    gm = fx.GraphModule(torch.nn.Module(), g, class_name=f"Compiled_{_ident(prog.name)}")
    code_file = gm.forward.__code__.co_filename
    return Lowered(gm, slots, node_of_var, code_file)


def _assign_results(g: fx.Graph, prog: Program, n: PNode, r: Any, vals: dict, node_of_var: dict, j: int, env: Any,
                    const_ref: Callable, known_syms: set) -> None:
    """Bind the fx value(s) of node ``n``'s call ``r`` to its result ids (checking new symbolic dims)."""
    tensor_outs = [(o, t) for o, t in zip(n.outs, n.types) if not isinstance(t, _ChainType)]
    for o, t in zip(n.outs, n.types):
        if isinstance(t, _ChainType):
            vals[o] = None
    multi = n.attrs.get("_multi", False)
    if len(tensor_outs) == 1 and len(n.outs) == 1 and not multi:
        vals[n.outs[0]] = r
    elif len(tensor_outs) == 1 and not multi:
        vals[tensor_outs[0][0]] = r
    else:
        for k, (o, t) in enumerate(tensor_outs):
            vals[o] = g.call_function(operator.getitem, (r, k))
            node_of_var[vals[o].name] = j
    for ri, (o, t) in enumerate(zip(n.outs, n.types)):
        if isinstance(t, (TensorType, BufferType)):
            new = {p.name for p in t.shape.parameters} - known_syms
            if new or (not Shape.is_static(t.shape) and n.attrs.get("_check_shape")):
                sh = const_ref(("shape", j, ri))
                vals[o] = g.call_function(_bind_dims, (env, vals[o], sh, f"{n.op} at {n.loc}"))
                known_syms.update(new)


def _is_chain(prog: Program, vid: int) -> bool:
    return isinstance(prog.types.get(vid), _ChainType)


def _ident(s: str) -> str:
    return re.sub(r"\W", "_", s)[:40] or "graph"


def locate_error(lowered: Lowered, prog: Program, tb: Any) -> PNode | None:
    """The graph node whose kernel raised, from a traceback through the generated code."""
    import linecache

    node = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == lowered.code_file:
            line = linecache.getline(lowered.code_file, tb.tb_lineno)
            if not line:
                src = lowered.module.code.splitlines()
                line = src[tb.tb_lineno - 1] if 0 < tb.tb_lineno <= len(src) else ""
            m = re.match(r"\s*(\w+)\s*=", line)
            if m and m.group(1) in lowered.node_of_var:
                node = prog.nodes[lowered.node_of_var[m.group(1)]]
        tb = tb.tb_next
    return node
