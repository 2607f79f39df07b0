"""``InferenceSession``: compiles graphs into :class:`Model`s on a set of devices."""

from __future__ import annotations

import enum
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import torch

from max.dtype import DType
from max.dtype.dtype import BIT_STORED
from max.engine import threads
from max.engine import backend
from max.engine.compiler import mef, native_lowering, passes
from max.engine.compiler.fusion import fuse
from max.driver.buffer import numpy_to_torch
from max.engine.compiler.lower import call_kernel, lower, materialize_slots, resolve_attrs_now, torch_device
from max.engine.compiler.program import Program, from_graph
from max.engine.kernels import load_builtin_kernels
from max.engine.model import Model
from max.graph.type import TensorType


class GPUProfilingMode(str, enum.Enum):
    OFF = "off"
    ON = "on"
    DETAILED = "detailed"


class PrintStyle(str, enum.Enum):
    """How ``ops.print`` writes tensors (see ``InferenceSession.set_debug_print_options``)."""

    COMPACT = "COMPACT"
    FULL = "FULL"
    BINARY = "BINARY"
    BINARY_MAX_CHECKPOINT = "BINARY_MAX_CHECKPOINT"
    NONE = "NONE"


@dataclass
class DebugConfig:
    """Debug settings of an InferenceSession: how ``ops.print`` output looks and where it goes."""

    print_style: PrintStyle = PrintStyle.COMPACT
    print_precision: int = 6
    print_output_directory: str | None = None


class CompiledModel:
    """A compiled graph not yet bound to weights (``InferenceSession.compile``); ``init`` makes a Model.

    ``expected_weights``: the graph's weights by name (each a ``Weight`` with its dtype and shape).
    """

    def __init__(self, handle: Any, program: Program, expected_weights: Mapping[str, Any],
                 custom_extensions: Any = None, source: str | None = None) -> None:
        self._session = handle
        self._program = program  # optimised (passes, fusion, native lowering done), weights unbound
        self.expected_weights = dict(expected_weights)
        self._custom_extensions = _ext_list(custom_extensions)
        self._source = source  # the MEF file it was read from, if any

    def export_mef(self, path: str | Path) -> None:
        """Write this compiled artifact to ``path`` as a libremax MEF file: the optimised program,
        the backend policy it was lowered under and its weights by name (no weight values).
        ``InferenceSession.load(path, weights_registry=...)`` (or ``compile(path)``) in any process
        with the same libremax and policy runs it without compiling again."""
        if not isinstance(path, (str, Path)):
            raise TypeError(f"CompiledModel.export_mef: path must be a str or Path, got {type(path).__name__}")
        s = self._session
        mef.write(path, self._program, opt_level=s._opt_level, policy=s.backend, extensions=self._custom_extensions)

    def __repr__(self) -> str:
        return f"CompiledModel({self._program.name!r}, weights={sorted(self.expected_weights)})"


class LogLevel(str, enum.Enum):
    CRITICAL = "critical"
    DEBUG = "debug"
    ERROR = "error"
    INFO = "info"
    NOTSET = "notset"
    TRACE = "trace"
    WARNING = "warning"


