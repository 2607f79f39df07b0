"""Shape ops against numpy references: values, result types (symbolic dims) and errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from max.dtype import DType
from max.graph import Dim, Graph, StaticDim, TensorType, ops
from support import run1, run_graph, session, to_input, tt

DTYPES = [DType.float32, DType.float64, DType.float16, DType.int32, DType.int64, DType.uint8, DType.bool]
dtypes = st.sampled_from(DTYPES)


def shapes(min_dims=0, max_dims=4, min_side=1, max_side=4):
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


def arr(shape, dtype=DType.float32, offset=0):
    """Distinct values (mod the dtype's range) so layout mistakes show."""
    n = int(np.prod(shape, dtype=np.int64))
    a = np.arange(offset, offset + n, dtype=np.int64).reshape(shape)
    if dtype is DType.bool:
        return (a % 3 == 1).astype(np.bool_)
    if dtype is DType.uint8:
        return (a % 251).astype(np.uint8)
    return a.astype(dtype.to_numpy())


def check(out, ref, dtype):
    assert out.dtype == dtype.to_numpy(), (out.dtype, dtype)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    np.testing.assert_array_equal(out, ref)


def build(fn, input_types):
    """Graph built with ``fn`` over its inputs; returns (graph, results as a list)."""
    with Graph("t", input_types=input_types) as g:
        res = fn(*[v.tensor for v in g.inputs])
        res = list(res) if isinstance(res, (list, tuple)) else [res]
        g.output(*res)
    return g, res


def load(fn, input_types):
    """A model to execute at several sizes (for symbolic inputs)."""
    g = Graph("t", fn, input_types=input_types)
    model = session().load(g)
    return lambda *arrays: [o.to_numpy() for o in model.execute(*[to_input(a) for a in arrays])]


def result_type(fn, input_types) -> TensorType:
    _, res = build(fn, input_types)
    return res[0].type


# ======================================================================= reshape
def test_reshape_symbolic_types_and_runs():
    f = load(lambda x: ops.reshape(x, ["b", 2, -1]), [tt(DType.float32, ["b", 6])])
    for b in (1, 2, 5):
        a = arr((b, 6))
        check(f(a)[0], a.reshape(b, 2, 3), DType.float32)
    assert result_type(lambda x: ops.reshape(x, [-1]), [tt(DType.float32, ["b", 6])]).shape == [Dim("b") * 6]
    t = result_type(lambda x: ops.reshape(x, ["b", 3, 2]), [tt(DType.int32, ["b", 6])])
    assert t.shape == ["b", 3, 2] and t.dtype is DType.int32


def test_reshape_flatten_symbolic_then_back():
    f = load(lambda x: ops.reshape(ops.reshape(x, [-1]), ["b", 4]), [tt(DType.int64, ["b", 4])])
    for b in (2, 3):
        a = arr((b, 4), DType.int64)
        check(f(a)[0], a, DType.int64)


def test_reshape_infers_symbolic_minus_one():
    ty = [tt(DType.float32, [Dim("b") * 2, 3])]
    assert result_type(lambda x: ops.reshape(x, ["b", -1]), ty).shape == ["b", 6]
    assert result_type(lambda x: ops.reshape(x, [2, -1]), ty).shape == [2, Dim("b") * 3]
    assert result_type(lambda x: ops.reshape(x, [-1, 2]), ty).shape == [Dim("b") * 3, 2]
    ty2 = [tt(DType.float32, ["b", "s", 4]), tt(DType.float32, ["b"])]
    assert result_type(lambda x, y: ops.reshape(x, ["b", -1]), ty2).shape == ["b", Dim("s") * 4]
    f = load(lambda x, y: ops.reshape(x, ["b", -1]), ty2)
    for b, s in ((1, 2), (3, 1)):
        x = arr((b, s, 4))
        check(f(x, np.zeros(b, np.float32))[0], x.reshape(b, -1), DType.float32)


def test_reshape_errors():
    with pytest.raises(ValueError, match=r"(?s)^Failed to create op 'ReshapeOp'.*\[reshape\] input and output number of "
                                         r"elements must match.*consider a rebind"):
        build(lambda x: ops.reshape(x, [5]), [tt(DType.float32, [2, 3])])
    with pytest.raises(ValueError, match="reshape: at most one -1"):
        build(lambda x: ops.reshape(x, [-1, -1]), [tt(DType.float32, [2, 3])])
    with pytest.raises(ValueError, match=r"\[reshape\] input and output number of elements must match"):
        build(lambda x: ops.reshape(x, ["c", 6]), [tt(DType.float32, ["b", 6])])
    with pytest.raises(ValueError, match=r"^reshape\(\): cannot infer -1 dimension when another dimension is 0$"):
        build(lambda x: ops.reshape(x, [-1, 0, 2]), [tt(DType.float32, [4, 5])])


def test_shape_to_tensor():
    f = load(lambda x: ops.shape_to_tensor(x.shape), [tt(DType.float32, ["b", 3])])
    for b in (1, 4):
        out = f(arr((b, 3)))[0]
        np.testing.assert_array_equal(out, [b, 3])
        assert out.dtype == np.int64


# ===================================================================== transpose
@given(data=st.data())
def test_transpose_matches_numpy(data):
    shape = data.draw(shapes(min_dims=1))
    r = len(shape)
    a1 = data.draw(st.integers(-r, r - 1))
    a2 = data.draw(st.integers(-r, r - 1))
    dt = data.draw(dtypes)
    x = arr(shape, dt)
    out = run1(lambda v: ops.transpose(v, a1, a2), [tt(dt, shape)], x)
    check(out, np.swapaxes(x, a1, a2), dt)


def test_transpose_symbolic():
    t = result_type(lambda x: ops.transpose(x, 0, -1), [tt(DType.float32, ["batch", 3, "seq"])])
    assert t.shape == ["seq", 3, "batch"]
    f = load(lambda x: ops.transpose(x, 0, -1), [tt(DType.float32, ["batch", 3, "seq"])])
    for b, s in ((1, 2), (3, 5), (2, 1)):
        x = arr((b, 3, s))
        check(f(x)[0], np.swapaxes(x, 0, -1), DType.float32)


def test_transpose_errors():
    with pytest.raises(IndexError, match=r"^Axis axis_1 out of range \(expected to be in range of \[-2, 1\], but got 3\)"):
        build(lambda x: ops.transpose(x, 3, 0), [tt(DType.float32, [2, 3])])
    with pytest.raises(IndexError, match=r"Axis axis_2 out of range .* but got -3"):
        build(lambda x: ops.transpose(x, 0, -3), [tt(DType.float32, [2, 3])])
    with pytest.raises(TypeError, match=r"transpose: axis_1 must be an int"):
        build(lambda x: ops.transpose(x, 0.5, 0), [tt(DType.float32, [2, 3])])


def test_transpose_method_and_T():
    t = result_type(lambda x: x.T, [tt(DType.float32, ["a", "b", 4])])
    assert t.shape == ["a", 4, "b"]
    t = result_type(lambda x: x.transpose(0, 1), [tt(DType.float32, ["a", "b", 4])])
    assert t.shape == ["b", "a", 4]


# ======================================================================= permute
@given(data=st.data())
def test_permute_matches_numpy(data):
    shape = data.draw(shapes(min_dims=0))
    r = len(shape)
    perm = data.draw(st.permutations(range(r)))
    neg = data.draw(st.lists(st.booleans(), min_size=r, max_size=r))
    dims = [p - r if n else p for p, n in zip(perm, neg)]
    dt = data.draw(dtypes)
    x = arr(shape, dt)
    out = run1(lambda v: ops.permute(v, dims), [tt(dt, shape)], x)
    check(out, np.transpose(x, perm), dt)


def test_permute_symbolic():
    ty = [tt(DType.float32, ["b", "s", 2, 3])]
    assert result_type(lambda x: ops.permute(x, [2, 0, 3, 1]), ty).shape == [2, "b", 3, "s"]
    f = load(lambda x: ops.permute(x, [2, 0, 3, 1]), ty)
    for b, s in ((1, 1), (2, 3), (4, 2)):
        x = arr((b, s, 2, 3))
        check(f(x)[0], np.transpose(x, [2, 0, 3, 1]), DType.float32)


def test_permute_errors():
    ty = [tt(DType.float32, [2, 3, 4])]
    with pytest.raises(ValueError, match=r"permute: dims \[0, 1\] must name each of the 3 axes"):
        build(lambda x: ops.permute(x, [0, 1]), ty)
    with pytest.raises(ValueError, match=r"permute: dims \[0, 1, 1\] is not a permutation"):
        build(lambda x: ops.permute(x, [0, 1, 1]), ty)
    with pytest.raises(ValueError, match=r"permute: dims \[0, -1, 2\] is not a permutation"):
        build(lambda x: ops.permute(x, [0, -1, 2]), ty)
    with pytest.raises(IndexError, match=r"^Axis dims entry out of range \(expected to be in range of \[-3, 2\], but got 3\)"):
        build(lambda x: ops.permute(x, [0, 1, 3]), ty)


# ============================================================ squeeze / unsqueeze
@given(data=st.data())
def test_squeeze_unsqueeze_match_numpy(data):
    shape = data.draw(shapes(min_dims=0, max_dims=3))
    r = len(shape)
    ax = data.draw(st.integers(-(r + 1), r))
    dt = data.draw(dtypes)
    x = arr(shape, dt)
    out = run1(lambda v: ops.unsqueeze(v, ax), [tt(dt, shape)], x)
    ref = np.expand_dims(x, ax)
    check(out, ref, dt)
    out2 = run1(lambda v: ops.squeeze(v, ax), [tt(dt, ref.shape)], ref)
    check(out2, x, dt)


def test_squeeze_unsqueeze_types():
    ty = [tt(DType.float32, ["b", 1, "s"])]
    assert result_type(lambda x: ops.squeeze(x, 1), ty).shape == ["b", "s"]
    assert result_type(lambda x: ops.squeeze(x, -2), ty).shape == ["b", "s"]
    assert result_type(lambda x: ops.unsqueeze(x, -1), ty).shape == ["b", 1, "s", 1]
    assert result_type(lambda x: ops.unsqueeze(x, -4), ty).shape == [1, "b", 1, "s"]
    assert result_type(lambda x: ops.unsqueeze(x, 3), ty).shape == ["b", 1, "s", 1]
    assert result_type(lambda x: ops.unsqueeze(x, 0), [tt(DType.float32, [])]).shape == [1]


def test_squeeze_unsqueeze_errors():
    ty = [tt(DType.float32, ["b", 1, 3])]
    with pytest.raises(ValueError, match=r"squeeze: dim 2 of \[Dim\('b'\), Dim\(1\), Dim\(3\)\] is 3; only a \(static\) size-1"):
        build(lambda x: ops.squeeze(x, 2), ty)
    with pytest.raises(ValueError, match=r"squeeze: dim 0 of \[Dim\('b'\), Dim\(1\), Dim\(3\)\] is b"):
        build(lambda x: ops.squeeze(x, 0), ty)
    with pytest.raises(IndexError, match=r"^Axis out of range \(expected to be in range of \[-3, 2\], but got 3\)"):
        build(lambda x: ops.squeeze(x, 3), ty)
    with pytest.raises(IndexError, match=r"^Axis out of range \(expected to be in range of \[-4, 3\], but got 4\)"):
        build(lambda x: ops.unsqueeze(x, 4), ty)
    with pytest.raises(IndexError, match=r"but got -5\)"):
        build(lambda x: ops.unsqueeze(x, -5), ty)


# =================================================================== broadcast_to
@st.composite
def broadcastable(draw):
    target = draw(shapes(min_dims=0, max_dims=4))
    k = draw(st.integers(0, len(target)))
    src = [1 if draw(st.booleans()) else d for d in target[len(target) - k:]]
    return tuple(src), tuple(target)


@given(case=broadcastable(), dt=dtypes)
def test_broadcast_to_matches_numpy(case, dt):
    src, target = case
    x = arr(src, dt)
    out = run1(lambda v: ops.broadcast_to(v, target), [tt(dt, src)], x)
    check(out, np.broadcast_to(x, target), dt)


def test_broadcast_to_symbolic_target():
    ty = [tt(DType.float32, ["b", 1, 3])]
    assert result_type(lambda x: ops.broadcast_to(x, ["b", "s", 3]), ty).shape == ["b", "s", 3]
    # "s" becomes known from a second input
    f = load(lambda x, y: ops.broadcast_to(x, ["b", "s", 3]) + y,
             [tt(DType.float32, ["b", 1, 3]), tt(DType.float32, ["b", "s", 3])])
    for b, s in ((1, 2), (2, 4), (3, 1)):
        x, y = arr((b, 1, 3)), np.zeros((b, s, 3), np.float32)
        check(f(x, y)[0], np.broadcast_to(x, (b, s, 3)), DType.float32)
    assert result_type(lambda x: ops.broadcast_to(x, [2, "b", 5, 3]), ty).shape == [2, "b", 5, 3]
    assert result_type(lambda x: x.broadcast_to([4, "b", 2, 3]), ty).shape == [4, "b", 2, 3]


def test_broadcast_to_tensor_shape_with_out_dims():
    def fn(x, s):
        return ops.broadcast_to(x, s, out_dims=["n", 3])

    ty = [tt(DType.float32, [1, 3]), tt(DType.int64, [2])]
    assert result_type(fn, ty).shape == ["n", 3]
    f = load(fn, ty)
    for n in (1, 4):
        x = arr((1, 3))
        check(f(x, np.array([n, 3], np.int64))[0], np.broadcast_to(x, (n, 3)), DType.float32)
    with pytest.raises(Exception, match=r"broadcast_to: the shape tensor: dim 1 is 4, expected 3"):
        f(arr((1, 3)), np.array([2, 4], np.int64))


def test_broadcast_to_errors():
    ty = [tt(DType.float32, [2, 3])]
    with pytest.raises(ValueError, match=r"(?s)^Failed to create op 'BroadcastToOp'.*\[broadcast_to\] input dimension at "
                                         r"index 1 \(3\) must be either 1 or equal to corresponding output dimension at index 1 \(4\)"):
        build(lambda x: ops.broadcast_to(x, [2, 4]), ty)
    with pytest.raises(ValueError, match=r"broadcast_to: cannot broadcast \[Dim\(2\), Dim\(3\)\] \(rank 2\) to \[Dim\(3\)\]"):
        build(lambda x: ops.broadcast_to(x, [3]), ty)
    with pytest.raises(ValueError, match=r"input dimension at index 0 \(b\) must be either 1 or equal to corresponding output dimension at index 0 \(c\)"):
        build(lambda x: ops.broadcast_to(x, ["c", 3]), [tt(DType.float32, ["b", 3])])
    with pytest.raises(ValueError, match=r"broadcast_to: a tensor-valued shape needs out_dims"):
        build(lambda x, s: ops.broadcast_to(x, s), [tt(DType.float32, [1, 3]), tt(DType.int64, [2])])
    with pytest.raises(ValueError, match=r"broadcast_to: shape tensor has 2 entries but out_dims"):
        build(lambda x, s: ops.broadcast_to(x, s, out_dims=[1, 2, 3]),
              [tt(DType.float32, [1, 3]), tt(DType.int64, [2])])
    with pytest.raises(TypeError, match=r"broadcast_to: a tensor-valued shape must hold integers"):
        build(lambda x, s: ops.broadcast_to(x, s, out_dims=[2, 3]),
              [tt(DType.float32, [1, 3]), tt(DType.float32, [2])])


# ======================================================================= flatten
@given(data=st.data())
def test_flatten_matches_numpy(data):
    shape = data.draw(shapes(min_dims=1))
    r = len(shape)
    s = data.draw(st.integers(0, r - 1))
    e = data.draw(st.integers(s, r - 1))
    s_arg = s - r if data.draw(st.booleans()) else s
    e_arg = e - r if data.draw(st.booleans()) else e
    dt = data.draw(dtypes)
    x = arr(shape, dt)
    ref = x.reshape(shape[:s] + (-1,) + shape[e + 1:])
    out = run1(lambda v: ops.flatten(v, s_arg, e_arg), [tt(dt, shape)], x)
    check(out, ref, dt)


def test_flatten_types_and_errors():
    ty = [tt(DType.float32, ["b", "s", 4, 2])]
    assert result_type(lambda x: ops.flatten(x), ty).shape == [Dim("b") * Dim("s") * 8]
    assert result_type(lambda x: ops.flatten(x, 1, 2), ty).shape == ["b", Dim("s") * 4, 2]
    assert result_type(lambda x: x.flatten(2), ty).shape == ["b", "s", 8]
    assert result_type(lambda x: ops.flatten(x), [tt(DType.float32, [])]).shape == [1]
    f = load(lambda x: ops.flatten(x, 0, 1), ty)
    for b, s in ((1, 3), (2, 2)):
        x = arr((b, s, 4, 2))
        check(f(x)[0], x.reshape(b * s, 4, 2), DType.float32)
    with pytest.raises(ValueError, match=r"flatten: start_dim=2 comes after end_dim=1"):
        build(lambda x: ops.flatten(x, 2, 1), ty)
    with pytest.raises(IndexError, match=r"^Axis end_dim out of range \(expected to be in range of \[-4, 3\], but got 4\)"):
        build(lambda x: ops.flatten(x, 0, 4), ty)


# ======================================================================== concat
@given(data=st.data())
def test_concat_matches_numpy(data):
    base = list(data.draw(shapes(min_dims=1)))
    r = len(base)
    ax = data.draw(st.integers(-r, r - 1))
    sizes = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=4))
    dt = data.draw(dtypes)
    arrays = []
    for k, n in enumerate(sizes):
        shp = list(base)
        shp[ax] = n
        arrays.append(arr(shp, dt, offset=7 * k))
    out = run1(lambda *vs: ops.concat(vs, axis=ax), [tt(dt, a.shape) for a in arrays], *arrays)
    check(out, np.concatenate(arrays, axis=ax), dt)


