"""``Model``: a compiled graph bound to its weights and devices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from max.dtype import DType, torch_storage_dtype
from max.dtype.dtype import BIT_STORED
from max.engine.compiler.lower import Lowered, locate_error, torch_device
from max.engine.compiler.program import Program
from max.graph.dim import StaticDim, SymbolicDim, solve_linear
from max.graph.type import BufferType, TensorType, _ChainType


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape (``None`` for a symbolic dim) and dtype of a model input or output."""

    shape: list[int | None] | None
    dtype: DType
    name: str

    def __repr__(self) -> str:
        return f"TensorSpec(shape={self.shape}, dtype={self.dtype}, name={self.name!r})"


class MojoValue:
    """Opaque value a model may return (kept for API compatibility; libremax returns Buffers)."""


def _spec_of(t: Any, name: str) -> TensorSpec:
    if isinstance(t, (TensorType, BufferType)):
        shape = [d.dim if isinstance(d, StaticDim) else None for d in t.shape]
        return TensorSpec(shape, t.dtype, name)
    return TensorSpec(None, DType.bool, name)


class Model:
    """A compiled model.  Create it with ``InferenceSession.load``; call ``execute`` or the model itself."""

    def __init__(self, *a: Any, **k: Any) -> None:
        raise TypeError("Model is not constructed directly; use InferenceSession.load(graph)")

    @classmethod
    def _create(cls, session: Any, prog: Program, lowered: Lowered, consts: list, input_names: list[str]) -> "Model":
        self = object.__new__(cls)
        self._session = session
        self._prog = prog
        self._lowered = lowered
        self._fn = lowered.module.forward
        self._consts = tuple(consts)
        self._input_names = input_names
        self._in_types = [t for t in prog.input_types if not isinstance(t, _ChainType)]
        self._n_chain_inputs = sum(isinstance(t, _ChainType) for t in prog.input_types)
        self._checks = [_make_check(t, n) for t, n in zip(self._in_types, input_names)]
        self._captured: dict[int, Any] = {}
        self._out_dtypes = [getattr(t, "dtype", None) for t in prog.output_types]
        self._nvtx = str(getattr(getattr(session, "_profiling", None), "value", "off")) != "off"
        self._const_ptrs = frozenset(
            c.untyped_storage().data_ptr() for c in self._consts if isinstance(c, torch.Tensor)
        )
        return self

    # ---------------------------------------------------------------- metadata
    @property
    def input_metadata(self) -> list[TensorSpec]:
        return [_spec_of(t, n) for t, n in zip(self._in_types, self._input_names)]

    @property
    def input_devices(self) -> list[Any]:
        """The driver device each input is expected on (one per input)."""
        from max.driver import Accelerator, CPU

        out = []
        for t in self._in_types:
            dev = getattr(t, "device", None)
            out.append(CPU() if dev is None or dev.is_cpu() else Accelerator(dev.id))
        return out

    @property
    def devices(self) -> list[Any]:
        """The devices the model runs on (its session's)."""
        return list(self._session.devices)

    @property
    def output_metadata(self) -> list[TensorSpec]:
        return [_spec_of(t, f"output_{i}") for i, t in enumerate(self._prog.output_types)]

    # ---------------------------------------------------------------- execution
    def __call__(self, *args: Any, **kwargs: Any) -> list:
        if kwargs:
            names = self._input_names
            bound = list(args) + [None] * (len(names) - len(args))
            for k, v in kwargs.items():
                if k not in names:
                    raise TypeError(f"Model: unknown input name {k!r}; inputs are {names}")
                i = names.index(k)
                if i < len(args):
                    raise TypeError(f"Model: input {k!r} given both positionally and by name")
                bound[i] = v
            missing = [names[i] for i, v in enumerate(bound) if v is None]
            if missing:
                raise TypeError(f"Model: missing inputs {missing}")
            args = tuple(bound)
        return self.execute(*args)

    def execute(self, *args: Any) -> list:
        """Run the model; returns one ``driver.Buffer`` per graph output (always a list)."""
        from max.driver import Buffer

        n = len(self._checks)
        if len(args) != n:
            raise ValueError(
                f"Model.execute: expected {n} input{'s' if n != 1 else ''} "
                f"({', '.join(self._input_names)}), got {len(args)}"
            )
        env: dict[str, Any] = {}
        tensors = [check(a, env) for check, a in zip(self._checks, args)]
        if "__pending__" in env:
            _check_expression_dims(env, env.pop("__pending__"))
        if self._n_chain_inputs:
            tensors.extend([None] * self._n_chain_inputs)
        try:
            if self._nvtx and torch.cuda.is_available():
                torch.cuda.nvtx.range_push(f"max:{self._prog.name}")
                try:
                    outs = self._fn(env, self._consts, *tensors)
                finally:
                    torch.cuda.nvtx.range_pop()
            else:
                outs = self._fn(env, self._consts, *tensors)
        except Exception as e:
            node = locate_error(self._lowered, self._prog, e.__traceback__)
            if node is not None:
                raise RuntimeError(
                    f"{node.op} (created at {node.loc}) failed while executing graph "
                    f"{self._prog.name!r}: {type(e).__name__}: {e}"
                ) from e
            raise
        return [Buffer._from_torch(self._owned(o, tensors), dt) if isinstance(o, torch.Tensor) else o
                for o, dt in zip(outs, self._out_dtypes)]

    def _owned(self, o: torch.Tensor, inputs: list) -> torch.Tensor:
        """Outputs are contiguous and never alias an input, weight or constant."""
        if not o.is_contiguous():
            return o.contiguous()
        ptr = o.untyped_storage().data_ptr()
        if ptr in self._const_ptrs or any(
            t is not None and t.untyped_storage().data_ptr() == ptr for t in inputs
        ):
            return o.clone()
        return o

    def execute_static(self, *tensors: torch.Tensor) -> list:
        """Run on torch tensors exactly as given (checked like :meth:`execute`) and return the graph's
        torch outputs without the copies :meth:`execute` makes: the outputs may be views of an input or
        of memory the next run reuses.  For callers that record a run in a CUDA graph over static input
        tensors (``max.pipelines.lib.cuda_graph_decode``) and read the outputs before the next replay."""
        n = len(self._checks)
        if len(tensors) != n:
            raise ValueError(f"Model.execute_static: expected {n} inputs ({', '.join(self._input_names)}), "
                             f"got {len(tensors)}")
        env: dict[str, Any] = {}
        checked = [check(a, env) for check, a in zip(self._checks, tensors)]
        if "__pending__" in env:
            _check_expression_dims(env, env.pop("__pending__"))
        if self._n_chain_inputs:
            checked.extend([None] * self._n_chain_inputs)
        return list(self._fn(env, self._consts, *checked))

    # ---------------------------------------------------------------- capture
    def capture(self, graph_key: int, *inputs: Any) -> list:
        """Record the execution for ``graph_key``: a CUDA graph when the inputs live on a GPU
        (replayed with one launch), plain execution on CPU with the same contract."""
        _check_key(graph_key, inputs)
        sig = tuple(_sig(a) for a in inputs)
        tensors = [to_torch_input(a, None, f"input {i}") if not isinstance(a, (int, float, bool)) else a
                   for i, a in enumerate(inputs)]
        if any(isinstance(t, torch.Tensor) and t.is_cuda for t in tensors):
            static = [t.clone() if isinstance(t, torch.Tensor) else t for t in tensors]
            env: dict[str, Any] = {}
            checked = [check(a, env) for check, a in zip(self._checks, static)]
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm up allocator and lazy initialisation outside the graph
                    self._fn(env, self._consts, *checked)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outs = self._fn(env, self._consts, *checked)
            self._captured[graph_key] = (sig, graph, static, outs)
            graph.replay()
            from max.driver import Buffer

            return [Buffer._from_torch(o.clone()) for o in outs]
        out = self.execute(*inputs)
        self._captured[graph_key] = (sig, None, None, None)
        return out

    def _entry(self, graph_key: int, inputs: Sequence[Any], who: str) -> tuple:
        _check_key(graph_key, inputs)
        entry = self._captured.get(graph_key)
        if entry is None:
            raise RuntimeError(f"Model.{who}: nothing was captured for graph_key {graph_key}")
        now = tuple(_sig(a) for a in inputs)
        if now != entry[0]:
            raise RuntimeError(
                f"Model.{who}: inputs {now} do not match the capture for key {graph_key} ({entry[0]})"
            )
        return entry

    def replay(self, graph_key: int, *inputs: Any) -> list:
        """Run what :meth:`capture` recorded for ``graph_key`` on new inputs of the same shapes."""
        sig, graph, static, outs = self._entry(graph_key, inputs, "replay")
        if graph is None:
            return self.execute(*inputs)
        from max.driver import Buffer

        for dst, a in zip(static, inputs):
            if isinstance(dst, torch.Tensor):
                dst.copy_(to_torch_input(a, None, "replay input"))
        graph.replay()
        return [Buffer._from_torch(o.clone()) for o in outs]

    def debug_verify_replay(self, graph_key: int, *inputs: Any) -> None:
        """Execute eagerly and check the recorded graph gives the same outputs (RuntimeError if not)."""
        sig, graph, static, outs = self._entry(graph_key, inputs, "debug_verify_replay")
        eager = self.execute(*inputs)
        if graph is None:
            return
        replayed = self.replay(graph_key, *inputs)
        for i, (a, b) in enumerate(zip(eager, replayed)):
            if not torch.allclose(a._torch(), b._torch(), rtol=1e-5, atol=1e-6, equal_nan=True):
                raise RuntimeError(f"Model.debug_verify_replay: output {i} of the replay differs from eager execution")

    def __repr__(self) -> str:
        ins = ", ".join(f"{s.name}: {s.dtype} {s.shape}" for s in self.input_metadata)
        return f"Model({self._prog.name!r}, inputs=[{ins}])"


