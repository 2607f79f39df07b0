"""range and hann_window."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from max.dtype import DType
from max.graph import DeviceRef, Dim, Graph, TensorType, ops
from support import run1, run_graph, tt
from support import test_device_ref as dev_ref

CPU = DeviceRef.CPU()


def _build(fn, types=()):
    with Graph("g", input_types=list(types)) as g:
        return fn(*g.inputs)


# ------------------------------------------------------------------ range
@given(st.integers(-20, 20), st.integers(-20, 20), st.integers(-5, 5).filter(bool),
       st.sampled_from([DType.int64, DType.int32, DType.float32]))
def test_range_ints_match_arange(start, stop, step, dt):
    # MAX's length: (stop - start) // step, floored (a prefix of np.arange)
    want = np.arange(start, stop, step)[:max(0, (stop - start) // step)].astype(dt.to_numpy())
    got = run1(lambda: ops.range(start, stop, step, dtype=dt, device=dev_ref()), [])
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@given(st.floats(-5, 5), st.floats(0.01, 6), st.floats(0.1, 2), st.booleans())
def test_range_floats_match_arange(start, span, step, down):
    stop = start + span
    if down:
        start, stop, step = stop, start, -step
    n = max(0, int((stop - start) // step))  # MAX's floored length
    want = start + step * np.arange(n, dtype=np.float64)
    out = _build(lambda: ops.range(start, stop, step, dtype=DType.float64, device=CPU))
    assert out.shape == [len(want)]
    got = run1(lambda: ops.range(start, stop, step, dtype=DType.float64, device=CPU), [])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_range_static_type_and_defaults():
    out = _build(lambda: ops.range(0, 10, 3, dtype=DType.int32, device=CPU))
    assert out.type == TensorType(DType.int32, [3], CPU)  # MAX: 10 // 3
    out = _build(lambda: ops.range(5, 5, 1, dtype=DType.int64, device=CPU))
    assert out.shape == [0]
    with pytest.raises(TypeError, match="missing 2 required keyword-only arguments: 'dtype' and 'device'"):
        _build(lambda: ops.range(0, 4))  # MAX: no defaults
    out = _build(lambda: ops.range(np.int32(1), np.int64(8), np.int8(2), out_dim=3, dtype=DType.int64, device=CPU))
    assert out.shape == [3]


def test_range_with_dims():
    def f(x):
        r = ops.range(0, x.shape[0], 1, dtype=DType.int64, device=CPU)
        assert r.shape == ["n"]
        r2 = ops.range(1, x.shape[0], 2, dtype=DType.int64, device=CPU)
        assert r2.shape == [Dim("n") // 2]
        r3 = ops.range(x.shape[0], 0, -1, dtype=DType.int64, device=CPU)
        assert r3.shape == ["n"]
        return r, r2, r3

    for n in (4, 7):
        outs = run_graph(f, [tt(DType.float32, ["n"])], np.zeros(n, np.float32))
        for got, want in zip(outs, [np.arange(n), np.arange(1, n, 2), np.arange(n, 0, -1)]):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("lo,hi,step", [(2, 7, 1), (0, 3, 1), (9, 1, -3)])
def test_range_tensor_args_with_out_dim(lo, hi, step):
    types = [tt(DType.int64, []), tt(DType.int64, [])]

    def f(a, b):
        r = ops.range(a, b, step, out_dim="k", dtype=DType.int64, device=CPU)
        assert r.shape == ["k"]
        return r

    got = run1(f, types, np.array(lo), np.array(hi))
    np.testing.assert_array_equal(got, np.arange(lo, hi, step))


def test_range_out_dim_asserted_at_execution():
    types = [tt(DType.int64, ["n"]), tt(DType.int64, []), tt(DType.int64, [])]
    f = lambda x, a, b: x + ops.range(a, b, 1, out_dim="n", dtype=DType.int64, device=CPU)  # noqa: E731
    np.testing.assert_array_equal(run1(f, types, np.zeros(3, np.int64), np.array(1), np.array(4)), [1, 2, 3])
    with pytest.raises(Exception, match="range"):
        run1(f, types, np.zeros(3, np.int64), np.array(1), np.array(5))


def test_range_errors():
    def check(fn, exc, match, types=()):
        with pytest.raises(exc, match=match):
            _build(fn, types)

    check(lambda: ops.range(0, 5, 1, out_dim=4, dtype=DType.int64, device=CPU), ValueError,
          "range: out_dim is 4 but range.* has 5 elements")
    t = TensorType(DType.int64, [], CPU)
    check(lambda a: ops.range(0, a, 1, dtype=DType.int64, device=CPU), ValueError,
          "^Dynamic ranges must provide an explicit out_dim$", [t])
    check(lambda a: ops.range(0, a.cast(DType.float32), a, out_dim="k", dtype=DType.int64, device=CPU), TypeError,
          "range: tensor arguments must have the same dtype", [t])
    check(lambda: ops.range(0, 5, 1, dtype="int64", device=CPU), TypeError, "range: dtype must be a DType")
    check(lambda: ops.range(0, 5, 1, dtype=DType.int64, device="cpu"), TypeError, "range")
    check(lambda: ops.range(0, Dim("n"), 0.5, dtype=DType.int64, device=CPU), TypeError, "step must be a non-zero int")
    check(lambda: ops.range(0, np.zeros(3), 1, dtype=DType.int64, device=CPU), ValueError,
          "^range expected scalar values as inputs!")


# ------------------------------------------------------------------ hann_window
def _hann_ref(n, periodic):
    if n == 0:
        return np.zeros(0)
    denom = n if periodic else n - 1
    if denom == 0:
        return np.ones(n)
    k = np.arange(n)
    return 0.5 - 0.5 * np.cos(2 * math.pi * k / denom)


@pytest.mark.parametrize("periodic", [True, False])
@pytest.mark.parametrize("n", [0, 1, 2, 5, 16])
def test_hann_window(n, periodic):
    out = _build(lambda: ops.hann_window(n, CPU, periodic=periodic))
    assert out.type == TensorType(DType.float32, [n], CPU)
    got = run1(lambda: ops.hann_window(n, dev_ref(), periodic=periodic, dtype=DType.float64), [])
    np.testing.assert_allclose(got, _hann_ref(n, periodic), atol=1e-12)
    if n > 1 and not periodic:
        np.testing.assert_allclose(got, np.hanning(n), atol=1e-12)


@pytest.mark.parametrize("n", [1, 4, 9])
def test_hann_periodic_identity(n):
    def f():
        return ops.hann_window(n, CPU, periodic=True), ops.hann_window(n + 1, CPU, periodic=False)[:-1]

    a, b = run_graph(f, [])
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_hann_errors():
    with pytest.raises(ValueError, match="hann_window: window_length must be non-negative, got -1"):
        _build(lambda: ops.hann_window(-1, CPU))
    for bad in (2.0, "4", True, None):
        with pytest.raises(TypeError, match="hann_window: window_length must be an int"):
            _build(lambda: ops.hann_window(bad, CPU))
    with pytest.raises(TypeError, match="hann_window: dtype must be a DType"):
        _build(lambda: ops.hann_window(3, CPU, dtype=np.float32))