def test_concat_symbolic():
    ty = [tt(DType.float32, ["a", "s", 2]), tt(DType.float32, ["b", "s", 2]), tt(DType.float32, [3, "s", 2])]
    t = result_type(lambda x, y, z: ops.concat([x, y, z]), ty)
    assert t.shape == [Dim("a") + Dim("b") + 3, "s", 2]
    assert str(t.shape[0]) == "a + b + 3"
    assert result_type(lambda x, y, z: ops.concat([x, x], axis=-1), ty).shape == ["a", "s", 4]
    f = load(lambda x, y, z: ops.concat([x, y, z]), ty)
    for a, b, s in ((1, 2, 1), (3, 1, 2), (2, 2, 3)):
        xs = [arr((a, s, 2)), arr((b, s, 2)) + 100, arr((3, s, 2)) + 200]
        check(f(*xs)[0], np.concatenate(xs), DType.float32)


def test_concat_errors():
    f32 = DType.float32
    with pytest.raises(ValueError, match=r"^Concat inputs differ on non-concat axis 1: vals=\[TensorValue\(dtype=float32, "
                                         r"shape=\[Dim\(2\), Dim\(3\)\], device=cpu:0\), TensorValue\("):
        build(lambda x, y: ops.concat([x, y]), [tt(f32, [2, 3]), tt(f32, [2, 4])])
    with pytest.raises(ValueError, match=r"Concat inputs differ on non-concat axis 1: .*Dim\('s'\).*Dim\('t'\)"):
        build(lambda x, y: ops.concat([x, y]), [tt(f32, [2, "s"]), tt(f32, [2, "t"])])
    with pytest.raises(ValueError, match=r"concat: all original_vals must have the same rank"):
        build(lambda x, y: ops.concat([x, y]), [tt(f32, [2, 3]), tt(f32, [2, 3, 1])])
    with pytest.raises(ValueError, match=r"concat: all original_vals must have the same dtype"):
        build(lambda x, y: ops.concat([x, y]), [tt(f32, [2, 3]), tt(DType.int32, [2, 3])])
    with pytest.raises(ValueError, match=r"concat: original_vals must not be empty"):
        build(lambda x: ops.concat([]), [tt(f32, [2, 3])])
    with pytest.raises(IndexError, match=r"^Axis out of range \(expected to be in range of \[-2, 1\], but got 2\)"):
        build(lambda x: ops.concat([x, x], axis=2), [tt(f32, [2, 3])])
    with pytest.raises(IndexError, match=r"^Axis out of range \(expected to be in range of \[0, -1\], but got 0\)"):
        build(lambda x: ops.concat([x, x]), [tt(f32, [])])


