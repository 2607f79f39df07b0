"""Helpers shared by graph/op/engine tests: build a graph, compile it, run it.

``run_graph(fn, input_types, *arrays)`` builds ``Graph("t", fn, input_types)``,
loads it in a session on the test device and returns numpy outputs.
``LIBREMAX_TEST_DEVICE=gpu`` moves inputs/graphs to the first accelerator.
"""

from __future__ import annotations

import contextlib
import math
import os
from fractions import Fraction
from typing import Any, Callable, Sequence

import numpy as np

from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType

ON_GPU = os.environ.get("LIBREMAX_TEST_DEVICE", "cpu").lower() == "gpu"


def test_device_ref() -> DeviceRef:
    return DeviceRef.GPU() if ON_GPU else DeviceRef.CPU()


def session():
    from max import driver
    from max.engine import InferenceSession

    devs = [driver.CPU()] + ([driver.Accelerator()] if ON_GPU else [])
    return InferenceSession(devices=devs)


def tt(dtype: DType, shape: Sequence[Any]) -> TensorType:
    """A TensorType on the test device."""
    return TensorType(dtype, shape, test_device_ref())


def to_input(a: Any) -> Any:
    from max.driver import Buffer

    if isinstance(a, np.ndarray):
        b = Buffer.from_numpy(a if a.flags.c_contiguous else a.copy(order="C"))
        if ON_GPU:
            from max import driver

            b = b.to(driver.Accelerator())
        return b
    return a


def run_graph(fn: Callable[..., Any], input_types: Sequence[TensorType], *arrays: Any,
              weights: dict | None = None) -> list[np.ndarray]:
    g = Graph("test_graph", fn, input_types=input_types)
    model = session().load(g, weights_registry=weights)
    outs = model.execute(*[to_input(a) for a in arrays])
    return [o.to_numpy() for o in outs]


def run1(fn: Callable[..., Any], input_types: Sequence[TensorType], *arrays: Any, **kw: Any) -> np.ndarray:
    (out,) = run_graph(fn, input_types, *arrays, **kw)
    return out


def np_dtype(dt: DType) -> np.dtype:
    return dt.to_numpy()


def native_kernels() -> bool:
    """Whether the engine runs CPU graphs on the native kernels (quantised matmuls then use 8-bit
    activation codes, see ``q8_activation_reference``)."""
    from max.engine import backend

    policy = backend.current()
    return not ON_GPU and not policy.exact_qmatmul and policy.native


def isa_params() -> list:
    """One pytest param per native kernel variant (``max.engine.native.build.VARIANTS``), each skipped with
    its reason where this CPU cannot execute it; one skipped param when no native library can be built."""
    import pytest

    from max.engine import native

    if native.lib() is None:  # pragma: no cover - no C compiler
        return [pytest.param("none", marks=pytest.mark.skip(reason="native kernels unavailable"))]
    from max.engine.native import build

    return [pytest.param(v, marks=pytest.mark.skipif(v not in native.runnable(), reason=f"cannot execute {v}"))
            for v in build.VARIANTS]


