"""``Graph``: an ordered list of typed nodes, built by calling ops inside it.

A node is ``(op name, operands, attributes, result types)`` plus the user
source line that created it.  Ops find the graph they stage into through
:attr:`Graph.current` (entered with ``with Graph(...)``).  Side-effecting ops
(buffer loads/stores, prints, in-place custom ops) consume and produce chain
values, threaded through ``Graph._current_chain``, so they never reorder.
"""

from __future__ import annotations

import contextvars
import enum
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from max.graph.type import (
    BufferType,
    DeviceRef,
    TensorType,
    Type,
    _ChainType,
    _OpaqueType,
)

_ACTIVE: contextvars.ContextVar[tuple] = contextvars.ContextVar("max_graph_active", default=())

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../src/max


def _user_location() -> str:
    """``file:line`` of the innermost frame outside the ``max`` package."""
    f = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_PKG_DIR):
            return f"{fn}:{f.f_lineno}"
        f = f.f_back
    return "<unknown>"


class Node:
    """One operation in a graph."""

    __slots__ = ("op", "inputs", "attrs", "results", "loc", "graph", "regions", "side_effects")

    def __init__(self, graph: "Graph", op: str, inputs: tuple, attrs: dict, loc: str,
                 side_effects: bool = False, regions: tuple = ()) -> None:
        self.graph = graph
        self.op = op
        self.inputs = inputs
        self.attrs = attrs
        self.loc = loc
        self.results: tuple = ()
        self.side_effects = side_effects
        self.regions = regions

    def __repr__(self) -> str:
        return f"Node({self.op}, loc={self.loc})"


class DevicePlacementPolicy(enum.Enum):
    """What building an op that must run on the host does with operands on an accelerator
    (libremax's host-only kernels: ``non_maximum_suppression`` and casts to/from float4/float6):
    ``Ignore`` transfers silently, ``Warn`` (the default) also emits a UserWarning naming the op,
    ``Error`` raises ValueError at build time.  Set with ``Graph(..., strict_device_placement=...)``.
    """

    Ignore = "ignore"
    Warn = "warn"
    Error = "error"


class NoGraphError(LookupError, RuntimeError):
    """An op (or weight) was used while no graph is being built.

    A LookupError, as MAX raises; also a RuntimeError, as libremax raised before.
    """


class _GraphMeta(type):
    @property
    def current(cls) -> "Graph":
        """The graph ops are staged into now (innermost ``with Graph(...)``)."""
        active = _ACTIVE.get()
        if not active:
            raise NoGraphError(
                "no graph is being built: call ops inside `with Graph(name, input_types=...) as g:` "
                "or in the `forward` callable passed to Graph(...)"
            )
        return active[-1]


