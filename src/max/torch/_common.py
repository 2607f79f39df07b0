"""Shared plumbing of ``max.torch``: torch <-> graph types, argument checks,
sessions per device set, and registration of destination-passing torch ops."""

from __future__ import annotations

import re
import threading
from typing import Any, Callable, Sequence

import torch

from max.dtype import DType
from max.graph.dim import StaticDim, SymbolicDim
from max.graph.type import DeviceRef, TensorType

NAMESPACE = "libremax"
_NAMES_LOCK = threading.Lock()
_USED_NAMES: set[str] = set()


# ----------------------------------------------------------------------------- devices and types
def device_ref(dev: torch.device) -> DeviceRef:
    """The graph device of a torch device (``cuda:i`` -> ``gpu:i``)."""
    if dev.type == "cpu":
        return DeviceRef.CPU()
    if dev.type == "cuda":
        return DeviceRef.GPU(dev.index if dev.index is not None else torch.cuda.current_device())
    raise ValueError(f"tensors on device {dev} are not supported (use cpu or cuda tensors)")


def dtype_of(t: torch.Tensor, what: str) -> DType:
    try:
        return DType.from_torch(t.dtype)
    except (ValueError, KeyError, TypeError):
        raise TypeError(f"{what}: torch dtype {t.dtype} has no MAX DType") from None


def tensor_type(t: torch.Tensor, what: str) -> TensorType:
    """The graph type of a concrete tensor: its dtype, static shape and device."""
    return TensorType(dtype_of(t, what), tuple(int(d) for d in t.shape), device_ref(t.device))


def on_device(t: TensorType, dev: DeviceRef) -> TensorType:
    return t if t.device == dev else TensorType(t.dtype, t.shape, dev)


def dtype_name(dt: torch.dtype) -> str:
    try:
        return DType.from_torch(dt).name
    except (ValueError, KeyError, TypeError):
        return str(dt)


def bind_to_type(op: str, what: str, t: torch.Tensor, typ: TensorType, env: dict[str, int]) -> None:
    """Check a tensor against a (possibly symbolic) type, binding symbolic dims in ``env``.

    Raises TypeError (dtype) or ValueError (rank, static dim, inconsistent
    symbolic dim), naming the op and the argument with what was expected and got.
    """
    want_dt = typ.dtype.to_torch()
    if t.dtype != want_dt:
        raise TypeError(f"{op}: {what}: expected dtype {typ.dtype.name}, got {dtype_name(t.dtype)} "
                        f"(expected type {_type_str(typ)}, got shape {list(t.shape)})")
    if t.dim() != len(typ.shape):
        raise ValueError(f"{op}: {what}: expected rank {len(typ.shape)} (shape {_shape_str(typ)}), "
                         f"got rank {t.dim()} (shape {list(t.shape)})")
    pending = []
    for i, d in enumerate(typ.shape):
        n = int(t.shape[i])
        if isinstance(d, StaticDim):
            if n != d.dim:
                raise ValueError(f"{op}: {what}: expected shape {_shape_str(typ)}, got {list(t.shape)} "
                                 f"(dim {i} is {n}, expected {d.dim})")
        elif isinstance(d, SymbolicDim):
            prev = env.get(d.name)
            if prev is None:
                env[d.name] = n
            elif prev != n:
                raise ValueError(f"{op}: {what}: dim {i} ({d.name}) is {n}, but {d.name} is {prev} "
                                 f"in an earlier argument (expected shape {_shape_str(typ)}, got {list(t.shape)})")
        else:
            pending.append((i, d, n))
    for i, d, n in pending:  # expressions (``batch * 2``) once plain symbols are bound
        try:
            want = d.evaluate(env)
        except KeyError:
            continue
        if want != n:
            raise ValueError(f"{op}: {what}: dim {i} ({d}) is {n}, expected {want} "
                             f"(expected shape {_shape_str(typ)}, got {list(t.shape)})")


def expected_shape(typ: TensorType, env: dict[str, int]) -> list[int | None]:
    """Concrete sizes of ``typ`` under ``env`` (``None`` where a dim cannot be known before running)."""
    out: list[int | None] = []
    for d in typ.shape:
        try:
            out.append(int(d.evaluate(env)))
        except KeyError:
            out.append(None)
    return out