def q8_activation_reference(x: np.ndarray, w: np.ndarray, refine: Any = None, threshold: Any = None) -> np.ndarray:
    """float64 ``x @ w.T`` with x quantised as the native quantised matmul does: per 32 values of each
    row, scale d = max|x| / 127 and codes round(x / d) (round half to even) clipped to [-127, 127].

    ``refine``: the fraction of each row's blocks whose residual ``x - d * codes`` (float32) is quantised
    again the same way and added (the packed kernels' refined codes, csrc/qmatmul.c): those with the
    largest d, ties to the lower index, ``ceil(fraction * blocks)`` of them and at least one.  None: the
    kernels' current setting (``native.act_refine()``); 0 for the unpacked GGML-layout kernels, which do not
    refine.  ``threshold`` t > 0 (None: ``native.act_refine_threshold()``): when that count is below the row's
    blocks, only the blocks with d^2 >= t * mean(d^2) of the row are refined, the largest of them if more."""
    x = np.asarray(x, np.float32)
    lead, k = x.shape[:-1], x.shape[-1]
    xb = x.reshape(-1, k // 32, 32)

    def codes(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        amax = np.abs(v).max(-1, keepdims=True)
        d = (amax / np.float32(127)).astype(np.float32)
        inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
        return d, np.clip(np.rint(v * inv), -127, 127).astype(np.float32)

    d, q = codes(xb)
    xq = q.astype(np.float64) * d.astype(np.float64)
    if refine is None:
        from max.engine import native

        refine = native.act_refine()
    frac = Fraction(refine).limit_denominator(1024)
    if frac > 0:
        d2, q2 = codes((xb - d * q).astype(np.float32))
        val = d[..., 0]
        n = val.shape[1]
        take = min(n, max(1, math.ceil(frac * n)))
        chosen = np.argsort(-val, axis=1, kind="stable")[:, :take]
        mask = np.zeros(val.shape, bool)
        np.put_along_axis(mask, chosen, True, axis=1)
        if threshold is None:
            from max.engine import native

            threshold = native.act_refine_threshold()
        t = float(np.float32(threshold))
        if t > 0 and take < n:
            e2 = val.astype(np.float64) ** 2
            tot = e2.sum(1, keepdims=True)
            above = (e2 >= t * tot / n) & (tot > 0)
            mask = np.where(above.sum(1, keepdims=True) > take, mask, above)
        xq = xq + np.where(mask[..., None], q2.astype(np.float64) * d2.astype(np.float64), 0.0)
    return xq.reshape(*lead, k) @ np.asarray(w, np.float64).T


def scheduled_greedy(llm: Any, prompts: Sequence[str], max_new_tokens: int, params: Any = None) -> list[list[int]]:
    """Greedy tokens of ``prompts`` submitted together to ``llm``'s scheduler (one ragged batch),
    in prompt order; ``params`` overrides the greedy ``SamplingParams``."""
    from max.interfaces import SamplingParams

    params = params or SamplingParams(top_k=1, max_new_tokens=max_new_tokens, ignore_eos=True)
    ctxs = [llm.make_context(p, params) for p in prompts]
    toks: dict[str, list[int]] = {c.request_id: [] for c in ctxs}
    for c in ctxs:
        llm.scheduler.submit(c, lambda o: toks[o.request_id].extend(o.tokens))
    llm.scheduler.run_until_idle()
    return [toks[c.request_id] for c in ctxs]


_apt_updated = False


def apt_install(*packages: str) -> str | None:
    """``apt-get install`` Debian ``packages`` for a test that needs them (as root; the package index is
    updated once per process); None on success, else why not (the test then skips with that reason)."""
    import shutil
    import subprocess

    global _apt_updated
    if shutil.which("apt-get") is None:
        return "no apt-get"
    if os.geteuid() != 0:
        return f"not root (cannot apt-get install {' '.join(packages)})"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    lock = ["-o", "DPkg::Lock::Timeout=300"]
    try:
        if not _apt_updated:
            r = subprocess.run(["apt-get", *lock, "update"], capture_output=True, text=True, env=env, timeout=600)
            if r.returncode != 0:
                return f"apt-get update failed: {r.stderr.strip()[-500:]}"
            _apt_updated = True
        r = subprocess.run(["apt-get", *lock, "install", "-y", "--no-install-recommends", *packages],
                           capture_output=True, text=True, env=env, timeout=900)
    except (OSError, subprocess.SubprocessError) as e:
        return f"apt-get failed: {e}"
    if r.returncode != 0:
        return f"apt-get install {' '.join(packages)} failed: {r.stderr.strip()[-500:]}"
    return None


@contextlib.contextmanager
def raises(exc: type, *phrases: str):
    """The exact exception class ``exc`` (not a subclass or a sibling) whose message contains every phrase
    verbatim: how the MAX 26.7 behaviour tests check MAX's exception types and key phrases."""
    import pytest

    with pytest.raises(BaseException) as info:
        yield info
    assert type(info.value) is exc, f"expected exactly {exc.__name__}, got {type(info.value).__name__}: {info.value}"
    for p in phrases:
        assert p in str(info.value), f"{p!r} not in {str(info.value)!r}"


def build(types: Sequence[TensorType], fn: Callable[..., Any]) -> Any:
    """Run ``fn`` on the inputs of a new graph with ``types`` (graph build only); its result."""
    with Graph("b", input_types=types) as g:
        return fn(*[v.tensor for v in g.inputs])