# ========================================================================= stack
@given(data=st.data())
def test_stack_matches_numpy(data):
    shape = data.draw(shapes(min_dims=0, max_dims=3))
    r = len(shape)
    ax = data.draw(st.integers(-(r + 1), r))
    n = data.draw(st.integers(1, 4))
    dt = data.draw(dtypes)
    arrays = [arr(shape, dt, offset=5 * k) for k in range(n)]
    out = run1(lambda *vs: ops.stack(vs, axis=ax), [tt(dt, shape)] * n, *arrays)
    check(out, np.stack(arrays, axis=ax), dt)


def test_stack_symbolic_and_errors():
    f32 = DType.float32
    ty = [tt(f32, ["b", 3]), tt(f32, ["b", 3])]
    assert result_type(lambda x, y: ops.stack([x, y], axis=-1), ty).shape == ["b", 3, 2]
    assert result_type(lambda x, y: ops.stack([x, y, x]), ty).shape == [3, "b", 3]
    f = load(lambda x, y: ops.stack([x, y], axis=1), ty)
    for b in (1, 3):
        xs = [arr((b, 3)), arr((b, 3)) * 2]
        check(f(*xs)[0], np.stack(xs, axis=1), f32)
    with pytest.raises(ValueError, match=r"^Concat inputs differ on non-concat axis 1: vals=\[TensorValue\(dtype=float32, "
                                         r"shape=\[Dim\(1\), Dim\('b'\), Dim\(3\)\]"):
        build(lambda x, y: ops.stack([x, y]), [tt(f32, ["b", 3]), tt(f32, ["c", 3])])
    with pytest.raises(ValueError, match=r"^All inputs to stack must have the same dtype$"):
        build(lambda x, y: ops.stack([x, y]), [tt(f32, [3]), tt(DType.int64, [3])])
    with pytest.raises(IndexError, match=r"^Axis out of range \(expected to be in range of \[-3, 2\], but got 3\)"):
        build(lambda x, y: ops.stack([x, y], axis=3), ty)
    with pytest.raises(ValueError, match=r"^Expected at least one value to stack$"):
        build(lambda x, y: ops.stack([]), ty)


