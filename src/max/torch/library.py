"""``max.torch.CustomOpLibrary``: custom kernels called with torch tensors.

libremax kernels are Python functions registered with
``@max.engine.custom.custom_op`` (see :mod:`max.graph.kernel_library`); a
``.mojo`` / ``.mojopkg`` path raises the engine's error saying so.  Each
``library.<opname>`` is a PyTorch custom op (``libremax::lib_<opname>``) that
works eagerly and under ``torch.compile``, in destination-passing style:

* a kernel registered with ``inplace=True`` is called with every tensor
  argument as a mutable buffer (``op(out, x)`` with ``def k(out, x):
  out.copy_(...)`` mirrors the Mojo ``OutputTensor`` / ``InputTensor``
  signature); every tensor argument is marked as written;
* a functional kernel (``def k(x, y) -> result(s)``) is called as
  ``op(*outputs, *inputs)``: the kernel's positional parameters say how many
  inputs it takes, the leading arguments before them are output buffers that
  receive its results in place.

Keyword arguments are the kernel's parameters (``bool``/``int``/``str``/``DType``
keyword-only arguments of the kernel function).  Calls run through a MAX graph
(``ops.custom`` / ``ops.inplace_custom``) compiled once per (dtypes, ranks,
devices, parameter values): dims are symbolic, so new sizes reuse the compiled
graph.  Output buffers are checked (shape and dtype, naming the op and the
argument) before the kernel runs, against what the kernel produces on meta
tensors; kernels that cannot run on meta tensors are checked after running.
"""

from __future__ import annotations

import inspect
import threading
from pathlib import Path
from typing import Any

import torch

from max.dtype import DType
from max.graph.dim import SymbolicDim
from max.graph.kernel_library import _REGISTRY, CustomKernel, KernelLibrary, load_extension, unknown_kernel_message
from max.graph.type import BufferType, TensorType
from max.torch._common import (
    NAMESPACE,
    device_ref,
    dtype_name,
    dtype_of,
    session_for,
    unique_op_name,
)

__all__ = ["CustomOpLibrary"]

_SCALARS = {"bool": "bool", "int": "int", "str": "str", "DType": "str"}
_LOCK = threading.RLock()
_OPS: dict[tuple[str, int], "KernelOp"] = {}  # (kernel name, id of the kernel function) -> op


class CustomOpLibrary:
    """Custom kernels as PyTorch ops: ``CustomOpLibrary(path_or_module).<opname>(*outputs, *inputs)``.

    ``kernel_library`` is a path to a Python kernel module (``.py`` file or
    package directory), a dotted module name, a module object, or a
    :class:`~max.graph.KernelLibrary`.  Any registered kernel is reachable by
    name; ``dir(library)`` lists those the given module(s) registered.
    """

    def __init__(self, kernel_library: Any) -> None:
        names: list[str] = []
        if isinstance(kernel_library, KernelLibrary):
            names = list(kernel_library)
        else:
            new = load_extension(kernel_library)  # .mojo/.mojopkg: ValueError with MOJO_HELP
            mod_names = _module_names(kernel_library)
            names = sorted(set(new) | {n for n, k in _REGISTRY.items() if k.source in mod_names})
        object.__setattr__(self, "_source", kernel_library)
        object.__setattr__(self, "_names", names)
        # Every op is made now, outside any trace: torch.compile cannot follow
        # the registration (a lock, torch.library calls) on a first use inside
        # a compiled function.
        for n in names:
            if n in _REGISTRY:
                try:
                    kernel_op(_REGISTRY[n])
                except (TypeError, ValueError):
                    pass  # a kernel torch cannot call: its error comes when it is used, as before

    def __getattr__(self, name: str) -> "KernelOp":
        if name.startswith("__"):
            raise AttributeError(name)
        k = _REGISTRY.get(name)
        if k is None:
            raise AttributeError(f"CustomOpLibrary({_show(self._source)}): {unknown_kernel_message(name)}")
        return kernel_op(k)

    def __getitem__(self, name: str) -> "KernelOp":
        try:
            return self.__getattr__(name)
        except AttributeError as e:
            raise KeyError(str(e)) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("CustomOpLibrary attributes are its kernels and cannot be set")

    def __dir__(self) -> list[str]:
        return sorted(set(object.__dir__(self)) | set(self._names))

    def __repr__(self) -> str:
        return f"CustomOpLibrary({_show(self._source)}, ops={self._names})"