class Graph(metaclass=_GraphMeta):
    """A named dataflow routine.

    Build it with a ``forward`` callable (``Graph("f", fn, input_types=[...])``)
    or as a context manager, then set results with :meth:`output`.  A Graph is
    not callable: compile it with ``InferenceSession.load``.
    """

    def __init__(
        self,
        name: str = "graph",
        forward: Callable[..., Any] | None = None,
        input_types: Iterable[Type] = (),
        path: Path | None = None,
        *args: Any,
        custom_extensions: Sequence[Any] = (),
        context: Any = None,
        kernel_library: Any = None,
        module: Any = None,
        _parent: "Graph | None" = None,
        strict_device_placement: "DevicePlacementPolicy | str" = "warn",
        **kwargs: Any,
    ) -> None:
        from max.graph.value import _make_value

        if path is not None:
            raise NotImplementedError(
                "Graph(path=...): loading saved MLIR graphs is not supported by libremax; "
                "build the graph in Python instead"
            )
        if not isinstance(name, str) or not name:
            raise TypeError(f"Graph: name must be a non-empty str, got {name!r}")
        self.name = name
        self._parent = _parent
        self._nodes: list[Node] = []
        self._outputs: tuple | None = None
        self._weights: dict[str, tuple[Any, Any]] = {}
        self._subgraphs: dict[str, Graph] = {}
        self._kernel_paths: list[Path] = []
        self._custom_extensions = _as_extension_list(custom_extensions)
        self.kernel_library = kernel_library
        try:
            self.strict_device_placement = DevicePlacementPolicy(
                getattr(strict_device_placement, "value", strict_device_placement))
        except ValueError:
            raise ValueError(f"Graph {name!r}: strict_device_placement must be a DevicePlacementPolicy "
                             f"(ignore/warn/error), got {strict_device_placement!r}") from None
        self._entered = 0
        self._version = 0  # bumped on every mutation (engine caches check it)

        types = list(input_types)
        for i, t in enumerate(types):
            if not isinstance(t, Type):
                raise TypeError(
                    f"Graph {name!r}: input_types[{i}] must be a TensorType, BufferType or other graph Type, "
                    f"got {type(t).__name__} {t!r}"
                )
        types = [_own_type(t) for t in types]
        if _parent is not None:
            types.append(_ChainType())
        self._input_types = tuple(types)
        inputs = []
        for i, t in enumerate(types):
            node = Node(self, "input", (), {"index": i}, "<input>")
            node.results = (_make_value(self, node, 0, t),)
            self._nodes.append(node)
            inputs.append(node.results[0])
        self._inputs = tuple(inputs)

        root = Node(self, "chain", (), {}, "<graph>")
        root.results = (_make_value(self, root, 0, _ChainType()),)
        self._nodes.append(root)
        self._always_ready = root.results[0]
        if _parent is not None:
            self._current_chain = self._inputs[-1]
        else:
            self._current_chain = root.results[0]
        self.device_chains: defaultdict = defaultdict(lambda: self._current_chain)

        if forward is not None:
            with self:
                result = forward(*self.inputs[: len(self.inputs) - (1 if _parent is not None else 0)])
                if result is None:
                    self.output()
                elif isinstance(result, (list, tuple)):
                    self.output(*result)
                else:
                    self.output(result)

    # ------------------------------------------------------------------ context
    def __enter__(self) -> "Graph":
        self._entered += 1
        self._token_stack = getattr(self, "_token_stack", [])
        self._token_stack.append(_ACTIVE.set(_ACTIVE.get() + (self,)))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._entered -= 1
        _ACTIVE.reset(self._token_stack.pop())

    @property
    def current(self) -> "Graph":  # instance access mirrors Graph.current
        return type(self).current  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ nodes
    def _add_node(
        self,
        op: str,
        inputs: Sequence[Any],
        result_types: Sequence[Type],
        attrs: dict | None = None,
        *,
        side_effects: bool = False,
        regions: tuple = (),
        loc: str | None = None,
    ) -> list:
        """Append a node; returns its result values.  Operands must be values of this graph."""
        from max.graph.value import _make_value

        for v in inputs:
            if v._graph is not self and not self._can_see(v._graph):
                raise ValueError(
                    f"{op}: operand {v._short()} belongs to graph {v._graph.name!r}, "
                    f"not to graph {self.name!r}; values cannot be mixed between graphs"
                )
        node = Node(self, op, tuple(inputs), attrs or {}, loc or _user_location(), side_effects, regions)
        node.results = tuple(_make_value(self, node, i, _own_type(t)) for i, t in enumerate(result_types))
        self._nodes.append(node)
        self._version += 1
        return list(node.results)

    def _new_block(self, name: str, input_types: Sequence[Type] = ()) -> "Graph":
        """A nested region (cond branch, loop body): sees this graph's values, starts at its chain."""
        block = Graph(name, input_types=input_types)
        block._enclosing = self
        block._current_chain = self._current_chain
        block.device_chains = defaultdict(lambda: block._current_chain)
        return block

    def _root(self) -> "Graph":
        g = self
        while getattr(g, "_enclosing", None) is not None:
            g = g._enclosing
        return g

    def _can_see(self, other: "Graph") -> bool:
        """Nested blocks (cond/while bodies) may use values of enclosing graphs."""
        g = getattr(self, "_enclosing", None)
        while g is not None:
            if g is other:
                return True
            g = getattr(g, "_enclosing", None)
        return False

    # ------------------------------------------------------------------ API
    @property
    def inputs(self) -> Sequence[Any]:
        """The graph's arguments (use ``.tensor`` / ``.buffer`` to narrow them)."""
        return self._inputs

    def output(self, *outputs: Any) -> None:
        """Set the graph's results (anything TensorValue-like, or buffers/opaque values)."""
        from max.graph.value import Value, _to_value_for_output

        vals = []
        with self if not self._entered else _nullctx():
            for i, o in enumerate(outputs):
                try:
                    v = _to_value_for_output(o)
                except TypeError as e:
                    raise TypeError(f"Graph {self.name!r}: output {i}: {e}") from None
                if v._graph is not self:
                    raise ValueError(
                        f"Graph {self.name!r}: output {i} ({v._short()}) belongs to graph {v._graph.name!r}"
                    )
                vals.append(v)
        if self._parent is not None:
            vals.append(self._current_chain)
        self._outputs = tuple(vals)
        self._version += 1

    @property
    def output_types(self) -> list[Type]:
        """The types of the graph's results; TypeError before :meth:`output` is called (as in MAX)."""
        if self._outputs is None:
            raise TypeError(f"Graph {self.name!r}: output_types is undefined until output(...) is called")
        outs = self._outputs[:-1] if self._parent is not None else self._outputs
        return [v.type for v in outs]

    @property
    def always_ready_chain(self) -> Any:
        return self._always_ready

    def merge_device_chains(self) -> None:
        """Join all device chains into the current chain."""
        from max.graph.value import _ChainValue

        chains = [self._current_chain] + [c for c in self.device_chains.values() if c is not self._current_chain]
        if len(chains) > 1:
            (merged,) = self._add_node("merge_chains", chains, [_ChainType()], side_effects=True)
            self._current_chain = merged
            for k in list(self.device_chains):
                self.device_chains[k] = merged

    def add_weight(self, weight: Any, force_initial_weight_on_host: bool = True) -> Any:
        """Add a :class:`Weight` to this graph; returns its value (the existing one if already added)."""
        from max.graph.weight import Weight

        if not isinstance(weight, Weight):
            raise TypeError(f"add_weight: expected a Weight, got {type(weight).__name__}")
        existing = self._weights.get(weight.name)
        if existing is not None:
            w0, v0 = existing
            if w0 is weight or w0._spec() == weight._spec():
                return v0
            raise ValueError(
                f"add_weight: graph {self.name!r} already has a different weight named {weight.name!r} "
                f"({w0.dtype} {w0.shape} on {w0.device}); new one is {weight.dtype} {weight.shape} on {weight.device}"
            )
        root = self
        (v,) = root._add_node(
            "weight",
            (),
            [TensorType(weight.dtype, weight.shape, weight.device)],
            {"name": weight.name, "encoding": weight.quantization_encoding, "align": weight.align},
            loc="<weight>",
        )
        self._weights[weight.name] = (weight, v)
        return v

    def weights(self) -> dict:
        """The weights added to this graph, by name."""
        return {k: w for k, (w, _) in self._weights.items()}

    def add_subgraph(
        self,
        name: str,
        forward: Callable[..., Any] | None = None,
        input_types: Iterable[Type] = (),
        path: Path | None = None,
        custom_extensions: Sequence[Any] = (),
        devices: Sequence[Any] = (),
    ) -> "Graph":
        """Create a subgraph (callable with ``ops.call``); a chain input is appended automatically.

        ``devices`` (DeviceRefs or driver Devices) records where the subgraph's work runs
        (``sub.devices``).  As in MAX 26.7, the input types' devices are not checked against it
        (a subgraph may take a CPU predicate and transfer values to other devices).
        """
        from max.graph.type import _as_device_ref

        if name in self._subgraphs:
            raise ValueError(f"add_subgraph: graph {self.name!r} already has a subgraph named {name!r}")
        devs = [_as_device_ref(d, "add_subgraph") for d in devices]
        sub = Graph(name, forward, input_types, path, custom_extensions=custom_extensions, _parent=self)
        sub.devices = devs
        self._subgraphs[name] = sub
        return sub

    # ------------------------------------------------------------------ copies
    def copy(self) -> "Graph":
        """An independent copy: same nodes, values, weights and subgraphs, new objects throughout
        (building more ops into one does not change the other)."""
        import copy as _copy

        return _copy.deepcopy(self)

    def __deepcopy__(self, memo: dict) -> "Graph":
        import copy as _copy

        new = object.__new__(type(self))
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            if k in ("device_chains", "_token_stack"):
                continue
            setattr(new, k, _copy.deepcopy(v, memo))
        new._entered = 0
        new._token_stack = []
        chains = defaultdict(lambda: new._current_chain)
        for k, v in self.device_chains.items():
            chains[k] = _copy.deepcopy(v, memo)
        new.device_chains = chains
        return new

    @property
    def kernel_libraries_paths(self) -> list[Path]:
        return list(self._kernel_paths) + [Path(p) for p in self._custom_extensions if isinstance(p, (str, Path))]

    # ------------------------------------------------------------------ printing
    def __str__(self) -> str:
        return _format_graph(self)

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self._nodes)} nodes)"