# ========================================================================= split
@given(data=st.data())
def test_split_matches_numpy(data):
    base = list(data.draw(shapes(min_dims=1, max_dims=3)))
    r = len(base)
    ax = data.draw(st.integers(-r, r - 1))
    sizes = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=4))
    base[ax] = sum(sizes)
    dt = data.draw(dtypes)
    x = arr(base, dt)
    outs = run_graph(lambda v: ops.split(v, sizes, axis=ax), [tt(dt, base)], x)
    refs = np.split(x, np.cumsum(sizes)[:-1], axis=ax)
    assert len(outs) == len(sizes)
    for o, ref in zip(outs, refs):
        check(o, ref, dt)


def test_split_symbolic():
    f32 = DType.float32
    ty = [tt(f32, ["b", 5])]
    _, res = build(lambda x: ops.split(x, [2, 3], axis=1), ty)
    assert [v.shape for v in res] == [["b", 2], ["b", 3]]
    f = load(lambda x: ops.split(x, [2, 3], axis=-1), ty)
    for b in (1, 2, 4):
        x = arr((b, 5))
        o1, o2 = f(x)
        check(o1, x[:, :2], f32)
        check(o2, x[:, 2:], f32)
    # MAX 26.7: split sizes are static ints (a symbolic size is a TypeError, B8.1)
    ty2 = [tt(f32, [Dim("a") + Dim("b") + 1, 2]), tt(f32, ["a"]), tt(f32, ["b"])]
    with pytest.raises(TypeError, match=r"^int\(Dim\('a'\)\): Int conversions only supported for static dims$"):
        build(lambda x, ya, yb: ops.split(x, ["a", 1, "b"]), ty2)