def kernel_op(k: CustomKernel) -> "KernelOp":
    key = (k.name, id(k.fn))
    op = _OPS.get(key)
    if op is None:
        with _LOCK:
            op = _OPS.get(key)
            if op is None:
                op = _OPS[key] = KernelOp(k)
    return op


class KernelOp:
    """One kernel as a destination-passing torch custom op; call it with tensors."""

    def __init__(self, k: CustomKernel) -> None:
        self.kernel = k
        self.name = k.name
        self.inplace = k.inplace
        self.label = f"custom op {k.name!r}"
        n_in, in_names, var, params = _kernel_signature(k)
        self.n_in = n_in  # None: *args (every argument is an input; functional kernels get 1 output)
        self.params = params  # [(name, kind, default)]
        self._graphs: dict[tuple, Any] = {}
        self._meta: dict[tuple, Any] = {}
        self._lock = threading.RLock()
        self.compiles = 0
        self.hits = 0
        pschema = ""
        if params:
            pschema = ", *, " + ", ".join(
                f"{_SCALARS[kind]} {p}" + ("" if d is inspect.Parameter.empty else f"={_default(d)}")
                for p, kind, d in params)
        if self.inplace:
            args = ("Tensor(a!)[] buffers" if var else
                    ", ".join(f"Tensor(a{i}!) {n}" for i, n in enumerate(in_names)))
            mutates: tuple = ("buffers",) if var else tuple(in_names)
        else:
            args = "Tensor(a!)[] outputs, " + ("Tensor[] inputs" if var else ", ".join(f"Tensor {n}" for n in in_names))
            mutates = ("outputs",)
        schema = f"({args.rstrip(', ')}{pschema}) -> ()".replace("(, ", "(")
        self._var = var
        self._in_names = in_names
        qual = f"{NAMESPACE}::{unique_op_name('lib_' + k.name)}"

        def impl(*args: Any, **kwargs: Any) -> None:
            self._impl(*args, **kwargs)

        def fake(*args: Any, **kwargs: Any) -> None:
            self._fake(*args, **kwargs)

        self.op = torch.library.custom_op(qual, impl, mutates_args=mutates, schema=schema)
        self.op.register_fake(fake)
        self.__doc__ = getattr(k.fn, "__doc__", None)

    # ------------------------------------------------------------------ calling
    def __call__(self, *args: Any, **params: Any) -> None:
        if self.inplace:
            if self._var:
                return self.op(list(args), **params)
            return self.op(*args, **params)
        n_in = len(args) - 1 if self.n_in is None else self.n_in
        n_out = len(args) - n_in
        if n_out < 1:
            raise TypeError(f"{self.label}: expected output buffer(s) followed by {n_in} input(s) "
                            f"({', '.join(self._in_names)}), got {len(args)} tensor argument(s)")
        outs, ins = list(args[:n_out]), args[n_out:]
        if self._var:
            return self.op(outs, list(ins), **params)
        return self.op(outs, *ins, **params)

    def _unpack(self, args: tuple, kwargs: dict) -> tuple[list, list, dict]:
        if self.inplace:
            bufs = list(args[0]) if self._var else list(args[: len(self._in_names)])
            outs, ins = [], bufs
        else:
            outs = list(args[0])
            ins = list(args[1]) if self._var else list(args[1: 1 + len(self._in_names)])
        params = {}
        for p, kind, d in self.params:
            v = kwargs.get(p, d)
            if v is inspect.Parameter.empty:
                raise TypeError(f"{self.label}: missing parameter {p!r}")
            params[p] = DType[v] if kind == "DType" and isinstance(v, str) else v
        for i, t in enumerate(outs + ins):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{self.label}: argument {i} must be a torch.Tensor, got {type(t).__name__}")
        return outs, ins, params

    # ------------------------------------------------------------------ checks
    def _device(self, tensors: list) -> Any:
        devs = {t.device for t in tensors}
        if len(devs) > 1:
            raise ValueError(f"{self.label}: all tensors must be on one device, got {sorted(map(str, devs))}")
        return device_ref(next(iter(devs))) if devs else device_ref(torch.device("cpu"))

    def _expected(self, ins: list, params: dict) -> list | None:
        """(shape, dtype) of each result, by running the kernel on meta tensors (None if it cannot)."""
        key = (tuple((t.dtype, tuple(t.shape)) for t in ins), _pkey(params))
        if key in self._meta:
            return self._meta[key]
        try:
            from torch._subclasses.fake_tensor import unset_fake_temporarily
        except ImportError:  # pragma: no cover
            unset_fake_temporarily = None
        try:
            ctx = unset_fake_temporarily() if unset_fake_temporarily else _null()
            with ctx:
                metas = [torch.empty(tuple(int(d) for d in t.shape), dtype=t.dtype, device="meta") for t in ins]
                # the engine hands DType parameters to kernels as torch dtypes
                kw = {k: v.to_torch() if isinstance(v, DType) else v for k, v in params.items()}
                res = self.kernel.fn(*metas, **kw)
            res = (res,) if isinstance(res, torch.Tensor) else tuple(res)
            spec = [(tuple(r.shape), r.dtype) for r in res]
        except Exception:  # noqa: BLE001 - a kernel that needs data (item(), numpy, Triton): check after running
            spec = None
        if len(self._meta) > 256:
            self._meta.clear()
        self._meta[key] = spec
        return spec

    def _check_outputs(self, outs: list, spec: list | None) -> None:
        if spec is None:
            return
        if len(spec) != len(outs):
            raise ValueError(f"{self.label}: the kernel produces {len(spec)} output(s), "
                             f"got {len(outs)} output buffer(s)")
        for i, (o, (shape, dt)) in enumerate(zip(outs, spec)):
            if tuple(o.shape) != shape or o.dtype != dt:
                raise ValueError(f"{self.label}: output buffer {i}: expected shape {list(shape)} and dtype "
                                 f"{dtype_name(dt)}, got shape {list(o.shape)} and dtype {dtype_name(o.dtype)}")

    # ------------------------------------------------------------------ kernels
    def _fake(self, *args: Any, **kwargs: Any) -> None:
        outs, ins, params = self._unpack(args, kwargs)
        if not self.inplace and all(all(type(d) is int for d in t.shape) for t in outs + ins):
            self._check_outputs(outs, self._expected(ins, params))

    def _impl(self, *args: Any, **kwargs: Any) -> None:
        outs, ins, params = self._unpack(args, kwargs)
        dev = self._device(outs + ins)
        if not self.inplace:
            self._check_outputs(outs, self._expected(ins, params))
        model = self._model(outs, ins, params, dev)
        results = model.execute(*ins)
        for i, (o, r) in enumerate(zip(outs, results)):
            r = r._torch()
            if r.shape != o.shape or r.dtype != o.dtype:
                raise ValueError(f"{self.label}: output buffer {i}: the kernel produced shape {list(r.shape)} and "
                                 f"dtype {dtype_name(r.dtype)}, the buffer has shape {list(o.shape)} and dtype "
                                 f"{dtype_name(o.dtype)}")
            o.copy_(r)

    def _model(self, outs: list, ins: list, params: dict, dev: Any) -> Any:
        key = (tuple((t.dtype, t.dim()) for t in outs), tuple((t.dtype, t.dim()) for t in ins), _pkey(params), dev)
        m = self._graphs.get(key)
        if m is not None:
            self.hits += 1
            return m
        with self._lock:
            m = self._graphs.get(key)
            if m is None:
                m = self._graphs[key] = session_for([dev]).load(self._graph(outs, ins, params, dev))
                self.compiles += 1
        return m

    def _graph(self, outs: list, ins: list, params: dict, dev: Any) -> Any:
        from max.graph import Graph, ops

        def sym(prefix: str, i: int, t: torch.Tensor) -> list:
            return [SymbolicDim(f"{prefix}{i}_d{j}") for j in range(t.dim())]

        kind = BufferType if self.inplace else TensorType
        in_types = [kind(dtype_of(t, f"{self.label}: argument {i}"), sym("in", i, t), dev) for i, t in enumerate(ins)]
        out_types = [TensorType(dtype_of(t, f"{self.label}: output buffer {i}"), sym("out", i, t), dev)
                     for i, t in enumerate(outs)]
        with Graph(f"lib_{self.name}", input_types=in_types) as g:
            if self.inplace:
                ops.inplace_custom(self.name, dev, list(g.inputs), parameters=params)
                g.output()
            else:
                res = ops.custom(self.name, dev, list(g.inputs), out_types, parameters=params)
                g.output(*res)
        return g

    def cache_info(self) -> tuple[int, int]:
        """(hits, compiles) of this op's graph cache."""
        return self.hits, self.compiles

    def __repr__(self) -> str:
        kind = "in-place" if self.inplace else "functional"
        return f"<max.torch custom op {self.name!r} ({kind}) -> torch.ops.{self.op._qualname}>"