def _check_key(key: Any, inputs: Sequence[Any]) -> None:
    if isinstance(key, bool) or not isinstance(key, int):
        raise TypeError(f"graph_key must be an int, got {type(key).__name__}")
    if not 0 <= key < 2**64:
        raise ValueError(f"graph_key {key} is outside the uint64 range")
    if not inputs:
        raise ValueError("capture/replay need at least one input")


def _sig(a: Any) -> tuple:
    t = getattr(a, "shape", None)
    return (tuple(t) if t is not None else None, str(getattr(a, "dtype", type(a).__name__)))


def to_torch_input(a: Any, dtype: DType | None, what: str) -> torch.Tensor:
    """Convert an execute() argument (Buffer, torch/DLPack array, numpy, scalar) without copying."""
    if isinstance(a, torch.Tensor):
        return a
    t = getattr(a, "_torch", None)
    if t is not None and callable(t):
        return t()
    if isinstance(a, np.ndarray):
        from max.driver import Buffer

        return Buffer.from_numpy(a)._torch()
    if isinstance(a, (bool, int, float, np.generic)):
        if dtype is None:
            raise TypeError(f"{what}: a Python scalar cannot be passed for this input")
        return torch.tensor(a.item() if isinstance(a, np.generic) else a, dtype=dtype.to_torch())
    if hasattr(a, "__dlpack__"):
        return torch.from_dlpack(a)
    raise TypeError(
        f"{what}: expected a driver.Buffer, numpy array, DLPack array or Python scalar, got {type(a).__name__}"
    )