class _nullctx:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None


def _as_extension_list(ext: Any) -> list:
    if ext is None:
        return []
    if isinstance(ext, (str, Path)):
        return [ext]
    return list(ext)


def _format_attr(v: Any) -> str:
    import numpy as np

    if isinstance(v, np.ndarray):
        if v.ndim == 0:
            return repr(v.item())
        if v.size <= 8:
            return np.array2string(v.reshape(-1), separator=",", threshold=8)
        return f"<{v.dtype}{list(v.shape)}>"
    if hasattr(v, "value") and hasattr(v, "name") and not isinstance(v, type):
        return str(getattr(v, "name"))
    return repr(v) if not isinstance(v, str) else repr(v)


def _format_graph(g: Graph, indent: str = "", names: dict | None = None, counter: list | None = None) -> str:
    names = {} if names is None else names
    counter = [0] if counter is None else counter

    def name_of(v: Any) -> str:
        key = (id(v._node), v._index)
        if key not in names:
            names[key] = f"%{counter[0]}"
            counter[0] += 1
        return names[key]

    args = ", ".join(f"{name_of(v)}: {v.type.to_mlir()}" for v in g._inputs)
    lines = [f"{indent}graph @{g.name}({args}) {{"]
    for node in g._nodes:
        if node.op == "input":
            continue
        if node.op == "chain" and not _used(g, node):
            continue
        attrs_shown = {k: v for k, v in node.attrs.items() if not k.startswith("_")}
        res = ", ".join(name_of(r) for r in node.results)
        operands = ", ".join(name_of(v) for v in node.inputs)
        attrs = ", ".join(f"{k}={_format_attr(v)}" for k, v in attrs_shown.items() if v is not None)
        body = f"{node.op}({operands}{', ' if operands and attrs else ''}{attrs})"
        types = ", ".join(r.type.to_mlir() for r in node.results)
        prefix = f"{res} = " if res else ""
        line = f"{indent}  {prefix}{body} : {types}" if types else f"{indent}  {body}"
        loc = node.loc
        if loc and not loc.startswith("<"):
            line += f"    # {os.path.basename(loc)}"
        lines.append(line)
        for region in node.regions:
            if getattr(region, "_enclosing", None) is not None:
                lines.append(_format_graph(region, indent + "    ", names, counter))
            else:
                lines.append(f"{indent}    (calls @{region.name})")
    if g._outputs is not None:
        lines.append(f"{indent}  output({', '.join(name_of(v) for v in g._outputs)})")
    lines.append(f"{indent}}}")
    return "\n".join(lines)


def _used(g: Graph, node: Node) -> bool:
    r = node.results[0]
    for n in g._nodes:
        if any(v is r for v in n.inputs):
            return True
    return bool(g._outputs) and any(v is r for v in g._outputs)


def _own_type(t: Any) -> Any:
    """The graph's own copy of a tensor/buffer type (a caller may assign the fields of the one it passed)."""
    copy = getattr(t, "_copy", None)
    return copy() if copy is not None else t