class InferenceSession:
    """Loads graphs and compiles them into executable models.

    ``devices`` defaults to the host CPU.  ``num_threads`` sizes the one CPU
    thread pool that torch's operators and libremax's native kernels share
    (default: ``LIBREMAX_NUM_THREADS``, else the physical cores); other BLAS
    pools in the process are capped at one thread (see ``max.engine.threads``).
    The setting is process-wide, as torch's is.

    ``optimization_level`` (libremax extension; default from ``LIBREMAX_OPT_LEVEL`` or 1):
    0 = fold/CSE/DCE only; 1 = also pattern fusion (linear+bias+act, SwiGLU,
    RMSNorm, attention -> SDPA); 2 = also ``torch.compile`` (Inductor) on the
    generated module, compiled on first execution per input shapes.

    ``precompiled_mefs``: a MEF file or a folder of them (libremax's own format, see
    ``max.engine.compiler.mef``); a graph whose structural hash (with the compiler, the optimization
    level and the backend policy) matches one is not compiled again: its optimised program is read
    and only bound to the weights.  ``export_mefs``: a folder where every graph this session compiles
    is written as ``<hash>.mef``.  ``LIBREMAX_COMPILE_CACHE=<folder>`` sets both (when neither is
    given): a compile cache shared across processes, so e.g. ``max serve`` restarts without compiling.
    ``last_compile_stats["loaded_from"]`` names the file a model came from (``passes_run`` is 0).
    """

    def __init__(self, devices: Iterable[Any] | None = None, num_threads: int | None = None, *,
                 custom_extensions: Any = None, optimization_level: int | None = None,
                 precompiled_mefs: str | Path | None = None, export_mefs: str | Path | None = None) -> None:
        from max import driver

        devs = list(devices) if devices is not None else [driver.CPU()]
        for d in devs:
            if not isinstance(d, driver.Device):
                raise TypeError(f"InferenceSession: devices must be driver.Device objects, got {type(d).__name__}")
        if not devs:
            devs = [driver.CPU()]
        self._devices = devs
        if num_threads is not None:
            if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
                raise ValueError(f"InferenceSession: num_threads must be a positive int, got {num_threads!r}")
        else:
            num_threads = threads.default_num_threads()
        self._num_threads = threads.apply(num_threads)
        level = optimization_level if optimization_level is not None else int(os.environ.get("LIBREMAX_OPT_LEVEL", "1"))
        if level not in (0, 1, 2):
            raise ValueError(f"InferenceSession: optimization_level must be 0, 1 or 2, got {level!r}")
        self._opt_level = level
        self.backend = backend.current()
        """The backend policy this session compiles with (``max.engine.backend``)."""
        self._custom_extensions = _ext_list(custom_extensions)
        self._profiling = GPUProfilingMode(os.environ.get("MODULAR_ENABLE_PROFILING", "off").lower()
                                           if os.environ.get("MODULAR_ENABLE_PROFILING", "off").lower()
                                           in ("off", "on", "detailed") else "off")
        self._log_level = LogLevel.NOTSET
        self._assert_level = "none"
        self._split_k = "ACCUM"
        self._old_top_k = False
        self.last_compile_stats: dict[str, Any] = {}
        cache = os.environ.get("LIBREMAX_COMPILE_CACHE") or None
        if cache is not None and precompiled_mefs is None and export_mefs is None:
            precompiled_mefs = export_mefs = cache
        for what, v in (("precompiled_mefs", precompiled_mefs), ("export_mefs", export_mefs)):
            if v is not None and not isinstance(v, (str, Path)):
                raise TypeError(f"InferenceSession: {what} must be a str or Path, got {type(v).__name__}")
        if precompiled_mefs is not None and not Path(precompiled_mefs).exists() and precompiled_mefs != export_mefs:
            raise FileNotFoundError(f"InferenceSession: precompiled_mefs {str(precompiled_mefs)!r} does not exist")
        if export_mefs is not None:
            try:
                Path(export_mefs).mkdir(parents=True, exist_ok=True)
            except OSError as e:
                if export_mefs is not cache:
                    raise OSError(f"InferenceSession: cannot create export_mefs folder {str(export_mefs)!r}: "
                                  f"{e}") from None
                warnings.warn(f"LIBREMAX_COMPILE_CACHE={cache!r} cannot be created ({e}); compiling without the "
                              "cache", RuntimeWarning, stacklevel=2)
                precompiled_mefs = export_mefs = None
        self._mef_in = Path(precompiled_mefs) if precompiled_mefs is not None else None
        self._mef_out = Path(export_mefs) if export_mefs is not None else None

    @property
    def devices(self) -> list[Any]:
        return list(self._devices)

    # ------------------------------------------------------------------ compile, then bind weights
    def compile(self, model: Any, *, custom_extensions: Any = None) -> "CompiledModel":
        """Compile ``model`` (a Graph, or the path of a MEF file) without binding weights: the artifact
        :meth:`init` turns into a runnable Model, as often as wanted (e.g. with different weights), and
        :meth:`CompiledModel.export_mef` writes to disk."""
        if isinstance(model, (str, Path)):
            prog, exts, _ = self._read_mef(model)
            return CompiledModel(self, prog, prog.weights, exts, source=str(model))
        prog, exts, stats = self._optimized(model, custom_extensions)
        self.last_compile_stats = stats
        return CompiledModel(self, prog, model.weights() if stats.get("loaded_from") is None else prog.weights,
                             exts)

    def compile_async(self, model: Any, *, custom_extensions: Any = None) -> "concurrent.futures.Future":
        """:meth:`compile` on a worker thread: returns at once with a ``concurrent.futures.Future`` whose
        ``result()`` is the ``CompiledModel`` (or raises compile's error).  In ``async`` code,
        ``await asyncio.wrap_future(fut)``."""
        import concurrent.futures

        if not isinstance(model, (str, Path)):
            from max.graph.graph import Graph

            if not isinstance(model, Graph):  # the earliest point: the caller's line, not the worker
                raise TypeError(f"InferenceSession.compile_async: expected a Graph or a MEF path, got "
                                f"{type(model).__name__}")
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="max-compile")
        try:
            return pool.submit(self.compile, model, custom_extensions=custom_extensions)
        finally:
            pool.shutdown(wait=False)

    def compile_reusing_mefs(self, model: Any, mefs: str | Path, *, custom_extensions: Any = None) -> "CompiledModel":
        """:meth:`compile`, reusing a compiled MEF from ``mefs`` (a MEF file or a folder of them) when one
        was made from a structurally equal graph, and writing the new one into ``mefs`` when it is a
        folder and has none (so the next compile of that graph is a read)."""
        if not isinstance(mefs, (str, Path)):
            raise TypeError(f"InferenceSession.compile_reusing_mefs: mefs must be a str or Path, got "
                            f"{type(mefs).__name__}")
        folder = Path(mefs)
        if not folder.exists():
            if folder.suffix == ".mef":
                raise FileNotFoundError(f"InferenceSession.compile_reusing_mefs: {str(mefs)!r} does not exist")
            folder.mkdir(parents=True, exist_ok=True)
        saved = (self._mef_in, self._mef_out)
        self._mef_in = folder
        self._mef_out = folder if folder.is_dir() else None
        try:
            return self.compile(model, custom_extensions=custom_extensions)
        finally:
            self._mef_in, self._mef_out = saved

    def init(self, compiled: "CompiledModel", weights_registry: Mapping[str, Any] | None = None) -> Model:
        """A runnable Model from :meth:`compile`'s artifact with ``weights_registry`` bound."""
        if not isinstance(compiled, CompiledModel):
            raise TypeError(f"InferenceSession.init: expected a CompiledModel from compile(), got "
                            f"{type(compiled).__name__}")
        missing = sorted(n for n in compiled.expected_weights if n not in (weights_registry or {}))
        if missing:
            raise ValueError(f"InferenceSession.init: weights_registry lacks weights {missing}")
        if compiled._custom_extensions:
            from max.engine import custom as _custom

            _custom.load_extensions(compiled._custom_extensions)
        stats: dict[str, Any] = {"_opt_level": self._opt_level, "_backend": self.backend, "passes_run": 0}
        if self._fold_dirs() != (None, None):
            from max.engine import fold_cache

            stats["_fold_store"] = fold_cache.FoldStore(*self._fold_dirs(), salt=fold_cache.salt(self.backend))
        if compiled._source is not None:
            stats["loaded_from"] = compiled._source
        return self._finish(mef.copy_program(compiled._program), weights_registry, stats)

    def init_all(self, compiled: Any, weights_registry: Mapping[str, Any] | None = None) -> list[Model]:
        """:meth:`init` for each compiled artifact (one shared registry)."""
        return [self.init(c, weights_registry) for c in compiled]

    def load_all(self, models: Any, *, custom_extensions: Any = None,
                 weights_registry: Mapping[str, Any] | None = None) -> list[Model]:
        """Load several graphs with one weights registry (weights shared by name are bound once)."""
        items = list(models)
        if not items:
            raise ValueError("InferenceSession.load_all: no models given")
        return [self.load(m, custom_extensions=custom_extensions, weights_registry=weights_registry) for m in items]

    # ------------------------------------------------------------------ debugging
    def set_debug_print_options(self, style: "PrintStyle | str" = "COMPACT", precision: int = 6,
                                output_directory: str | None = None) -> None:
        """How ``ops.print`` shows tensors while this session's models run: ``PrintStyle.COMPACT``
        (summarised), ``FULL`` (every value), ``BINARY`` (``<label>.npy`` files in
        ``output_directory``), ``BINARY_MAX_CHECKPOINT`` (``<label>.max`` files there, read back with
        ``max.driver.load_max_buffer``) or ``NONE`` (silent), with ``precision`` digits."""
        from max.engine.kernels import debug

        st = PrintStyle(style.value if isinstance(style, PrintStyle) else str(style).upper())
        if isinstance(precision, bool) or not isinstance(precision, int) or precision < 0:
            raise ValueError(f"set_debug_print_options: precision must be a non-negative int, got {precision!r}")
        if st in (PrintStyle.BINARY, PrintStyle.BINARY_MAX_CHECKPOINT) and not output_directory:
            raise ValueError(f"set_debug_print_options: PrintStyle.{st.value} needs an output_directory")
        debug.OPTIONS.update(style=st.value, precision=precision, directory=output_directory)
        self._debug = DebugConfig(print_style=st, print_precision=precision, print_output_directory=output_directory)

    @property
    def debug(self) -> "DebugConfig":
        """The session's debug configuration (print options); assign a DebugConfig to change it."""
        return getattr(self, "_debug", DebugConfig())

    @debug.setter
    def debug(self, config: "DebugConfig") -> None:
        if not isinstance(config, DebugConfig):
            raise TypeError(f"InferenceSession.debug: expected a DebugConfig, got {type(config).__name__}")
        self.set_debug_print_options(config.print_style, config.print_precision, config.print_output_directory)

    @property
    def num_threads(self) -> int:
        """Threads of the shared CPU pool (torch operators and native kernels)."""
        return self._num_threads

    # ------------------------------------------------------------------ load
    def load(
        self,
        model: Any,
        *,
        custom_extensions: Any = None,
        custom_ops_path: str | None = None,
        weights_registry: Mapping[str, Any] | None = None,
    ) -> Model:
        """Compile ``model`` (a :class:`~max.graph.Graph`, or the path of a MEF file that
        ``CompiledModel.export_mef`` wrote) into a :class:`Model` bound to ``weights_registry``."""
        if isinstance(model, (str, Path)):
            if not Path(model).is_file():
                raise RuntimeError(
                    f"InferenceSession.load: {str(model)!r} is not a file; loading serialized models from a path "
                    "is not supported by libremax except for the MEF files CompiledModel.export_mef writes; build a "
                    "max.graph.Graph (e.g. with a pipeline architecture) and load that"
                )
            compiled = self.compile(model, custom_extensions=custom_extensions)
            return self.init(compiled, weights_registry)
        import time

        t0 = time.perf_counter()
        prog, _, stats = self._optimized(model, _ext_list(custom_extensions) + _ext_list(custom_ops_path))
        return self._finish(prog, weights_registry, stats, t0)

    def _optimized(self, model: Any, extra_exts: Any) -> tuple[Program, list, dict]:
        """``model`` (a Graph) flattened and optimised, or read from the session's precompiled MEFs
        when one was made from a structurally equal graph (and exported when the session exports)."""
        from max.graph.graph import Graph

        if not isinstance(model, Graph):
            raise TypeError(f"InferenceSession.load: expected a Graph, got {type(model).__name__}")
        exts = self._custom_extensions + _ext_list(extra_exts)
        exts += [e for e in model._custom_extensions]
        if exts:
            from max.engine import custom as _custom

            _custom.load_extensions(exts)
        _check_custom_ops(model)
        load_builtin_kernels()
        prog = from_graph(model)
        _check_devices(prog, self._devices)
        stats: dict[str, Any] = {"nodes_in": len(prog.nodes), "_opt_level": self._opt_level,
                                 "_backend": self.backend, "passes_run": 0}
        if self._fold_dirs() != (None, None):
            from max.engine import fold_cache

            stats["_fold_store"] = fold_cache.FoldStore(*self._fold_dirs(), salt=fold_cache.salt(self.backend))
        key = None
        if self._mef_in is not None or self._mef_out is not None:
            try:
                key = mef.graph_key(prog, self._opt_level, self.backend)
            except mef.MEFError as e:  # a graph the format cannot hold: compiled as usual, never cached
                stats["mef_skipped"] = str(e)
        if key is not None and self._mef_in is not None:
            path = self._mef_in / f"{key}.mef" if self._mef_in.is_dir() else self._mef_in
            if path.is_file():
                try:
                    doc = mef.read(path, self.backend)
                except mef.MEFError as e:
                    if self._mef_in.is_dir():  # a stale cache entry: compile again (and overwrite it)
                        stats["mef_stale"] = str(e)
                        doc = None
                    else:
                        raise
                if doc is not None and doc.get("key") == key and doc.get("opt_level") == self._opt_level:
                    stats["loaded_from"] = str(path)
                    return doc["program"], exts, stats
        optimize_program(prog, stats, self._opt_level)
        if key is not None and self._mef_out is not None:
            try:
                mef.write(self._mef_out / f"{key}.mef", prog, opt_level=self._opt_level, policy=self.backend,
                          extensions=exts, key=key)
                stats["exported_to"] = str(self._mef_out / f"{key}.mef")
            except (mef.MEFError, OSError) as e:
                stats["mef_skipped"] = str(e)
        return prog, exts, stats

    def _fold_dirs(self) -> tuple:
        """The compile-cache folders that keep weight folding results (read, write)."""
        return (self._mef_in if self._mef_in is not None and self._mef_in.is_dir() else None,
                self._mef_out)

    def _read_mef(self, path: str | Path) -> tuple[Program, list, dict]:
        doc = mef.read(path, self.backend)
        if doc.get("opt_level") != self._opt_level:
            raise mef.MEFError(f"MEF file {str(path)!r} was compiled at optimization_level {doc.get('opt_level')}, "
                               f"this session uses {self._opt_level}")
        exts = list(doc.get("custom_extensions") or [])
        if exts:
            from max.engine import custom as _custom

            _custom.load_extensions(exts)
        load_builtin_kernels()
        prog = doc["program"]
        _check_devices(prog, self._devices)
        return prog, exts, doc

    def _finish(self, prog: Program, weights_registry: Mapping[str, Any] | None, stats: dict,
                t0: float | None = None) -> Model:
        """Bind weights, generate code and make the Model of an optimised program."""
        import time

        t0 = time.perf_counter() if t0 is None else t0
        lowered, consts = finish_program(prog, weights_registry or {}, "", stats, self._opt_level)
        stats["nodes_out"] = len(prog.nodes)
        stats["compile_s"] = time.perf_counter() - t0
        store = stats.pop("_fold_store", None)
        if store is not None:
            stats["folds_reused"], stats["folds_stored"] = store.hits, store.stored
        self.last_compile_stats = stats
        names = [f"input{i}" for i, t in enumerate(prog.input_types) if not _is_chain(t)]
        model = Model._create(self, prog, lowered, consts, names)
        if self._opt_level >= 2:
            model._fn = _compiled_or_eager(lowered.module, graph_name=getattr(prog, "name", "graph"))
        return model

    # ------------------------------------------------------------------ settings
    def gpu_profiling(self, mode: GPUProfilingMode | str) -> None:
        """Set GPU profiling ('off'/'on'/'detailed') for models loaded afterwards: 'on' and 'detailed'
        wrap every ``Model.execute`` in an NVTX range named after the graph (visible in Nsight
        Systems); the default comes from ``MODULAR_ENABLE_PROFILING``."""
        try:
            self._profiling = GPUProfilingMode(mode if isinstance(mode, str) else mode.value)
        except ValueError:
            raise ValueError(f"gpu_profiling: mode must be 'off', 'on' or 'detailed', got {mode!r}") from None

    def set_mojo_log_level(self, level: str | LogLevel) -> None:
        """Accepted for compatibility; sets the level of libremax's kernel logging (none is emitted today)."""
        try:
            self._log_level = LogLevel(str(level.value if isinstance(level, LogLevel) else level).lower())
        except ValueError:
            raise ValueError(f"set_mojo_log_level: unknown level {level!r}; one of {[l.value for l in LogLevel]}") from None

    def set_mojo_assert_level(self, level: Any) -> None:
        """Accepted for compatibility: libremax kernels always check their inputs."""
        self._assert_level = str(getattr(level, "value", level))

    def set_split_k_reduction_precision(self, precision: Any) -> None:
        """Accepted for compatibility: torch matmuls accumulate in float32 already."""
        self._split_k = str(getattr(precision, "value", precision))

    def use_old_top_k_kernel(self, mode: str) -> None:
        """Accepted for compatibility: there is a single top-k kernel."""
        self._old_top_k = str(mode).lower() not in ("false", "off", "no", "0")

    def __repr__(self) -> str:
        return f"InferenceSession(devices={self._devices})"


