"""The backend policy: one place that decides how weights are stored and which kernels run.

Model building asks :meth:`BackendPolicy.weight_storage` / :meth:`BackendPolicy.compute_dtype`
(through ``architectures/common/weights.py``) how each weight is kept; the compiler's native
lowering (``engine/compiler/native_lowering.py``) writes the policy's answers into the nodes: every
node whose kernel has a native path gets ``native`` (the kernel variant to run, e.g. ``"avx2"``; absent:
torch), and each fused projection the answer of :meth:`BackendPolicy.matmul_choice` (``native_max_m``,
``exact``).  Kernels only follow their node's attributes (they never ask whether a native library
exists), so :func:`use` -- or an ``InferenceSession`` made under another policy -- changes what every
kernel runs.  The environment switches are read here and nowhere else (:func:`environment`):

================================  ==============================================================
``LIBREMAX_NATIVE=0``             no native CPU kernels (torch only)
``LIBREMAX_NATIVE_ISA=<variant>`` force a kernel variant (``avx512``, ``avx2``, ...; see ``native.build``)
``LIBREMAX_ACT_REFINE=<fraction>`` activation blocks of the quantised matmuls that get refined 8-bit
                                  codes (see ``native.act_refine``)
``LIBREMAX_ACT_REFINE_THRESHOLD`` of those, only blocks whose squared scale is >= this x the row's mean
                                  (default 2; 0: the fraction alone)
``LIBREMAX_QMATMUL=exact``        quantised projections take float32 activations (dequantised tiles)
``LIBREMAX_QMATMUL_FAST=1``       the torch ``qmatmul`` op may use the int4 bf16 GEMM (approximate)
================================  ==============================================================

``InferenceSession.backend`` is the policy a session compiles with (:func:`current` by default);
model building asks the session's policy (``architectures/common/weights.py``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from max.dtype import DType

__all__ = ["BackendPolicy", "Environment", "MatmulChoice", "WeightStorage", "current", "environment", "reset",
           "use"]


@dataclass(frozen=True)
class Environment:
    """The backend's environment switches as set now (see the module doc); ``isa``, ``act_refine`` and
    ``act_refine_threshold`` are the raw strings (empty / None when unset), parsed by ``native.build.choose`` and ``native``."""

    native: bool
    isa: str
    act_refine: Optional[str]
    exact_qmatmul: bool
    fast_int4_qmatmul: bool
    act_refine_threshold: Optional[str] = None


def environment() -> Environment:
    """The switches of the module doc, read from ``os.environ`` now (the only reader of them)."""
    env = os.environ
    return Environment(native=env.get("LIBREMAX_NATIVE", "1") != "0", isa=env.get("LIBREMAX_NATIVE_ISA", ""),
                       act_refine=env.get("LIBREMAX_ACT_REFINE") or None,
                       exact_qmatmul=env.get("LIBREMAX_QMATMUL", "").lower() == "exact",
                       fast_int4_qmatmul=env.get("LIBREMAX_QMATMUL_FAST", "0") == "1",
                       act_refine_threshold=env.get("LIBREMAX_ACT_REFINE_THRESHOLD") or None)


@dataclass(frozen=True)
class WeightStorage:
    """How a weight of some encoding lives on a device: ``dtype`` of its float tensor (``uint8``
    for GGML blocks kept as they are), and whether GGML blocks stay quantised in memory."""

    dtype: DType
    keep_quantized: bool


@dataclass(frozen=True)
class MatmulChoice:
    """The kernel of one fused projection: the native kernels for fewer than ``native_max_m``
    activation rows (0: never), torch from there on; ``exact``: float32 activations for quantised
    weights (no 8-bit activation codes)."""

    native_max_m: int
    exact: bool = False


@dataclass(frozen=True)
class BackendPolicy:
    """The decisions of one process (see the module doc).  ``native``: the native CPU kernels are
    built and loaded; ``isa``: their variant; ``cpu_bf16``: the CPU has bfloat16 matrix instructions."""

    native: bool
    isa: Optional[str]
    exact_qmatmul: bool = False
    fast_int4_qmatmul: bool = False
    cpu_bf16: bool = False

    @classmethod
    def from_environment(cls) -> "BackendPolicy":
        """The policy the environment asks for (the only reader of the switches above)."""
        from max.engine import native
        from max.engine.kernels.linalg import CPU_NATIVE_BF16

        env = environment()
        so = native.lib()  # the process's library: LIBREMAX_NATIVE / LIBREMAX_NATIVE_ISA, resolved once
        return cls(native=so is not None, isa=native.isa() if so is not None else None,
                   exact_qmatmul=env.exact_qmatmul, fast_int4_qmatmul=env.fast_int4_qmatmul,
                   cpu_bf16=bool(CPU_NATIVE_BF16))

    # ---------------------------------------------------------------- weights (model building)
    def compute_dtype(self, encoding: Any, device: Any) -> DType:
        """The dtype a model computes in (activations, norms, KV cache) for a weight ``encoding``
        (a ``SupportedEncoding`` or None) on ``device``.

        On the CPU with the native kernels: float32 for every encoding (quantised and half weights
        are read as they are, with float32 accumulation).  Without them: GGML encodings are
        dequantised to float32, float16 runs as float32, bfloat16 stays bfloat16 only on CPUs with
        bf16 matrix instructions.  On accelerators: bfloat16 for GGML/float8, else the encoding's dtype.
        """
        if encoding is None:
            return DType.float32
        quantized = bool(getattr(encoding, "is_quantized", False))
        dt = DType.uint8 if quantized else encoding.dtype
        if device.is_cpu():
            if quantized or dt in (DType.float16, DType.float8_e4m3fn) or self.native:
                return DType.float32
            if dt == DType.bfloat16 and not self.cpu_bf16:
                return DType.float32
            return dt
        return DType.bfloat16 if quantized or dt == DType.float8_e4m3fn else dt

    def weight_storage(self, encoding: Any, device: Any) -> WeightStorage:
        """How weights of ``encoding`` are kept on ``device``: bfloat16/float16 stay half precision
        and GGML blocks (GGUF's, or GPTQ/AWQ int4 groups repacked) stay quantised on a CPU with the native
        kernels (which widen / decode them as they stream them); otherwise the compute dtype, GGML blocks
        dequantised once at load."""
        comp = self.compute_dtype(encoding, device)
        on_native_cpu = device.is_cpu() and self.native
        quantized = bool(getattr(encoding, "is_quantized", False))
        keep = on_native_cpu and quantized  # GGUF blocks, and GPTQ/AWQ groups repacked to Q4_0/Q4_1 blocks
        dtype = comp
        if (encoding is not None and on_native_cpu and not quantized
                and encoding.dtype in (DType.bfloat16, DType.float16)):
            dtype = encoding.dtype
        return WeightStorage(dtype, keep)

    # ---------------------------------------------------------------- kernels (lowering)
    def kernel_variant(self, on_cpu: bool) -> Optional[str]:
        """The native kernel variant a node on the CPU (``on_cpu``) runs, which the lowering writes into
        it as ``native``; None: its torch kernel."""
        if not (self.native and on_cpu):
            return None
        if self.isa is None:
            from max.engine.native.build import choose

            return choose()
        return self.isa

    def matmul_choice(self, kinds: Sequence[str], weight_dtypes: Sequence[DType], x_dtype: DType,
                      on_cpu: bool) -> MatmulChoice:
        """Which kernel a fused projection ``x @ concat(W_i)^T`` runs (``kinds``: ``"dense"`` or a GGML
        kind, ``"packed:"``-prefixed once repacked)."""
        from max.engine import native
        from max.engine.native import cost

        quantized = any(k != "dense" for k in kinds)
        exact = self.exact_qmatmul and quantized and on_cpu
        if not (self.native and on_cpu and x_dtype == DType.float32) or exact:
            return MatmulChoice(0, exact)
        storages = []
        for kind, dt in zip(kinds, weight_dtypes):
            if kind == "dense":
                if dt not in (DType.float32, DType.bfloat16, DType.float16):
                    return MatmulChoice(0)
                storages.append("f32" if dt == DType.float32 else "half")
            else:
                name = kind[7:] if kind.startswith("packed:") else kind
                if name not in native.GGML_KINDS:
                    return MatmulChoice(0)
                storages.append("quant")
        return MatmulChoice(cost.native_max_m(self.isa or "generic", storages))


_CURRENT: Optional[tuple[tuple, BackendPolicy]] = None
_OVERRIDE: Optional[BackendPolicy] = None


def current() -> BackendPolicy:
    """This process's policy: read from the environment on first use, and again when one of the
    run-time switches changes (the native library and its variant are chosen once per process)."""
    global _CURRENT
    if _OVERRIDE is not None:
        return _OVERRIDE
    from max.engine import native

    so = native.lib()  # chosen once per process (tests may swap it): part of the key, like the switches
    env = environment()
    key = (env.exact_qmatmul, env.fast_int4_qmatmul, id(so))
    if _CURRENT is None or _CURRENT[0] != key:
        _CURRENT = (key, BackendPolicy.from_environment())
    return _CURRENT[1]


def use(policy: Optional[BackendPolicy]) -> None:
    """Make ``policy`` the process's policy (None: back to the environment's).  For tests and tools
    that compare backends within one process."""
    global _OVERRIDE
    _OVERRIDE = policy


def reset() -> None:
    """Forget the cached policy; the next :func:`current` reads the environment again."""
    global _CURRENT, _OVERRIDE
    _CURRENT = _OVERRIDE = None