def _make_check(t: Any, name: str):
    """A fast per-input validator: dtype, rank, static dims, symbolic-dim consistency, device."""
    if not isinstance(t, (TensorType, BufferType)):
        def passthrough(a: Any, env: dict) -> Any:
            return a
        return passthrough
    want_dtype = torch_storage_dtype(t.dtype)
    rank = len(t.shape)
    dims = []
    for i, d in enumerate(t.shape):
        if isinstance(d, StaticDim):
            dims.append((i, "s", d.dim))
        elif isinstance(d, SymbolicDim):
            dims.append((i, "y", d.name))
        else:
            dims.append((i, "a", d))
    dev = torch_device(t.device)
    is_buffer = isinstance(t, BufferType)
    bit_stored = t.dtype in BIT_STORED
    label = f"input {name!r} (expected {t})"

    def check(a: Any, env: dict) -> torch.Tensor:
        if is_buffer and not (hasattr(a, "_torch") or isinstance(a, torch.Tensor)):
            raise TypeError(f"{label}: a mutable buffer input needs a driver.Buffer or torch tensor, "
                            f"got {type(a).__name__}")
        x = to_torch_input(a, t.dtype, label)
        if x.dtype != want_dtype or (bit_stored and getattr(a, "dtype", t.dtype) is not t.dtype):
            raise ValueError(f"{label}: got dtype {DType.from_torch(x.dtype) if _known(x.dtype) else x.dtype}, "
                            f"expected {t.dtype}")
        if x.dim() != rank:
            raise ValueError(f"{label}: got rank {x.dim()} (shape {list(x.shape)}), expected rank {rank}")
        shp = x.shape
        for i, kind, v in dims:
            n = shp[i]
            if kind == "s":
                if n != v:
                    raise ValueError(f"{label}: dim {i} is {n}, expected {v} (got shape {list(shp)})")
            elif kind == "y":
                prev = env.get(v)
                if prev is None:
                    env[v] = n
                elif prev != n:
                    raise ValueError(
                        f"{label}: dim {i} ({v}) is {n}, but {v} is {prev} in an earlier input"
                    )
        for i, kind, v in dims:
            if kind == "a":
                env.setdefault("__pending__", []).append((label, i, v, shp[i]))
        if x.device != dev and not (dev.type == "cuda" and x.device.type == "cuda" and dev.index in (None, x.device.index)):
            raise ValueError(f"{label}: tensor is on {x.device}, expected {dev}; move it with .to(device)")
        return x

    return check


def _check_expression_dims(env: dict, pending: list) -> None:
    """Check input dims given by expressions (``a + b``, ``h * 2``) once plain symbols are bound,
    solving for a symbol that appears only in such expressions when it is linear."""
    progress = True
    while pending and progress:
        progress = False
        for item in list(pending):
            label, i, v, n = item
            try:
                want = v.evaluate(env)
            except KeyError:
                sol = solve_linear(v, env, n)
                if sol is not None:
                    env[sol[0]] = sol[1]
                    pending.remove(item)
                    progress = True
                continue
            if n != want:
                raise ValueError(f"{label}: dim {i} ({v}) is {n}, expected {want}")
            pending.remove(item)
            progress = True


def _known(dt: Any) -> bool:
    try:
        DType.from_torch(dt)
        return True
    except ValueError:
        return False