def _check_custom_ops(graph: Any) -> None:
    """Every custom op must name a registered kernel (the error lists the registered names)."""
    from max.graph.kernel_library import _REGISTRY, unknown_kernel_message

    stack = [graph]
    while stack:
        g = stack.pop()
        for n in g._nodes:
            if n.op in ("custom", "inplace_custom") and n.attrs["symbol"] not in _REGISTRY:
                raise ValueError(f"InferenceSession.load: {n.op} at {n.loc}: {unknown_kernel_message(n.attrs['symbol'])}")
            stack.extend(n.regions)


def _is_chain(t: Any) -> bool:
    from max.graph.type import _ChainType

    return isinstance(t, _ChainType)


def _ext_list(ext: Any) -> list:
    if ext is None:
        return []
    if isinstance(ext, (str, Path)):
        return [ext]
    if isinstance(ext, (list, tuple)):
        return list(ext)
    return [ext]


def _check_devices(prog: Program, devices: list[Any]) -> None:
    have = {(d.label, d.id) for d in devices}
    for n in prog.nodes:
        for t in n.types:
            dev = getattr(t, "device", None)
            if dev is not None and dev.is_gpu() and ("gpu", dev.id) not in have:
                raise ValueError(
                    f"InferenceSession.load: {n.op} (created at {n.loc}) is placed on {dev}, "
                    f"but the session's devices are {[str(d) for d in devices]}"
                )