# ----------------------------------------------------------------------------- helpers
def _kernel_signature(k: CustomKernel) -> tuple:
    try:
        sig = inspect.signature(k.fn)
    except (TypeError, ValueError):
        return None, [], True, []
    pos, params, var = [], [], False
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            pos.append(p.name)
        elif p.kind is p.VAR_POSITIONAL:
            var = True
        elif p.kind is p.KEYWORD_ONLY:
            params.append((p.name, _param_kind(k, p), p.default))
    if var:
        return None, [], True, params
    reserved = {"outputs", "inputs", "buffers"}
    if len(set(pos)) != len(pos) or any(n in reserved or not n.isidentifier() for n in pos):
        pos = [f"arg{i}" for i in range(len(pos))]
    return len(pos), pos, False, params


def _param_kind(k: CustomKernel, p: inspect.Parameter) -> str:
    ann = p.annotation
    name = ann if isinstance(ann, str) else getattr(ann, "__name__", None)
    if name in _SCALARS:
        return name
    if p.default is not p.empty and type(p.default).__name__ in _SCALARS:
        return "DType" if isinstance(p.default, DType) else type(p.default).__name__
    raise TypeError(
        f"custom op {k.name!r}: keyword parameter {p.name!r} needs a bool, int, str or DType annotation "
        "(or a default of one of those types) to be callable from torch")


def _default(d: Any) -> str:
    if isinstance(d, bool):
        return "True" if d else "False"
    if isinstance(d, DType):
        return f'"{d.name}"'
    if isinstance(d, str):
        return '"' + d.replace('"', '\\"') + '"'
    return repr(d)


def _pkey(params: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in params.items()))


def _module_names(lib: Any) -> set[str]:
    """Module names a kernel from ``lib`` records as its source (``CustomKernel.source``)."""
    if isinstance(lib, (str, Path)):
        import sys

        p = Path(lib)
        out = {str(lib)}
        try:
            target = (p / "__init__.py" if p.is_dir() else p).resolve()
        except OSError:
            return out
        for name, mod in list(sys.modules.items()):
            f = getattr(mod, "__file__", None)
            if f and (Path(f).resolve() == target or (p.is_dir() and Path(f).resolve().parent == p.resolve())):
                out.add(name)
        return out
    name = getattr(lib, "__name__", None)
    return {name} if name else set()


def _show(src: Any) -> str:
    if isinstance(src, (str, Path)):
        return repr(str(src))
    return getattr(src, "__name__", type(src).__name__)


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None

