"""Elementwise ops against float64 numpy references."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from max.dtype import DType
from max.graph import Graph, TensorType, ops
from support import run1, tt

shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=5)


def _floats(shape, lo=-5.0, hi=5.0):
    return hnp.arrays(np.float32, shape, elements=st.floats(lo, hi, width=32))


@st.composite
def broadcast_pair(draw):
    a, b = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=4)).input_shapes
    return a, b


UNARY = {
    "abs": (ops.abs, np.abs, (-5, 5)),
    "negate": (ops.negate, np.negative, (-5, 5)),
    "exp": (ops.exp, np.exp, (-5, 5)),
    "log": (ops.log, np.log, (0.015625, 5)),
    "log1p": (ops.log1p, np.log1p, (-0.875, 5)),
    "sqrt": (ops.sqrt, np.sqrt, (0, 5)),
    "rsqrt": (ops.rsqrt, lambda x: 1 / np.sqrt(x), (0.0625, 5)),
    "sin": (ops.sin, np.sin, (-5, 5)),
    "cos": (ops.cos, np.cos, (-5, 5)),
    "tanh": (ops.tanh, np.tanh, (-5, 5)),
    "atanh": (ops.atanh, np.arctanh, (-0.9375, 0.9375)),
    "erf": (ops.erf, np.vectorize(math.erf, otypes=[np.float64]), (-3, 3)),
    "sigmoid": (ops.sigmoid, lambda x: 1 / (1 + np.exp(-x)), (-5, 5)),
    "silu": (ops.silu, lambda x: x / (1 + np.exp(-x)), (-5, 5)),
    "relu": (ops.relu, lambda x: np.maximum(x, 0), (-5, 5)),
    "floor": (ops.floor, np.floor, (-5, 5)),
    "round": (ops.round, np.round, (-5, 5)),
    "trunc": (ops.trunc, np.trunc, (-5, 5)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@given(data=st.data())
def test_unary_matches_numpy(name, data):
    op, ref, (lo, hi) = UNARY[name]
    shape = data.draw(shapes)
    x = data.draw(_floats(shape, lo, hi))
    out = run1(lambda a: op(a), [tt(DType.float32, shape)], x)
    assert out.dtype == np.float32 and out.shape == shape
    np.testing.assert_allclose(out, ref(x.astype(np.float64)), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("approx", ["none", "tanh", "quick"])
@given(x=_floats((3, 4), -4, 4))
def test_gelu(approx, x):
    xd = x.astype(np.float64)
    if approx == "none":
        ref = 0.5 * xd * (1 + np.vectorize(math.erf)(xd / math.sqrt(2)))
    elif approx == "tanh":
        ref = 0.5 * xd * (1 + np.tanh(0.7978845608028654 * (xd + 0.044715 * xd**3)))
    else:
        ref = xd / (1 + np.exp(-1.702 * xd))
    out = run1(lambda a: ops.gelu(a, approximate=approx), [tt(DType.float32, (3, 4))], x)
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-6)


def test_gelu_bad_approximate():
    with Graph("g", input_types=[TensorType(DType.float32, (2,))]) as g:
        with pytest.raises(ValueError, match="gelu: approximate must be"):
            ops.gelu(g.inputs[0], approximate="fast")


BINARY = {
    "add": (ops.add, np.add),
    "sub": (ops.sub, np.subtract),
    "mul": (ops.mul, np.multiply),
    "div": (ops.div, np.divide),
    "max": (lambda a, b: ops.max(a, b), np.maximum),
    "min": (lambda a, b: ops.min(a, b), np.minimum),
    "pow": (ops.pow, np.power),
}


@pytest.mark.parametrize("name", sorted(BINARY))
@given(data=st.data())
def test_binary_broadcast_matches_numpy(name, data):
    op, ref = BINARY[name]
    sa, sb = data.draw(broadcast_pair())
    lo = 0.5 if name in ("pow", "div") else -5
    a = data.draw(_floats(sa, lo, 3))
    b = data.draw(_floats(sb, lo, 3))
    out = run1(lambda x, y: op(x, y), [tt(DType.float32, sa), tt(DType.float32, sb)], a, b)
    expect = ref(a.astype(np.float64), b.astype(np.float64))
    assert out.shape == expect.shape
    np.testing.assert_allclose(out, expect, rtol=3e-5, atol=1e-5)


@given(data=st.data())
def test_mod_has_python_sign(data):
    a = data.draw(hnp.arrays(np.int32, (6,), elements=st.integers(-50, 50)))
    b = data.draw(hnp.arrays(np.int32, (6,), elements=st.integers(1, 9) | st.integers(-9, -1)))
    out = run1(lambda x, y: x % y, [tt(DType.int32, (6,))] * 2, a, b)
    np.testing.assert_array_equal(out, np.mod(a, b))


CMP = {
    "equal": (ops.equal, np.equal),
    "not_equal": (ops.not_equal, np.not_equal),
    "greater": (ops.greater, np.greater),
    "greater_equal": (ops.greater_equal, np.greater_equal),
}


@pytest.mark.parametrize("name", sorted(CMP))
@given(data=st.data())
def test_comparisons(name, data):
    op, ref = CMP[name]
    sa, sb = data.draw(broadcast_pair())
    a = data.draw(hnp.arrays(np.int64, sa, elements=st.integers(-3, 3)))
    b = data.draw(hnp.arrays(np.int64, sb, elements=st.integers(-3, 3)))
    out = run1(lambda x, y: op(x, y), [tt(DType.int64, sa), tt(DType.int64, sb)], a, b)
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, ref(a, b))


def test_comparison_dunders():
    a = np.array([1.0, 2.0, 3.0], np.float32)
    b = np.array([3.0, 2.0, 1.0], np.float32)
    outs = [
        run1(fn, [tt(DType.float32, (3,))] * 2, a, b)
        for fn in (lambda x, y: x < y, lambda x, y: x <= y, lambda x, y: x > y, lambda x, y: x >= y,
                   lambda x, y: x == y, lambda x, y: x != y)
    ]
    for out, ref in zip(outs, (a < b, a <= b, a > b, a >= b, a == b, a != b)):
        np.testing.assert_array_equal(out, ref)


LOGIC = {
    "logical_and": (ops.logical_and, np.logical_and),
    "logical_or": (ops.logical_or, np.logical_or),
    "logical_xor": (ops.logical_xor, np.logical_xor),
}


@pytest.mark.parametrize("name", sorted(LOGIC))
@given(data=st.data())
def test_logical(name, data):
    op, ref = LOGIC[name]
    sa, sb = data.draw(broadcast_pair())
    a = data.draw(hnp.arrays(np.bool_, sa))
    b = data.draw(hnp.arrays(np.bool_, sb))
    out = run1(lambda x, y: op(x, y), [tt(DType.bool, sa), tt(DType.bool, sb)], a, b)
    np.testing.assert_array_equal(out, ref(a, b))


def test_logical_not_and_invert():
    a = np.array([True, False, True])
    np.testing.assert_array_equal(run1(lambda x: ops.logical_not(x), [tt(DType.bool, (3,))], a), ~a)
    np.testing.assert_array_equal(run1(lambda x: ~x, [tt(DType.bool, (3,))], a), ~a)


def test_logical_needs_bool():
    with Graph("g", input_types=[TensorType(DType.float32, (2,))] * 2) as g:
        with pytest.raises(ValueError, match="(?s)^Failed to create op 'AndOp'.*rmo.and: Inputs must be bools, got f32, f32"):
            ops.logical_and(*g.inputs)


def test_is_nan_is_inf():
    x = np.array([1.0, np.nan, np.inf, -np.inf, 0.0], np.float32)
    np.testing.assert_array_equal(run1(lambda a: ops.is_nan(a), [tt(DType.float32, (5,))], x), np.isnan(x))
    np.testing.assert_array_equal(run1(lambda a: ops.is_inf(a), [tt(DType.float32, (5,))], x), np.isinf(x))


@given(data=st.data())
def test_where(data):
    sc, sa, sb = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=4)).input_shapes
    c = data.draw(hnp.arrays(np.bool_, sc))
    a = data.draw(_floats(sa))
    b = data.draw(_floats(sb))
    out = run1(lambda c_, a_, b_: ops.where(c_, a_, b_),
               [tt(DType.bool, sc), tt(DType.float32, sa), tt(DType.float32, sb)], c, a, b)
    np.testing.assert_array_equal(out, np.where(c, a, b))


def test_where_condition_must_be_bool():
    with Graph("g", input_types=[TensorType(DType.float32, (2,))]) as g:
        x = g.inputs[0]
        with pytest.raises(ValueError, match="^Expected condition to be a boolean tensor, but got a tensor with dtype DType.float32"):
            ops.where(x, x, x)


@pytest.mark.parametrize(
    "src,dst",
    [(DType.float32, DType.int32), (DType.int64, DType.float64), (DType.float32, DType.bfloat16),
     (DType.bool, DType.float32), (DType.float64, DType.float16)],
)
def test_cast(src, dst):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4, 3)) * 10).astype(src.to_numpy()) if src is not DType.bool else rng.random((4, 3)) > 0.5
    out = run1(lambda a: ops.cast(a, dst), [tt(src, (4, 3))], x)
    assert out.dtype == dst.to_numpy()
    np.testing.assert_array_equal(out.astype(np.float64), x.astype(dst.to_numpy()).astype(np.float64))


def test_promotion_and_scalars():
    with Graph("g", input_types=[TensorType(DType.int32, (2,)), TensorType(DType.float16, (2,)),
                                 TensorType(DType.int8, (2,))]) as g:
        i, h, i8 = g.inputs
        assert (i8 + h).dtype is DType.float16  # int8 values all fit float16
        with pytest.raises(ValueError, match="(?s)Failed to create op 'AddOp'.*Unsafe cast from si32 to f32"):
            i + h  # MAX never widens to a third type
        assert (i / i).dtype is DType.float32  # true division of ints
        assert (i * 2).dtype is DType.int32  # int scalar takes the tensor dtype
        assert (i * 2.0).dtype is DType.int32  # a whole float fits the int dtype
        with pytest.raises(ValueError, match=r"^Unsafe cast: Can't promote python float to dtype\(DType\.int32\)\. \(mul: rhs=2\.5\)"):
            i * 2.5
        assert (h * 2.5).dtype is DType.float16
        assert (2 - i).dtype is DType.int32
    x = np.array([3, 4], np.int32)
    np.testing.assert_allclose(run1(lambda a: a / 2, [tt(DType.int32, (2,))], x), [1.5, 2.0])
    np.testing.assert_array_equal(run1(lambda a: 10 - a, [tt(DType.int32, (2,))], x), [7, 6])


def test_symbolic_broadcast_types():
    with Graph("g", input_types=[TensorType(DType.float32, ("batch", 1, 4)), TensorType(DType.float32, (3, 1))]) as g:
        a, b = g.inputs
        assert (a + b).shape == ["batch", 3, 4]


def test_broadcast_error_names_op_and_shapes():
    with Graph("g", input_types=[TensorType(DType.float32, (2, 3)), TensorType(DType.float32, (4,))]) as g:
        with pytest.raises(ValueError, match=r"(?s)Failed to create op 'AddOp'.*Input lhs \(shape \[2, 3\]\) dimension at axis 1 \(value 3\) and input rhs \(shape \[4\]\) dimension at axis 0 \(value 4\) are neither equivalent nor broadcastable"):
            ops.add(*g.inputs)
    with Graph("g", input_types=[TensorType(DType.float32, ("a",)), TensorType(DType.float32, ("b",))]) as g:
        with pytest.raises(ValueError, match="dimension at axis 0 \\(value a\\) and input rhs \\(shape \\[b\\]\\)"):
            ops.mul(*g.inputs)


def test_float_only_unary_rejects_ints():
    with Graph("g", input_types=[TensorType(DType.int32, (2,))]) as g:
        with pytest.raises(TypeError, match="exp: x must be a floating-point tensor, got DType.int32"):
            ops.exp(g.inputs[0])


def test_mixing_graphs_is_an_error():
    with Graph("one", input_types=[TensorType(DType.float32, (2,))]) as g1:
        x1 = g1.inputs[0]
    with Graph("two", input_types=[TensorType(DType.float32, (2,))]) as g2:
        with pytest.raises(ValueError, match="belongs to graph 'one'"):
            ops.add(x1, g2.inputs[0])


def test_op_outside_graph():
    with pytest.raises(RuntimeError, match="no graph is being built"):
        ops.constant(1.0, DType.float32, None)


def test_symbolic_graph_runs_at_several_sizes():
    from support import session

    with Graph("sym", input_types=[TensorType(DType.float32, ("n", 3))]) as g:
        x = g.inputs[0]
        g.output(ops.sigmoid(x) * 2 + x)
    m = session().load(g)
    for n in (1, 4, 9):
        a = np.random.default_rng(n).standard_normal((n, 3)).astype(np.float32)
        out = m.execute(a)[0].to_numpy()
        np.testing.assert_allclose(out, 2 / (1 + np.exp(-a.astype(np.float64))) + a, rtol=1e-5, atol=1e-6)


@given(data=st.data())
def test_mod_op_on_floats(data):
    a = data.draw(_floats((5,), -20, 20))
    b = data.draw(hnp.arrays(np.float32, (5,), elements=st.sampled_from([-3.5, -2.0, 1.5, 4.0])))
    out = run1(lambda x, y: ops.mod(x, y), [tt(DType.float32, (5,))] * 2, a, b)
    np.testing.assert_allclose(out, np.mod(a.astype(np.float64), b), rtol=1e-5, atol=1e-5)


@given(data=st.data())
def test_outer(data):
    sa = data.draw(hnp.array_shapes(min_dims=1, max_dims=2, max_side=4))
    sb = data.draw(hnp.array_shapes(min_dims=1, max_dims=2, max_side=4))
    a, b = data.draw(_floats(sa)), data.draw(_floats(sb))
    out = run1(lambda x, y: ops.outer(x, y), [tt(DType.float32, sa), tt(DType.float32, sb)], a, b)
    np.testing.assert_allclose(out, np.outer(a.astype(np.float64), b), rtol=1e-5, atol=1e-5)


def test_constant_external_is_a_named_weight():
    from support import session

    t = TensorType(DType.float32, (3,))
    with Graph("ce", input_types=[t]) as g:
        w1 = ops.constant_external("bias", t)
        w2 = ops.constant_external("bias", t)  # same name and type: the same weight
        g.output(g.inputs[0] + w1 + w2)
    assert list(g.weights()) == ["bias"]
    out = session().load(g, weights_registry={"bias": np.ones(3, np.float32)}).execute(np.zeros(3, np.float32))
    np.testing.assert_array_equal(out[0].to_numpy(), [2, 2, 2])
    with g:
        with pytest.raises(ValueError, match="already has a different weight named 'bias'"):
            ops.constant_external("bias", TensorType(DType.float32, (4,)))