def weight_to_torch(value: Any, name: str) -> torch.Tensor:
    """A weights_registry value as a torch tensor, without copying where possible."""
    if isinstance(value, torch.Tensor):
        return value
    t = getattr(value, "_torch", None)
    if callable(t):
        return t()
    inner = getattr(value, "data", None)
    if inner is not None and hasattr(value, "quantization_encoding") and not isinstance(value, np.ndarray):
        return weight_to_torch(inner, name)  # WeightData
    if isinstance(value, np.ndarray):
        return numpy_to_torch(value)
    if hasattr(value, "__dlpack__"):
        return torch.from_dlpack(value)
    if isinstance(value, (int, float, bool, np.generic)):
        return torch.tensor(value)
    raise TypeError(f"weights_registry[{name!r}]: expected a DLPack/numpy array or Buffer, got {type(value).__name__}")


def optimize_program(prog: Program, stats: dict | None = None, opt_level: int = 1) -> None:
    """The graph passes, fusion and native lowering of ``prog`` and, after them, of its regions: what
    a MEF file stores (no weight values are read)."""
    stats = {} if stats is None else stats
    stats["passes_run"] = stats.get("passes_run", 0) + 1
    stats["folded"] = stats.get("folded", 0) + passes.fold_constants(prog)
    stats["cse"] = stats.get("cse", 0) + passes.cse(prog)
    if opt_level >= 1:
        for k, c in fuse(prog).items():
            stats.setdefault("fused", {})[k] = stats.get("fused", {}).get(k, 0) + c
        for k, c in native_lowering.lower(prog, stats.get("_backend")).items():
            stats.setdefault("native", {})[k] = stats.get("native", {}).get(k, 0) + c
    stats["dce"] = stats.get("dce", 0) + passes.dce(prog)
    for n in prog.nodes:
        for sub in n.regions:
            optimize_program(sub, stats, opt_level)