def test_split_errors():
    ty = [tt(DType.float32, [2, 5])]
    with pytest.raises(ValueError, match=r"^Split sizes must sum to dimension value; x.shape\[axis\]=Dim\(5\) != "
                                         r"sum\(sizes=\[2, 2\]\)$"):
        build(lambda x: ops.split(x, [2, 2], axis=1), ty)
    with pytest.raises(ValueError, match=r"^Split sizes must be positive: sizes=\[6, -1\]$"):
        build(lambda x: ops.split(x, [6, -1], axis=1), ty)
    with pytest.raises(ValueError, match=r"split: split_sizes must not be empty"):
        build(lambda x: ops.split(x, [], axis=1), ty)
    with pytest.raises(ValueError, match=r"x.shape\[axis\]=Dim\('b'\) != sum\(sizes=\[2, 3\]\)"):
        build(lambda x: ops.split(x, [2, 3]), [tt(DType.float32, ["b", 5])])
    with pytest.raises(IndexError, match=r"^Axis must be in range \[-2, 2\), got 2$"):
        build(lambda x: ops.split(x, [5], axis=2), ty)


# ========================================================================= chunk
@given(data=st.data())
def test_chunk_matches_numpy(data):
    base = list(data.draw(shapes(min_dims=1, max_dims=3)))
    r = len(base)
    ax = data.draw(st.integers(-r, r - 1))
    n = data.draw(st.integers(1, 4))
    base[ax] = n * data.draw(st.integers(0, 3))
    dt = data.draw(dtypes)
    x = arr(base, dt)
    outs = run_graph(lambda v: ops.chunk(v, n, axis=ax), [tt(dt, base)], x)
    refs = np.split(x, n, axis=ax)
    assert len(outs) == n
    for o, ref in zip(outs, refs):
        check(o, ref, dt)


def test_chunk_symbolic_and_errors():
    f32 = DType.float32
    # MAX 26.7: the chunked axis must be static (B8.4)
    with pytest.raises(TypeError, match=r"^int\(Dim\('h \* 2'\)\): Int conversions only supported for static dims$"):
        build(lambda x: ops.chunk(x, 2, axis=1), [tt(f32, [3, Dim("h") * 2])])
    # The reference's example chunks 5 elements into 2; its text requires an exact division.
    with pytest.raises(ValueError, match=r"^chunk: chunks=2 must statically divide x.shape\[axis\]=Dim\(5\)$"):
        build(lambda x: ops.chunk(x, 2), [tt(f32, [5])])
    with pytest.raises(TypeError, match=r"Int conversions only supported for static dims"):
        build(lambda x: ops.chunk(x, 2), [tt(f32, ["n"])])
    with pytest.raises(ValueError, match=r"chunk: chunks must be positive, got 0"):
        build(lambda x: ops.chunk(x, 0), [tt(f32, [4])])
    with pytest.raises(TypeError, match=r"chunk: chunks must be an int"):
        build(lambda x: ops.chunk(x, 2.0), [tt(f32, [4])])
    with pytest.raises(IndexError, match=r"^Axis out of range \(expected to be in range of \[-1, 0\], but got 1\)"):
        build(lambda x: ops.chunk(x, 2, axis=1), [tt(f32, [4])])