def check_output(op: str, what: str, t: torch.Tensor, typ: TensorType, env: dict[str, int]) -> None:
    """An output buffer must have the dtype, shape and device the graph produces."""
    want = expected_shape(typ, env)
    shape_ok = t.dim() == len(want) and all(w is None or w == int(n) for w, n in zip(want, t.shape))
    dt_ok = t.dtype == typ.dtype.to_torch()
    if not (shape_ok and dt_ok):
        shown = [w if w is not None else "?" for w in want]
        raise ValueError(f"{op}: output buffer {what}: expected shape {shown} and dtype {typ.dtype.name}, "
                         f"got shape {list(t.shape)} and dtype {dtype_name(t.dtype)}")
    if device_ref(t.device) != typ.device:
        raise ValueError(f"{op}: output buffer {what}: expected a tensor on {_torch_dev(typ.device)} "
                         f"(where the result is computed), got one on {t.device}")


def _torch_dev(d: DeviceRef) -> str:
    return "cpu" if d.is_cpu() else f"cuda:{d.id}"


def _shape_str(t: TensorType) -> str:
    return "[" + ", ".join(str(d) for d in t.shape) + "]"


def _type_str(t: TensorType) -> str:
    return f"{t.dtype.name} {_shape_str(t)}"


def is_concrete(t: torch.Tensor) -> bool:
    """True when every size is a plain int (not a SymInt of a dynamic-shape trace)."""
    return all(type(d) is int for d in t.shape)


# ----------------------------------------------------------------------------- sessions
_SESSIONS: dict[tuple, Any] = {}
_SESSIONS_LOCK = threading.Lock()


def session_for(devices: Sequence[DeviceRef]) -> Any:
    """One InferenceSession per set of devices (CPU always included)."""
    from max.driver import CPU, Accelerator
    from max.engine import InferenceSession

    key = tuple(sorted({d.id for d in devices if d.is_gpu()}))
    with _SESSIONS_LOCK:
        s = _SESSIONS.get(key)
        if s is None:
            devs = [CPU()] + [Accelerator(i) for i in key]
            s = _SESSIONS[key] = InferenceSession(devices=devs)
        return s


# ----------------------------------------------------------------------------- torch.library
def identifier(name: str) -> str:
    s = re.sub(r"\W", "_", name)
    if not s or s[0].isdigit():
        s = "op_" + s
    return s


def unique_op_name(base: str) -> str:
    """``base`` (made an identifier), suffixed ``_1``, ``_2``... when taken in the namespace."""
    base = identifier(base)
    with _NAMES_LOCK:
        n = 0
        while True:
            cand = base if n == 0 else f"{base}_{n}"
            if cand not in _USED_NAMES and not _op_exists(cand):
                _USED_NAMES.add(cand)
                return cand
            n += 1


def _op_exists(name: str) -> bool:
    try:
        return torch._C._dispatch_has_kernel(f"{NAMESPACE}::{name}") or bool(
            torch._C._dispatch_find_schema_or_throw(f"{NAMESPACE}::{name}", ""))
    except Exception:  # noqa: BLE001 - not registered
        return False


_SCALAR_SCHEMA = {bool: "bool", int: "int", float: "float", str: "str"}


def register_dps_op(name: str, out_names: Sequence[str], in_names: Sequence[str], impl: Callable[..., None],
                    fake: Callable[..., None], *, mutable_inputs: bool = False,
                    params: Sequence[tuple[str, type]] = ()) -> Any:
    """Register a destination-passing torch custom op ``libremax::<name>``.

    The schema is ``(Tensor(a0!) out0, ..., Tensor in0, ..., *, <params>) -> ()``:
    outputs come first and are written in place; ``mutable_inputs`` marks every
    tensor argument as written (in-place kernels).  ``fake`` is the meta
    implementation torch.compile traces with.  Returns the ``CustomOpDef``.
    """
    names = list(out_names) + list(in_names)
    if len(set(names)) != len(names):
        raise ValueError(f"{name}: argument names must be distinct, got {names}")
    args = [f"Tensor(a{i}!) {n}" for i, n in enumerate(out_names)]
    k = len(out_names)
    for j, n in enumerate(in_names):
        args.append(f"Tensor(a{k + j}!) {n}" if mutable_inputs else f"Tensor {n}")
    if params:
        args.append("*")
        args += [f"{_SCALAR_SCHEMA[t]} {p}" for p, t in params]
    schema = "(" + ", ".join(args) + ") -> ()"
    mutates = tuple(out_names) + (tuple(in_names) if mutable_inputs else ())
    qual = f"{NAMESPACE}::{unique_op_name(name)}"
    op = torch.library.custom_op(qual, impl, mutates_args=mutates, schema=schema)
    op.register_fake(fake)
    return op