def finish_program(prog: Program, registry: Mapping[str, Any], prefix: str, stats: dict | None = None,
                   opt_level: int = 1) -> tuple:
    """Load-time folding of weights, code generation and binding of an optimised program (regions
    are bound recursively); no graph pass runs here."""
    kernels = load_builtin_kernels()
    stats = {} if stats is None else stats
    if opt_level >= 1 and registry:
        stats["weight_folded"] = stats.get("weight_folded", 0) + _fold_weights(prog, registry, prefix,
                                                                               stats.get("_fold_store"))
        passes.dce(prog)
    missing = sorted({n.op for n in prog.nodes} - set(kernels)
                     - {"constant", "weight", "bound", "chain", "merge_chains"})
    if missing:
        where = {n.op: n.loc for n in prog.nodes}
        raise NotImplementedError(
            "InferenceSession.load: no kernel for op(s) "
            + ", ".join(f"{m!r} (created at {where[m]})" for m in missing)
        )
    lowered = lower(prog)
    consts = _bind_consts(materialize_slots(prog, lowered.recipes), registry, prog, prefix, stats)
    return lowered, consts


def compile_program(prog: Program, registry: Mapping[str, Any], prefix: str, stats: dict | None = None,
                    opt_level: int = 1) -> tuple:
    """Passes, lowering and binding of one program (regions included)."""
    stats = {} if stats is None else stats
    optimize_program(prog, stats, opt_level)
    return finish_program(prog, registry, prefix, stats, opt_level)