# ========================================================================== tile
@given(data=st.data())
def test_tile_matches_numpy(data):
    shape = data.draw(shapes(min_dims=0, max_dims=3, max_side=3))
    reps = data.draw(st.lists(st.integers(1, 3), min_size=len(shape), max_size=len(shape)))
    dt = data.draw(dtypes)
    x = arr(shape, dt)
    out = run1(lambda v: ops.tile(v, reps), [tt(dt, shape)], x)
    check(out, np.tile(x, reps) if shape else x, dt)


def test_tile_symbolic_and_errors():
    f32 = DType.float32
    ty = [tt(f32, ["b", 2])]
    assert result_type(lambda x: ops.tile(x, [3, 2]), ty).shape == [Dim("b") * 3, 4]
    f = load(lambda x: ops.tile(x, [2, 3]), ty)
    for b in (1, 3):
        x = arr((b, 2))
        check(f(x)[0], np.tile(x, (2, 3)), f32)
    with pytest.raises(ValueError, match=r"tile: repeats \['2'\] must have one entry per dim of \[Dim\('b'\), Dim\(2\)\] \(2\), got 1"):
        build(lambda x: ops.tile(x, [2]), ty)
    with pytest.raises(ValueError, match=r"tile: repeats must be positive"):
        build(lambda x: ops.tile(x, [2, -1]), ty)


# =========================================================================== pad
@given(data=st.data())
def test_pad_matches_numpy(data):
    shape = data.draw(shapes(min_dims=0, max_dims=3, max_side=3))
    pads = data.draw(st.lists(st.integers(0, 2), min_size=2 * len(shape), max_size=2 * len(shape)))
    dt = data.draw(st.sampled_from([DType.float32, DType.int32, DType.int64, DType.float16, DType.bool]))
    value = {DType.bool: True}.get(dt, data.draw(st.integers(-3, 3)))
    x = arr(shape, dt)
    out = run1(lambda v: ops.pad(v, pads, value=value), [tt(dt, shape)], x)
    ref = np.pad(x, [(pads[2 * i], pads[2 * i + 1]) for i in range(len(shape))], constant_values=value) if shape else x
    check(out, ref, dt)


def test_pad_tensor_value_and_symbolic():
    f32 = DType.float32

    def fn(x, v):
        return ops.pad(x, [1, 0, 0, 2], value=v)

    ty = [tt(f32, ["b", 3]), tt(f32, [])]
    assert result_type(fn, ty).shape == [Dim("b") + 1, 5]
    f = load(fn, ty)
    for b in (1, 4):
        x = arr((b, 3))
        out = f(x, np.array(-1.5, np.float32))[0]
        check(out, np.pad(x, [(1, 0), (0, 2)], constant_values=-1.5), f32)
    assert result_type(lambda x: ops.pad(x, [0, 0, 0, 0]), ty[:1]).shape == ["b", 3]


def test_pad_errors():
    ty = [tt(DType.float32, [2, 3])]
    with pytest.raises(ValueError, match=r"pad: paddings \[1, 1\] must have 2 entries \(before, after\) per dim "
                                         r"of \[Dim\(2\), Dim\(3\)\]: expected 4, got 2"):
        build(lambda x: ops.pad(x, [1, 1]), ty)
    with pytest.raises(ValueError, match=r"^unsupported padding mode 'wrap'; expected 'constant', 'reflect', or 'edge'$"):
        build(lambda x: ops.pad(x, [1, 1, 1, 1], mode="wrap"), ty)
    # MAX 26.7 accepts reflect pads as long as the dim and edge pads of an empty dim (B10.1, B10.2)
    build(lambda x: ops.pad(x, [2, 0, 1, 1], mode="reflect"), ty)
    build(lambda x: ops.pad(x, [1, 0, 0, 0], mode="edge"), [tt(DType.float32, [0, 3])])
    with pytest.raises(ValueError, match=r"pad: paddings must be non-negative"):
        build(lambda x: ops.pad(x, [1, -1, 1, 1]), ty)
    with pytest.raises(TypeError, match=r"pad: value=0.5 is not a whole number but input is int32"):
        build(lambda x: ops.pad(x, [1, 1, 1, 1], value=0.5), [tt(DType.int32, [2, 3])])
    with pytest.raises(ValueError, match=r"pad: value=300 does not fit uint8"):
        build(lambda x: ops.pad(x, [1, 1, 1, 1], value=300), [tt(DType.uint8, [2, 3])])
    with pytest.raises(ValueError, match=r"pad: value must be a scalar"):
        build(lambda x: ops.pad(x, [1, 1, 1, 1], value=x), ty)


# ========================================================================= rebind
def test_rebind_binds_new_symbol_and_runs():
    f32 = DType.float32

    def fn(x):
        y = ops.rebind(x, ["n", 4], message="x must be [n, 4]")
        return ops.reshape(y, [Dim("n") * 2, 2])

    ty = [tt(f32, [Dim("b") * 2, 4])]
    assert result_type(fn, ty).shape == [Dim("n") * 2, 2]
    f = load(fn, ty)
    for b in (1, 3):
        x = arr((2 * b, 4))
        check(f(x)[0], x.reshape(4 * b, 2), f32)


