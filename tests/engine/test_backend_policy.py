"""The backend policy chooses, kernels obey (``max.engine.backend``, ``compiler/native_lowering.py``).

On a tiny Llama (pipeline model, one prefill of a few tokens, so every projection is below the cost
model's torch threshold): under a policy without native kernels no symbol of the native library is
touched (the library objects are wrapped so that every attribute read is recorded) although the library
is loaded; under a policy with them no kernel that has a native path takes its torch path (the torch
helpers those paths call are wrapped and recorded); both compute the same logits within float32
tolerance.  The lowering writes the choice into every such node; the environment switches are read by
``backend.environment`` alone."""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from lm_support import make_tiny_llama  # noqa: E402

from max.engine import backend, native  # noqa: E402
from max.engine.compiler.native_lowering import NATIVE_KERNELS  # noqa: E402

IDS = [3, 17, 42, 8, 99, 23, 61, 5, 77, 30]
SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "max"


class _Recording:
    """The native library with every ``lmx_*`` symbol read recorded in ``seen``."""

    def __init__(self, so, seen: list) -> None:
        object.__setattr__(self, "_so", so)
        object.__setattr__(self, "_seen", seen)

    def __getattr__(self, name):
        if name.startswith("lmx_"):
            self._seen.append(name)
        return getattr(self._so, name)


def _torch_paths(monkeypatch, calls: list) -> None:
    """Record every call of the torch code that the kernels with a native path fall back to."""
    from max.engine.kernels import decoder, fused, moe, norm, quantization, ragged, recurrent

    def spy(mod, name):
        real = getattr(mod, name)

        def wrapped(*a, **k):
            calls.append(f"{mod.__name__.rsplit('.', 1)[-1]}.{name}")
            return real(*a, **k)

        monkeypatch.setattr(mod, name, wrapped)

    for mod, name in ((fused, "rms_norm"), (fused, "_blockwise_linear"), (fused, "_gate"), (quantization, "qmatmul"),
                      (ragged, "flash_attention_ragged"), (ragged, "ragged_rope_tables"), (ragged, "kv_store"),
                      (decoder, "kv_load"), (moe, "grouped_matmul"), (recurrent, "_gdr_prepare"),
                      (recurrent, "_step_size"), (norm.F, "silu")):
        spy(mod, name)
    real_linear = torch.nn.functional.linear

    def linear(*a, **k):
        calls.append("F.linear")
        return real_linear(*a, **k)

    monkeypatch.setattr(fused.F, "linear", linear)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_llama(str(tmp_path_factory.mktemp("tiny_policy")), initializer_range=0.05)


def _run(d: str, policy: backend.BackendPolicy):
    from max.pipelines.lib.teacher_forcing import teacher_forced_logits

    backend.use(policy)
    try:
        return teacher_forced_logits(d, IDS)
    finally:
        backend.use(None)


@pytest.mark.skipif(native.lib() is None, reason="native kernels unavailable")
def test_policy_reaches_every_kernel(tiny, monkeypatch):
    variant = native.isa()
    seen: list = []
    rec = _Recording(native.lib(), seen)
    monkeypatch.setitem(native._libs, variant, rec)
    monkeypatch.setattr(native, "_default", rec)
    lowered: list = []
    from max.engine.compiler import native_lowering

    real_lower = native_lowering.lower

    def lower(prog, policy=None):
        counts = real_lower(prog, policy)
        lowered.append([(n.op, n.attrs.get("native")) for n in prog.nodes])
        return counts

    monkeypatch.setattr(native_lowering, "lower", lower)
    calls: list = []
    _torch_paths(monkeypatch, calls)

    # torch: the library is loaded, yet not one of its symbols is read, and the torch paths do run
    tor = _run(tiny, backend.BackendPolicy(native=False, isa=None))
    assert seen == [], sorted(set(seen))
    assert {"F.linear", "ragged.kv_store"} <= set(calls), sorted(set(calls))
    assert all(v is None for prog in lowered for _, v in prog)

    # native: every kernel with a native path runs it (no torch fallback), on the policy's variant
    calls.clear()
    lowered.clear()
    nat = _run(tiny, backend.BackendPolicy(native=True, isa=variant))
    assert calls == [], sorted(set(calls))
    assert {"lmx_dense_matmul", "lmx_qkv_attention"} <= set(seen), sorted(set(seen))
    ops = [(op, v) for prog in lowered for op, v in prog]
    assert ("qkv_attention_native", variant) in ops and ("fused_matmul_t", variant) in ops
    assert all(v == variant for op, v in ops if op in NATIVE_KERNELS), ops

    assert tor.shape == nat.shape == (len(IDS), tor.shape[1])
    np.testing.assert_allclose(nat, tor, rtol=0, atol=1e-4 * float(np.abs(tor).max()))


def test_no_kernel_asks_the_library_and_only_the_backend_reads_its_switches():
    """No kernel calls ``native.lib()`` (they take their node's variant); ``LIBREMAX_NATIVE*``,
    ``LIBREMAX_ACT_REFINE`` and ``LIBREMAX_QMATMUL*`` are read from the environment in ``engine/backend.py``
    alone (names in docstrings and messages are fine: only ``os.environ`` / ``os.getenv`` reads count)."""
    for path in sorted((SRC / "engine" / "kernels").glob("*.py")):
        assert "native.lib(" not in path.read_text(), path
    switches = ("LIBREMAX_NATIVE", "LIBREMAX_ACT_REFINE", "LIBREMAX_QMATMUL")
    readers = set()
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = ast.unparse(f)
            if name in ("os.environ.get", "os.getenv", "environ.get", "env.get", "os.environ.__getitem__"):
                arg = node.args[0] if node.args else None
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith(switches):
                    readers.add(str(path.relative_to(SRC)))
        text = path.read_text()
        for sw in switches:
            if f'os.environ["{sw}' in text or f"os.environ['{sw}" in text:
                readers.add(str(path.relative_to(SRC)))
    assert readers <= {"engine/backend.py"}, readers


def test_environment_switches(monkeypatch):
    monkeypatch.setenv("LIBREMAX_NATIVE", "0")
    monkeypatch.setenv("LIBREMAX_NATIVE_ISA", "avx2")
    monkeypatch.setenv("LIBREMAX_ACT_REFINE", "1/8")
    monkeypatch.setenv("LIBREMAX_QMATMUL", "EXACT")
    monkeypatch.delenv("LIBREMAX_QMATMUL_FAST", raising=False)
    assert backend.environment() == backend.Environment(native=False, isa="avx2", act_refine="1/8",
                                                        exact_qmatmul=True, fast_int4_qmatmul=False)
    monkeypatch.delenv("LIBREMAX_NATIVE")
    monkeypatch.delenv("LIBREMAX_ACT_REFINE")
    monkeypatch.setenv("LIBREMAX_QMATMUL_FAST", "1")
    monkeypatch.setenv("LIBREMAX_ACT_REFINE_THRESHOLD", "1.5")
    env = backend.environment()
    assert env.native and env.act_refine is None and env.fast_int4_qmatmul and env.exact_qmatmul
    assert env.act_refine_threshold == "1.5"
    # the kernel variant nodes get: the policy's, none off the CPU or without native kernels
    assert backend.BackendPolicy(native=True, isa="avx2").kernel_variant(True) == "avx2"
    assert backend.BackendPolicy(native=True, isa="avx2").kernel_variant(False) is None
    assert backend.BackendPolicy(native=False, isa=None).kernel_variant(True) is None