_FOLD_MAX_BYTES = 1 << 31


def _fold_weights(prog: Program, registry: Mapping[str, Any], prefix: str, store: Any = None) -> int:
    """Load-time folding: pure ops whose operands are all weights or constants (a transpose,
    cast or concat of weights...) run once now; their results are bound like weights
    (contiguous, so e.g. a matmul reads a transposed weight in its fast layout).  ``store``: the
    compile cache's :class:`~max.engine.fold_cache.FoldStore` (results reused for equal weight bytes)."""
    from max.engine.compiler.program import PNode
    from max.engine.fold_cache import tensor_digest
    from max.engine.kernels import KERNELS

    known: dict[int, torch.Tensor] = {}
    digests: dict[int, str] = {}

    def digest(vid: int) -> str:
        d = digests.get(vid)
        if d is None:
            d = digests[vid] = tensor_digest(known[vid])
        return d
    out = []
    folded = 0
    for n in prog.nodes:
        if n.op == "weight":
            try:
                known[n.outs[0]] = _bind_weight(n.attrs["name"], n.types[0], registry, prog, prefix)
            except ValueError:
                pass  # reported when the weight is bound for real
            out.append(n)
            continue
        if n.op == "constant":
            out.append(n)
            known[n.outs[0]] = numpy_to_torch(n.attrs["value"]).to(torch_device(n.types[0].device))
            continue
        spec = KERNELS.get(n.op)
        if (spec is None or not spec.pure or not spec.foldable or n.side_effects or n.regions or not n.inputs
                or not all(i in known for i in n.inputs)
                or not all(isinstance(t, TensorType) and all(hasattr(d, "dim") for d in t.shape) for t in n.types)):
            out.append(n)
            continue
        nbytes = sum(int(np.prod([int(d) for d in t.shape])) * t.dtype.size_in_bytes for t in n.types)
        if nbytes > _FOLD_MAX_BYTES:
            out.append(n)
            continue
        key = results = None
        if store is not None:
            try:
                attrs = json.dumps(mef.encode_value({k: v for k, v in n.attrs.items() if not k.startswith("_")}))
                key = store.entry_key(n.op, attrs, n.types, [digest(i) for i in n.inputs])
                results = store.get(key, torch_device(n.types[0].device))
            except mef.MEFError:
                key = None
        if results is None:
            try:
                res, _ = call_kernel(spec, [known[i] for i in n.inputs], n.attrs)
            except Exception:  # noqa: BLE001 - leave it to run (and report) at execution time
                out.append(n)
                continue
            results = [r.contiguous() for r in (res if isinstance(res, (tuple, list)) else (res,))]
            if key is not None:
                store.put(key, results)
        for k, (o, t, r) in enumerate(zip(n.outs, n.types, results)):
            known[o] = r
            if key is not None:
                digests[o] = f"{key}:{k}"
            out.append(PNode("bound", (), {"_tensor": r}, (t,), (o,), n.loc))
        folded += 1
    prog.nodes = out
    return folded