def test_rebind_runtime_failures_carry_message():
    f32 = DType.float32
    f = load(lambda x: ops.rebind(x, [3, "b"], message="need 3 rows"), [tt(f32, ["a", "b"])])
    check(f(arr((3, 2)))[0], arr((3, 2)), f32)
    with pytest.raises(Exception, match=r"rebind: dim 0 is 4, expected 3 .*need 3 rows"):
        f(arr((4, 2)))
    g = load(lambda x, y: ops.rebind(x, ["c", "c"], message="square please") + y,
             [tt(f32, ["a", "b"]), tt(f32, ["c", "c"])])
    check(g(arr((2, 2)), np.zeros((2, 2), np.float32))[0], arr((2, 2)), f32)
    with pytest.raises(Exception, match=r"rebind: dim 0 is 3, expected 2 .*square please"):
        g(arr((3, 3)), np.zeros((2, 2), np.float32))
    h = load(lambda x: ops.rebind(x, ["m", "m"], message="square"), [tt(f32, ["a", "b"])])
    check(h(arr((2, 2)))[0], arr((2, 2)), f32)
    with pytest.raises(Exception, match=r"rebind: dims 0 and 1 are both m but have sizes 2 and 3.*square"):
        h(arr((2, 3)))


def test_rebind_build_time():
    f32 = DType.float32
    ty = [tt(f32, ["a", 4])]
    t = result_type(lambda x: x.rebind(["b", 4]), ty)
    assert t.shape == ["b", 4] and t.dtype is f32
    with pytest.raises(ValueError, match=r"rebind: cannot rebind \[Dim\('a'\), Dim\(4\)\] \(rank 2\) to \[Dim\('a'\)\] \(rank 1\) \(oops\)"):
        build(lambda x: ops.rebind(x, ["a"], message="oops"), ty)
    with pytest.raises(ValueError, match=r"rebind: cannot rebind \[Dim\('a'\), Dim\(4\)\] to \[Dim\('a'\), Dim\(5\)\]: dim 1 is statically 4"):
        build(lambda x: ops.rebind(x, ["a", 5]), ty)


# ============================================================== repeat_interleave
@given(data=st.data())
def test_repeat_interleave_matches_numpy(data):
    shape = data.draw(shapes(min_dims=1, max_dims=3, max_side=3))
    r = len(shape)
    axis = data.draw(st.one_of(st.none(), st.integers(-r, r - 1)))
    n = int(np.prod(shape)) if axis is None else shape[axis]
    reps = data.draw(st.one_of(st.integers(1, 3), st.lists(st.integers(1, 3), min_size=n, max_size=n)))
    dt = data.draw(dtypes)
    x = arr(shape, dt)
    out = run1(lambda v: ops.repeat_interleave(v, reps, axis=axis), [tt(dt, shape)], x)
    check(out, np.repeat(x, reps, axis=axis), dt)


def test_repeat_interleave_tensor_repeats():
    f32 = DType.float32

    def fn(x, r):
        return ops.repeat_interleave(x, r, axis=0, out_dim="total")

    ty = [tt(f32, [2, 2]), tt(DType.int64, [2])]
    assert result_type(fn, ty).shape == ["total", 2]
    f = load(fn, ty)
    x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    check(f(x, np.array([2, 3]))[0], np.repeat(x, [2, 3], axis=0), f32)
    check(f(x, np.array([1, 1]))[0], x, f32)
    # static out_dim is checked at run time
    g = load(lambda x, r: ops.repeat_interleave(x, r, axis=1, out_dim=5), [tt(f32, [2, 2]), tt(DType.int32, [2])])
    check(g(x, np.array([2, 3], np.int32))[0], np.repeat(x, [2, 3], axis=1), f32)
    with pytest.raises(Exception, match=r"repeat_interleave: the result has 4 entries along axis 1, but out_dim is 5"):
        g(x, np.array([2, 2], np.int32))


def test_repeat_interleave_scalar_tensor_repeats():
    f32 = DType.float32
    x = arr((2, 3))
    for rt in ([], [1]):
        f = load(lambda v, r: ops.repeat_interleave(v, r, axis=1, out_dim=6), [tt(f32, [2, 3]), tt(DType.int64, rt)])
        check(f(x, np.full(rt, 2, np.int64))[0], np.repeat(x, 2, axis=1), f32)


def test_repeat_interleave_types():
    ty = [tt(DType.float32, ["b", 3])]
    assert result_type(lambda x: ops.repeat_interleave(x, 2, axis=0), ty).shape == [Dim("b") * 2, 3]
    assert result_type(lambda x: ops.repeat_interleave(x, 2), ty).shape == [Dim("b") * 6]
    assert result_type(lambda x: ops.repeat_interleave(x, [1, 2, 3], axis=1), ty).shape == ["b", 6]
    f = load(lambda x: ops.repeat_interleave(x, 2, axis=0), ty)
    for b in (1, 3):
        x = arr((b, 3))
        check(f(x)[0], np.repeat(x, 2, axis=0), DType.float32)


def test_repeat_interleave_tensor_repeats_without_out_dim_gets_a_fresh_dim():
    ty = [tt(DType.float32, [2, 3]), tt(DType.int64, [2])]
    _, (res,) = build(lambda x, r: ops.repeat_interleave(x, r, axis=0), ty)
    assert res.shape[1] == 3 and not isinstance(res.shape[0], StaticDim)
    f = load(lambda x, r: ops.repeat_interleave(x, r, axis=0) * 2, ty)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (out,) = f(x, np.array([1, 3]))
    np.testing.assert_array_equal(out, np.repeat(x, [1, 3], axis=0) * 2)


