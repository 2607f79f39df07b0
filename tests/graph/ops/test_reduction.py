"""Reductions, softmax, cumsum, top_k and argsort against float64 numpy references."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from max.dtype import DType
from max.graph import Graph, ops
from support import run1, run_graph, session, to_input, tt

shapes = hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=5)
FLOATS = [DType.float32, DType.float64]
INTS = [DType.int32, DType.int64]


def _array(data, shape, dt: DType, lo=-5, hi=5):
    npdt = dt.to_numpy()
    if dt.is_float():
        return data.draw(hnp.arrays(npdt, shape, elements=st.floats(lo, hi, width=32)))
    return data.draw(hnp.arrays(npdt, shape, elements=st.integers(lo * 20, hi * 20)))


def _axis(data, rank):
    return data.draw(st.integers(-rank, rank - 1), label="axis")


def _tol(dt: DType) -> dict:
    return {"rtol": 1e-5, "atol": 1e-5} if dt is DType.float32 else {"rtol": 1e-12, "atol": 1e-12}


def _int_mean(x, axis):
    s = np.sum(x.astype(np.int64), axis=axis, keepdims=True)
    n = x.shape[axis]
    return (np.sign(s) * (np.abs(s) // n)).astype(x.dtype)  # rounded toward zero


REDUCTIONS = {
    "sum": (ops.sum, lambda x, a: np.sum(x, axis=a, keepdims=True)),
    "mean": (ops.mean, lambda x, a: np.mean(x, axis=a, keepdims=True)),
    "max": (lambda x, axis: ops.max(x, axis=axis), lambda x, a: np.max(x, axis=a, keepdims=True)),
    "min": (lambda x, axis: ops.min(x, axis=axis), lambda x, a: np.min(x, axis=a, keepdims=True)),
    "argmax": (ops.argmax, lambda x, a: np.argmax(x, axis=a, keepdims=True)),
    "argmin": (ops.argmin, lambda x, a: np.argmin(x, axis=a, keepdims=True)),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
@given(data=st.data())
def test_reduction_matches_numpy(name, data):
    op, ref = REDUCTIONS[name]
    shape = data.draw(shapes)
    axis = _axis(data, len(shape))
    dt = data.draw(st.sampled_from(FLOATS + INTS))
    x = _array(data, shape, dt)
    out = run1(lambda a: op(a, axis=axis), [tt(dt, shape)], x)
    want_shape = list(shape)
    want_shape[axis] = 1
    assert out.shape == tuple(want_shape)
    if name.startswith("arg"):
        assert out.dtype == np.int64
        np.testing.assert_array_equal(out, ref(x, axis))  # ties: first index, like numpy
    elif dt.is_float():
        assert out.dtype == dt.to_numpy()
        np.testing.assert_allclose(out, ref(x.astype(np.float64), axis), **_tol(dt))
    else:
        assert out.dtype == dt.to_numpy()
        want = _int_mean(x, axis) if name == "mean" else ref(x.astype(np.int64), axis).astype(x.dtype)
        np.testing.assert_array_equal(out, want)


def test_reductions_default_axis_is_last():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = [tt(DType.float32, [2, 3, 4])]
    np.testing.assert_array_equal(run1(ops.sum, t, x), x.sum(-1, keepdims=True))
    np.testing.assert_array_equal(run1(ops.mean, t, x), x.mean(-1, keepdims=True))
    np.testing.assert_array_equal(run1(ops.max, t, x), x.max(-1, keepdims=True))
    np.testing.assert_array_equal(run1(ops.min, t, x), x.min(-1, keepdims=True))
    np.testing.assert_array_equal(run1(ops.argmax, t, x), np.full((2, 3, 1), 3))
    np.testing.assert_array_equal(run1(ops.argmin, t, x), np.zeros((2, 3, 1)))
    np.testing.assert_array_equal(run1(lambda a: a.max(), t, x), x.max(-1, keepdims=True))
    np.testing.assert_array_equal(run1(lambda a: a.min(axis=0), t, x), x.min(0, keepdims=True))
    np.testing.assert_array_equal(run1(lambda a: a.argmax(axis=1), t, x), np.full((2, 1, 4), 2))
    np.testing.assert_allclose(run1(lambda a: a.mean(axis=1), t, x), x.mean(1, keepdims=True))


def test_arg_reductions_return_first_index_on_ties():
    x = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [0, 0, 5, 5]], dtype=np.float32)
    t = [tt(DType.float32, [3, 4])]
    np.testing.assert_array_equal(run1(ops.argmax, t, x)[:, 0], [1, 0, 2])
    np.testing.assert_array_equal(run1(ops.argmin, t, x)[:, 0], [3, 0, 0])


@given(data=st.data())
def test_elementwise_max_min_forms(data):
    a_shape, b_shape = data.draw(
        hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=4)
    ).input_shapes
    a = _array(data, a_shape, DType.float32)
    b = _array(data, b_shape, DType.float32)
    types = [tt(DType.float32, a_shape), tt(DType.float32, b_shape)]
    # ``axis`` is ignored when two tensors are given
    hi = run1(lambda x, y: ops.max(x, y, axis=0), types, a, b)
    lo = run1(lambda x, y: ops.min(x, y), types, a, b)
    np.testing.assert_array_equal(hi, np.maximum(a, b))
    np.testing.assert_array_equal(lo, np.minimum(a, b))


def test_elementwise_max_with_scalar():
    x = np.array([-2.0, 0.5, 3.0], dtype=np.float32)
    out = run1(lambda a: ops.max(a, 0.0), [tt(DType.float32, [3])], x)
    np.testing.assert_array_equal(out, [0.0, 0.5, 3.0])


def test_other_dtypes():
    u = np.array([[1, 2**31, 7]], dtype=np.uint32)
    np.testing.assert_array_equal(run1(ops.sum, [tt(DType.uint32, [1, 3])], u), [[2**31 + 8]])
    np.testing.assert_array_equal(run1(ops.max, [tt(DType.uint32, [1, 3])], u), [[2**31]])
    np.testing.assert_array_equal(run1(ops.argmax, [tt(DType.uint32, [1, 3])], u), [[1]])
    i8 = np.array([100, 100], dtype=np.int8)  # the sum wraps around like int8 does
    out = run1(lambda a: ops.sum(a, 0), [tt(DType.int8, [2])], i8)
    assert out.dtype == np.int8 and out.tolist() == [np.int8(-56)]
    b = np.array([[False, True, True], [False, False, False]])
    bt = [tt(DType.bool, [2, 3])]
    np.testing.assert_array_equal(run1(ops.max, bt, b), [[True], [False]])
    np.testing.assert_array_equal(run1(ops.min, bt, b), [[False], [False]])
    np.testing.assert_array_equal(run1(ops.argmax, bt, b), [[1], [0]])
    h = np.array([[0.5, 1.5, 2.0]], dtype=np.float16)
    out = run1(ops.sum, [tt(DType.float16, [1, 3])], h)
    assert out.dtype == np.float16 and out.tolist() == [[4.0]]


def test_integer_mean_rounds_toward_zero():
    x = np.array([[-3, -4], [3, 4], [1, 1], [-1, 0]], dtype=np.int32)
    out = run1(ops.mean, [tt(DType.int32, [4, 2])], x)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out[:, 0], [-3, 3, 1, 0])


def test_result_types_with_symbolic_dims():
    with Graph("types", input_types=[tt(DType.float32, ["batch", 3, "seq"])]) as g:
        x = g.inputs[0].tensor
        assert ops.sum(x, 0).shape == [1, 3, "seq"]
        assert ops.sum(x, -1).shape == ["batch", 3, 1]
        assert ops.mean(x, 1).shape == ["batch", 1, "seq"]
        assert ops.max(x).shape == ["batch", 3, 1]
        assert ops.min(x, axis=-3).shape == [1, 3, "seq"]
        a = ops.argmax(x, axis=1)
        assert a.shape == ["batch", 1, "seq"] and a.dtype is DType.int64
        assert ops.argmin(x, 0).dtype is DType.int64
        assert ops.sum(x).dtype is DType.float32
        s = ops.softmax(x)
        assert s.shape == ["batch", 3, "seq"] and s.dtype is DType.float32
        assert ops.logsoftmax(x).type == x.type
        assert ops.cumsum(x, axis=0, exclusive=True).type == x.type
        v, i = ops.top_k(x, 2, axis=1)
        assert v.shape == ["batch", 2, "seq"] and v.dtype is DType.float32
        assert i.shape == ["batch", 2, "seq"] and i.dtype is DType.int64
        v, _ = ops.top_k(x, 4)  # a symbolic axis: k is checked when the graph runs
        assert v.shape == ["batch", 3, 4]
        srt = ops.argsort(x)
        assert srt.shape == ["batch", 3, "seq"] and srt.dtype is DType.int64
        assert ops.max(x, x).shape == ["batch", 3, "seq"]


def test_symbolic_graph_runs_at_several_sizes():
    def fn(x):
        v, i = ops.top_k(x, 2, axis=-1)
        return ops.sum(x, 0), ops.mean(x, -1), ops.argmax(x, 0), ops.softmax(x), ops.cumsum(x, 0), v, i

    g = Graph("sym", fn, input_types=[tt(DType.float32, ["batch", 3])])
    model = session().load(g)
    rng = np.random.default_rng(0)
    for n in (1, 2, 5):
        x = rng.standard_normal((n, 3)).astype(np.float32)
        outs = [o.to_numpy() for o in model.execute(to_input(x))]
        np.testing.assert_allclose(outs[0], x.sum(0, keepdims=True), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(outs[1], x.mean(-1, keepdims=True), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(outs[2], x.argmax(0)[None])
        e = np.exp(x - x.max(-1, keepdims=True))
        np.testing.assert_allclose(outs[3], e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(outs[4], np.cumsum(x, 0), rtol=1e-5, atol=1e-6)
        order = np.argsort(-x, axis=-1, kind="stable")[:, :2]
        np.testing.assert_array_equal(outs[6], order)
        np.testing.assert_array_equal(outs[5], np.take_along_axis(x, order, -1))


def _softmax_ref(x, axis):
    z = x - x.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True), z - np.log(e.sum(axis=axis, keepdims=True))


@pytest.mark.parametrize("name", ["softmax", "logsoftmax"])
@given(data=st.data())
def test_softmax_matches_numpy(name, data):
    shape = data.draw(shapes)
    dt = data.draw(st.sampled_from(FLOATS))
    x = _array(data, shape, dt, -20, 20)
    use_axis = data.draw(st.booleans())
    axis = _axis(data, len(shape)) if use_axis else -1
    op = getattr(ops, name)
    out = run1((lambda a: op(a, axis=axis)) if use_axis else op, [tt(dt, shape)], x)
    sm, lsm = _softmax_ref(x.astype(np.float64), axis)
    assert out.dtype == dt.to_numpy() and out.shape == shape
    np.testing.assert_allclose(out, sm if name == "softmax" else lsm, **_tol(dt))


@pytest.mark.parametrize("dt", [DType.float16, DType.bfloat16])
def test_softmax_half_precision(dt):
    import torch

    rng = np.random.default_rng(1)
    x32 = rng.standard_normal((4, 7)).astype(np.float32) * 4
    tdt = dt.to_torch()
    xin = torch.from_numpy(x32).to(tdt)
    x64 = xin.to(torch.float64).numpy()
    sm, lsm = _softmax_ref(x64, -1)
    for op, ref, tol in ((ops.softmax, sm, 1e-2), (ops.logsoftmax, lsm, 3e-2)):
        (out,) = run_graph(lambda a: op(a).cast(DType.float32), [tt(dt, [4, 7])], _buffer(xin))
        np.testing.assert_allclose(out, ref, rtol=tol, atol=tol)


def _buffer(t):
    from max.driver import Buffer

    return Buffer.from_dlpack(t)


def _cumsum_ref(x, axis, exclusive, reverse):
    src = np.flip(x, axis) if reverse else x
    y = np.cumsum(src, axis=axis)
    if exclusive:
        y = y - src
    return np.flip(y, axis) if reverse else y


@given(data=st.data())
def test_cumsum_matches_numpy(data):
    shape = data.draw(shapes)
    axis = _axis(data, len(shape))
    dt = data.draw(st.sampled_from(FLOATS + INTS))
    exclusive, reverse = data.draw(st.booleans()), data.draw(st.booleans())
    x = _array(data, shape, dt)
    out = run1(lambda a: ops.cumsum(a, axis=axis, exclusive=exclusive, reverse=reverse), [tt(dt, shape)], x)
    assert out.dtype == dt.to_numpy() and out.shape == shape
    if dt.is_float():
        want = _cumsum_ref(x.astype(np.float64), axis, exclusive, reverse)
        np.testing.assert_allclose(out, want, rtol=1e-5 if dt is DType.float32 else 1e-12, atol=1e-4)
    else:
        np.testing.assert_array_equal(out, _cumsum_ref(x.astype(np.int64), axis, exclusive, reverse))


def test_cumsum_documented_examples():
    x = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    t = [tt(DType.float32, [4])]
    np.testing.assert_array_equal(run1(ops.cumsum, t, x), [1, 3, 6, 10])
    np.testing.assert_array_equal(run1(lambda a: ops.cumsum(a, exclusive=True), t, x), [0, 1, 3, 6])
    np.testing.assert_array_equal(run1(lambda a: ops.cumsum(a, reverse=True), t, x), [10, 9, 7, 4])
    np.testing.assert_array_equal(run1(lambda a: ops.cumsum(a, exclusive=True, reverse=True), t, x), [9, 7, 4, 0])
    i8 = np.array([100, 100], dtype=np.int8)
    out = run1(ops.cumsum, [tt(DType.int8, [2])], i8)
    assert out.dtype == np.int8 and out.tolist() == [100, -56]


@given(data=st.data())
def test_top_k_matches_numpy(data):
    shape = data.draw(shapes)
    axis = _axis(data, len(shape))
    dt = data.draw(st.sampled_from(FLOATS + INTS))
    k = data.draw(st.integers(0, shape[axis]), label="k")
    # distinct values, so the order (and hence the indices) is unique
    perm = np.random.default_rng(data.draw(st.integers(0, 2**16))).permutation(int(np.prod(shape)))
    x = (perm.reshape(shape) - perm.size // 2).astype(dt.to_numpy())
    if dt.is_float():
        x = x * np.asarray(0.25, dt.to_numpy())
    vals, idx = run_graph(lambda a: ops.top_k(a, k, axis=axis), [tt(dt, shape)], x)
    order = np.take(np.argsort(-x.astype(np.float64), axis=axis), np.arange(k), axis=axis)
    assert vals.dtype == x.dtype and idx.dtype == np.int64
    np.testing.assert_array_equal(idx, order)
    np.testing.assert_array_equal(vals, np.take_along_axis(x, order, axis))


@given(data=st.data())
def test_argsort_matches_numpy(data):
    shape = data.draw(shapes)
    dt = data.draw(st.sampled_from(FLOATS + INTS))
    ascending = data.draw(st.booleans())
    x = _array(data, shape, dt, -1, 1)  # few distinct values: exercises ties (stable order)
    x = np.round(x) if dt.is_float() else x // 10
    out = run1(lambda a: ops.argsort(a, ascending=ascending), [tt(dt, shape)], x)
    key = x.astype(np.float64) if ascending else -x.astype(np.float64)
    assert out.dtype == np.int64 and out.shape == shape
    np.testing.assert_array_equal(out, np.argsort(key, axis=0, kind="stable"))


def test_argsort_default_call():
    x = np.array([3, 1, 2, 1], dtype=np.int64)
    np.testing.assert_array_equal(run1(ops.argsort, [tt(DType.int64, [4])], x), [1, 3, 2, 0])


# ---------------------------------------------------------------- errors
def _with_input(dt, shape, fn):
    with Graph("err", input_types=[tt(dt, shape)]) as g:
        return fn(g.inputs[0].tensor)


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "argmax", "argmin", "softmax", "logsoftmax",
                                  "cumsum"])
def test_axis_out_of_range(name):
    op = getattr(ops, name)
    if name in ("softmax", "logsoftmax", "cumsum"):
        exc, msg3, msg4, msg0 = (IndexError, r"^Axis out of range \(expected to be in range of \[-3, 2\], but got 3\)",
                                 r"but got -4\)", r"^Axis out of range \(expected to be in range of \[0, -1\], but got -1\)")
    else:  # MAX's reductions: ValueError
        exc, msg3, msg4, msg0 = (ValueError, r"^Invalid axis=3 for input x.rank=3$", r"^Invalid axis=-4 for input x.rank=3$",
                                 r"^Invalid axis=-1 for input x.rank=0$")
    with pytest.raises(exc, match=msg3):
        _with_input(DType.float32, [2, 3, 4], lambda x: op(x, axis=3))
    with pytest.raises(exc, match=msg4):
        _with_input(DType.float32, [2, 3, 4], lambda x: op(x, axis=-4))
    with pytest.raises(TypeError, match=r"axis must be an int, got float"):
        _with_input(DType.float32, [2, 3, 4], lambda x: op(x, axis=1.0))
    with pytest.raises(exc, match=msg0):  # a scalar has no axis to reduce
        _with_input(DType.float32, [], lambda x: op(x))


def test_reduction_error_names_the_op():
    with pytest.raises(ValueError, match=r"^Invalid axis=2 for input x.rank=2"):
        _with_input(DType.float32, [2, 3], lambda x: ops.sum(x, 2))
    with pytest.raises(ValueError, match=r"^Invalid axis=5 for input x.rank=2"):
        _with_input(DType.float32, [2, 3], lambda x: ops.max(x, axis=5))
    with pytest.raises(IndexError, match=r"^Axis out of range .*but got 2\)"):
        _with_input(DType.float32, [2, 3], lambda x: ops.top_k(x, 1, axis=2))


def test_dtype_errors():
    with pytest.raises(TypeError, match=r"x must be numeric, got DType.bool"):
        _with_input(DType.bool, [3], ops.cumsum)  # (sum/mean/prod of bool give bool, as in MAX)
    for name in ("softmax", "logsoftmax"):
        with pytest.raises(TypeError, match=rf"^{name}: x must be a floating-point tensor, got DType.int32"):
            _with_input(DType.int32, [3], getattr(ops, name))
    with pytest.raises(TypeError, match=r"^sum: x has dtype DType.float8_e4m3fn"):
        _with_input(DType.float8_e4m3fn, [3], ops.sum)
    with pytest.raises(TypeError, match=r"^top_k: x must be numeric, got DType.bool"):
        _with_input(DType.bool, [3], lambda x: ops.top_k(x, 1))
    with pytest.raises(TypeError, match=r"^argsort: x must be numeric, got DType.bool"):
        _with_input(DType.bool, [3], ops.argsort)


def test_empty_axis_builds():
    # MAX 26.7 accepts every reduction over a static size-0 axis: the axis becomes 1
    for name in ("max", "min", "argmax", "argmin", "sum", "mean", "prod"):
        op = getattr(ops, name)
        assert _with_input(DType.float32, [2, 0], op).shape == [2, 1]
    # reducing a non-empty axis of an empty tensor is fine
    out = run1(ops.sum, [tt(DType.float32, [0, 3])], np.zeros((0, 3), np.float32))
    assert out.shape == (0, 1)


def test_top_k_errors():
    with pytest.raises(ValueError, match=r"^top_k: k=5 is larger than axis 1 of input \[Dim\(2\), Dim\(4\)\] \(size 4\)"):
        _with_input(DType.float32, [2, 4], lambda x: ops.top_k(x, 5))
    with pytest.raises(ValueError, match=r"^top_k: k must be >= 0, got -1"):
        _with_input(DType.float32, [2, 4], lambda x: ops.top_k(x, -1))
    with pytest.raises(TypeError, match=r"^top_k: k must be an int, got float"):
        _with_input(DType.float32, [2, 4], lambda x: ops.top_k(x, 2.0))
    with pytest.raises(ValueError, match=r"^top_k: k must be a static int, got symbolic dim n"):
        from max.graph import Dim

        _with_input(DType.float32, [2, 4], lambda x: ops.top_k(x, Dim("n")))


def test_argsort_and_cumsum_argument_errors():
    with pytest.raises(ValueError, match=r"^argsort: x must have rank >= 1"):
        _with_input(DType.float32, [], ops.argsort)
    with pytest.raises(TypeError, match=r"^argsort: ascending must be a bool, got str"):
        _with_input(DType.float32, [3], lambda x: ops.argsort(x, ascending="yes"))
    with pytest.raises(TypeError, match=r"^cumsum: exclusive must be a bool, got int"):
        _with_input(DType.float32, [3], lambda x: ops.cumsum(x, exclusive=1))
    with pytest.raises(TypeError, match=r"^cumsum: reverse must be a bool, got NoneType"):
        _with_input(DType.float32, [3], lambda x: ops.cumsum(x, reverse=None))


def test_constant_operands_are_folded_correctly():
    c = np.array([[3.0, 1.0, 2.0], [0.0, 5.0, 4.0]], np.float32)

    def fn(x):
        v, i = ops.top_k(c, 2)
        return v + x, i, ops.cumsum(c, exclusive=True), ops.argsort(c), ops.max(c)

    v, i, cs, srt, mx = run_graph(fn, [tt(DType.float32, [2, 2])], np.zeros((2, 2), np.float32))
    np.testing.assert_array_equal(v, [[3, 2], [5, 4]])
    np.testing.assert_array_equal(i, [[0, 2], [1, 2]])
    np.testing.assert_array_equal(cs, [[0, 3, 4], [0, 0, 5]])
    np.testing.assert_array_equal(srt, [[1, 0, 0], [0, 1, 1]])
    np.testing.assert_array_equal(mx, [[3], [5]])