class RegionRunner:
    """A compiled region (branch, loop body, subgraph) callable from a control-flow kernel."""

    __slots__ = ("fn", "consts", "arg_pos", "n_out", "name", "_lowered", "_prog")

    def __init__(self, prog: Program, lowered: Any, consts: list, arg_pos: tuple) -> None:
        self.fn = lowered.module.forward
        self.consts = tuple(consts)
        self.arg_pos = arg_pos
        self.n_out = len(prog.output_ids)
        self.name = prog.name
        self._lowered = lowered
        self._prog = prog

    def __call__(self, env: dict, own: tuple, node_args: tuple) -> tuple:
        args = own + tuple(node_args[i] for i in self.arg_pos)
        return self.fn(env, self.consts, *args)


def _region_runners(node: Any, types: dict, registry: Mapping[str, Any], prefix: str, stats: dict) -> tuple:
    from max.graph.type import _ChainType

    nonchain = [i for i in node.inputs if not isinstance(types.get(i), _ChainType)]
    runners = []
    for sub in node.regions:
        pos = tuple(nonchain.index(f) for f in sub.free_ids)
        sub_prefix = prefix + str(node.attrs.get("prefix", "") or "")
        lowered, consts = finish_program(sub, registry, sub_prefix, stats, stats.get("_opt_level", 1))
        runners.append(RegionRunner(sub, lowered, consts, pos))
    return tuple(runners)