def test_repeat_interleave_errors():
    ty = [tt(DType.float32, [2, 3])]
    with pytest.raises(ValueError, match=r"repeat_interleave: repeats must be positive, got 0"):
        build(lambda x: ops.repeat_interleave(x, 0), ty)
    with pytest.raises(ValueError, match=r"repeat_interleave: repeats must be positive, got -2"):
        build(lambda x: ops.repeat_interleave(x, -2, axis=1), ty)
    with pytest.raises(ValueError, match=r"repeat_interleave: repeats must be positive, got \[1, 0, 1\]"):
        build(lambda x: ops.repeat_interleave(x, [1, 0, 1], axis=1), ty)
    with pytest.raises(ValueError, match=r"^Axis out of range \(expected to be in range of \[-2, 1\], but got 2\)"):
        build(lambda x: ops.repeat_interleave(x, 2, axis=2), ty)
    with pytest.raises(ValueError, match=r"repeat_interleave: repeats has 2 entries but dim 1 of \[Dim\(2\), Dim\(3\)\] is 3"):
        build(lambda x: ops.repeat_interleave(x, [1, 2], axis=1), ty)
    with pytest.raises(TypeError, match=r"repeat_interleave: repeats must be an integer tensor"):
        build(lambda x, r: ops.repeat_interleave(x, r, axis=0, out_dim="n"), [ty[0], tt(DType.float32, [2])])
    with pytest.raises(ValueError, match=r"repeat_interleave: repeats has 3 entries but dim 0"):
        build(lambda x, r: ops.repeat_interleave(x, r, axis=0, out_dim="n"), [ty[0], tt(DType.int64, [3])])


# ===================================================================== band_part
def band_ref(x, lo, hi, exclude):
    m = np.arange(x.shape[-2])[:, None]
    n = np.arange(x.shape[-1])[None, :]
    keep = np.ones((x.shape[-2], x.shape[-1]), bool)
    if lo is not None:
        keep &= (m - n) <= lo
    if hi is not None:
        keep &= (n - m) <= hi
    if exclude:
        keep = ~keep
    return np.where(keep, x, np.zeros((), x.dtype))


@given(data=st.data())
def test_band_part_matches_reference(data):
    shape = data.draw(shapes(min_dims=2, max_dims=4, max_side=5))
    lo = data.draw(st.one_of(st.none(), st.integers(0, shape[-2] - 1)))
    hi = data.draw(st.one_of(st.none(), st.integers(0, shape[-1] - 1)))
    exclude = data.draw(st.booleans())
    dt = data.draw(dtypes)
    x = arr(shape, dt, offset=1)
    out = run1(lambda v: ops.band_part(v, lo, hi, exclude=exclude), [tt(dt, shape)], x)
    check(out, band_ref(x, lo, hi, exclude), dt)


def test_band_part_known_values_and_symbolic():
    f32 = DType.float32
    ones = np.ones((3, 3), np.float32)
    assert run1(lambda v: ops.band_part(v, None, 0), [tt(f32, [3, 3])], ones).tolist() == np.tril(ones).tolist()
    assert run1(lambda v: ops.band_part(v, 0, None), [tt(f32, [3, 3])], ones).tolist() == np.triu(ones).tolist()
    causal = run1(lambda v: ops.band_part(v, None, 0, exclude=True), [tt(f32, [3, 3])], ones)
    assert causal.tolist() == np.triu(ones, 1).tolist()
    ty = [tt(f32, ["b", "s", "s"])]
    assert result_type(lambda x: ops.band_part(x, 1, 0), ty).shape == ["b", "s", "s"]
    f = load(lambda x: ops.band_part(x, 1, 0), ty)
    for b, s in ((1, 2), (2, 5)):
        x = arr((b, s, s)) + 1
        check(f(x)[0], band_ref(x, 1, 0, False), f32)


def test_band_part_errors():
    with pytest.raises(ValueError, match=r"band_part: x must have rank >= 2"):
        build(lambda x: ops.band_part(x, 0, 0), [tt(DType.float32, [4])])
    with pytest.raises(ValueError, match=r"band_part: num_lower=3 is out of range for a matrix dim of size 3"):
        build(lambda x: ops.band_part(x, 3, 0), [tt(DType.float32, [3, 5])])
    with pytest.raises(ValueError, match=r"band_part: num_upper=5 is out of range for a matrix dim of size 5"):
        build(lambda x: ops.band_part(x, 0, 5), [tt(DType.float32, [3, 5])])
    with pytest.raises(ValueError, match=r"band_part: num_lower=-2 must be non-negative, or -1/None"):
        build(lambda x: ops.band_part(x, -2, 0), [tt(DType.float32, ["s", "s"])])
    # -1, like None, keeps the whole triangle (MAX's older form)
    x = np.arange(12, dtype=np.float32).reshape(3, 4) + 1
    np.testing.assert_array_equal(run1(lambda v: ops.band_part(v, -1, 0), [tt(DType.float32, [3, 4])], x),
                                  np.tril(x))
    np.testing.assert_array_equal(run1(lambda v: ops.band_part(v, 0, -1), [tt(DType.float32, [3, 4])], x),
                                  np.triu(x))
    with pytest.raises(TypeError, match=r"band_part: num_upper must be an int"):
        build(lambda x: ops.band_part(x, 0, 1.5), [tt(DType.float32, [3, 3])])