def _bind_consts(entries: list, registry: Mapping[str, Any], prog: Program, prefix: str = "",
                 stats: dict | None = None) -> list:
    out: list[Any] = []
    for kind, payload, typ in entries:
        if kind == "constant":
            out.append(numpy_to_torch(payload).to(torch_device(typ.device)))
        elif kind == "bound":
            out.append(payload)
        elif kind == "weight":
            out.append(_bind_weight(payload, typ, registry, prog, prefix))
        elif kind == "region":
            out.append(_region_runners(payload, typ.types, registry, prefix, stats or {}))
        elif kind == "prepared":
            out.append(_prepare(payload[0], [None if s is None else out[s] for s in payload[1]]))
        else:
            out.append(payload)
    return out


def _prepare(node: Any, operands: list) -> Any:
    """The node's kernel specialised for its constant operands (None in ``operands`` marks the ones
    passed at each call)."""
    from max.engine.kernels import KERNELS

    spec = KERNELS[node.op]
    attrs = resolve_attrs_now(node.attrs, None)
    runner = spec.prepare(operands, **attrs)
    if runner is not None:
        return runner
    fn = spec.fn

    def call(*dynamic: Any) -> Any:
        it = iter(dynamic)
        return fn(*[next(it) if o is None else o for o in operands], **attrs)

    return call


def _bind_weight(name: str, typ: TensorType, registry: Mapping[str, Any], prog: Program,
                 prefix: str = "") -> torch.Tensor:
    w = prog.weights.get(name)
    parent = getattr(w, "_shard_parent", None) if w is not None else None
    name = prefix + name
    key = name if name in registry or parent is None else prefix + parent[0].name
    if key not in registry:
        import difflib

        close = difflib.get_close_matches(name, list(registry), n=3)
        hint = f"; closest names: {close}" if close else ""
        raise ValueError(
            f"InferenceSession.load: weight {name!r} ({typ}) has no value in weights_registry{hint}"
        )
    t = weight_to_torch(registry[key], name)
    if key != name and parent is not None:
        _, idx, st = parent
        if st.axis is not None:
            t = t.chunk(st.num_devices, dim=st.axis)[idx]
    want_dt = typ.dtype.to_torch()
    if t.dtype != want_dt:
        got = DType.from_torch(t.dtype) if t.dtype in _TORCH_OK else t.dtype
        raise ValueError(f"InferenceSession.load: weight {name!r} has dtype {got}, the graph declares {typ.dtype}")
    want_shape = tuple(int(d) for d in typ.shape) if all(hasattr(d, "dim") for d in typ.shape) else None
    if want_shape is not None and tuple(t.shape) != want_shape:
        raise ValueError(
            f"InferenceSession.load: weight {name!r} has shape {list(t.shape)}, the graph declares {list(want_shape)}"
        )
    return t.to(torch_device(typ.device))


_TORCH_OK = {d.to_torch() for d in DType if d not in BIT_STORED}


def _compiled_or_eager(module: Any, graph_name: str) -> Any:
    """``torch.compile(module)`` that falls back, with one warning, to the uncompiled forward when
    TorchDynamo or Inductor cannot handle the graph (errors raised by the kernels themselves propagate)."""
    compiled = torch.compile(module, dynamic=None)
    state = {"fn": compiled}

    def call(*args: Any) -> Any:
        fn = state["fn"]
        if fn is not compiled:
            return fn(*args)
        try:
            return compiled(*args)
        except Exception as e:  # noqa: BLE001 -- filtered on the raising package below
            if not type(e).__module__.startswith(("torch._dynamo", "torch._inductor")):
                raise
            warnings.warn(f"optimization_level=2: torch.compile could not compile graph {graph_name!r} "
                          f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); running it "
                          f"uncompiled", RuntimeWarning, stacklevel=3)
            state["fn"] = module.forward
            return module.forward(*args)

    return call
