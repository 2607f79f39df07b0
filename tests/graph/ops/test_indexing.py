"""slice_tensor / __getitem__, gather, gather_nd, scatter, scatter_nd against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from max.dtype import DType
from max.graph import DeviceRef, Dim, Graph, TensorType, ops
from support import run1, run_graph, tt

F32 = DType.float32


def _arr(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _sym_graph(shape, fn, dtype=F32, more=()):
    with Graph("g", input_types=[TensorType(dtype, shape, DeviceRef.CPU()), *more]) as g:
        return fn(*[v.tensor for v in g.inputs])


# ------------------------------------------------------------------ strategies
@st.composite
def shapes(draw, min_rank=1, max_rank=4, min_side=0, max_side=5):
    return tuple(draw(st.lists(st.integers(min_side, max_side), min_size=min_rank, max_size=max_rank)))


def _bound(draw, n):
    # MAX raises for static bounds outside [-n, n] (see test_static_slice_bounds_are_checked)
    return draw(st.one_of(st.none(), st.integers(-n, n)))


def _slice(draw, n, step):
    """A slice MAX accepts: in-bounds and not running against its step."""
    start, stop = _bound(draw, n), _bound(draw, n)
    if start is not None and stop is not None:
        lo, hi = (start + n if start < 0 else start), (stop + n if stop < 0 else stop)
        if (hi - lo) * (step or 1) < 0:
            start, stop = stop, start
    return slice(start, stop, step)


@st.composite
def basic_index(draw):
    """A static shape and a NumPy basic index over it (ints, slices, None, ...)."""
    shape = draw(shapes(max_side=5))
    rank = len(shape)
    groups: list = []  # one group of index entries per axis
    for ax in range(rank):
        n = shape[ax]
        kinds = ["slice", "slice", "none"] + (["int"] if n > 0 else [])
        k = draw(st.sampled_from(kinds))
        if k == "int":
            groups.append([draw(st.integers(-n, n - 1))])
        elif k == "slice":
            step = draw(st.one_of(st.none(), st.sampled_from([1, 2, 3, -1, -2, -3])))
            groups.append([_slice(draw, n, step)])
        else:
            groups.append([None, slice(None)])
    i = draw(st.integers(0, rank))
    j = draw(st.integers(i, rank))
    if draw(st.booleans()):  # an Ellipsis stands for axes i..j-1
        groups[i:j] = [[Ellipsis]]
    else:  # trailing axes left unindexed
        groups = groups[:j]
    items = [e for g in groups for e in g]
    if draw(st.booleans()):
        items.insert(draw(st.integers(0, len(items))), None)
    return shape, tuple(items)


@st.composite
def advanced_index(draw):
    """A shape and an index mixing ints/slices with one or two integer arrays."""
    shape = draw(shapes(min_rank=1, max_rank=4, min_side=1, max_side=4))
    rank = len(shape)
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    ishape = draw(shapes(min_rank=0, max_rank=2, min_side=1, max_side=3))
    groups: list = []
    n_arr = 0
    for ax in range(draw(st.integers(1, rank))):
        n = shape[ax]
        k = draw(st.sampled_from(["arr", "int", "slice", "none"] if n_arr < 2 else ["int", "slice", "none"]))
        if k == "arr":
            groups.append([rng.integers(-n, n, size=ishape).astype(np.int64)])
            n_arr += 1
        elif k == "int":
            groups.append([int(rng.integers(-n, n))])
        elif k == "slice":
            groups.append([slice(None, None, draw(st.sampled_from([None, 2, -1])))])
        else:
            groups.append([None, slice(None)])
    if n_arr == 0:
        p = draw(st.integers(0, len(groups) - 1))
        groups[p] = [rng.integers(-shape[p], shape[p], size=ishape).astype(np.int64)]
    if draw(st.booleans()):  # an Ellipsis: anywhere when it stands for no axes, else at the end
        groups.insert(draw(st.integers(0, len(groups))) if len(groups) == rank else len(groups), [Ellipsis])
    items = [e for g in groups for e in g]
    return shape, tuple(items)


# ------------------------------------------------------------------ slice_tensor
@given(basic_index())
def test_slice_basic_matches_numpy(case):
    shape, idx = case
    a = _arr(shape)
    want = a[idx]
    got = run1(lambda x: x[idx], [tt(F32, shape)], a)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("index,msg", [
    (np.s_[0:7], r"rmo.slice stop index 7 out of range for dimension size 5"),
    (np.s_[-6:], r"rmo.slice start index -6 out of range for dimension size 5"),
    (np.s_[3:1], r"but got start 3, stop 1 for step 1"),
    (np.s_[1:4:-1], r"but got start 1, stop 4 for step -1"),
    (np.s_[:, 0:4], r"rmo.slice stop index 4 out of range for dimension size 3"),
])
def test_static_slice_bounds_are_checked(index, msg):
    with pytest.raises(ValueError, match="(?s)^Failed to create op 'SliceOp'.*" + msg):
        Graph("g", lambda x: x[index], input_types=[TensorType(F32, [5, 3], DeviceRef.CPU())])
    # the same slice is fine on a symbolic axis (checked, like NumPy, at run time) and empty slices are fine
    Graph("g", lambda x: x[0:0, 1:1], input_types=[TensorType(F32, [5, 3], DeviceRef.CPU())])


@given(basic_index())
def test_slice_build_time_shape(case):
    shape, idx = case
    out = _sym_graph(list(shape), lambda x: ops.slice_tensor(x, list(idx)))
    assert tuple(int(d) for d in out.shape) == np.empty(shape)[idx].shape


@given(advanced_index())
def test_slice_tensor_indices_match_numpy(case):
    shape, idx = case
    a = _arr(shape, 1)
    want = a[idx]
    got = run1(lambda x: x[idx], [tt(F32, shape)], a)
    assert got.shape == want.shape, (idx, got.shape, want.shape)
    np.testing.assert_array_equal(got, want)
    out = _sym_graph(list(shape), lambda x: x[idx])
    assert tuple(int(d) for d in out.shape) == want.shape


def test_empty_ellipsis_separates_tensor_indices():
    # NumPy puts the index dims first when an Ellipsis (even one standing for
    # no axes) separates the advanced indices; torch alone would not.
    a = _arr((2, 3, 4))
    i = np.array([[0, 1]])
    for idx in [(slice(None), 0, ..., i), (slice(None), i, ..., np.array([1, 0])), (slice(None), ..., 0, i)]:
        got = run1(lambda x: x[idx], [tt(F32, [2, 3, 4])], a)
        assert got.shape == a[idx].shape
        np.testing.assert_array_equal(got, a[idx])


def test_spec_examples():
    a = _arr((3, 4))
    np.testing.assert_array_equal(run1(lambda x: ops.slice_tensor(x, [slice(None, None, -1)]), [tt(F32, [3, 4])], a),
                                  a[::-1])
    got = run1(lambda x: ops.slice_tensor(x, [..., None, slice(None)]), [tt(F32, [3, 4])], a)
    np.testing.assert_array_equal(got, a[..., None, :])


def test_getitem_dunder_and_identity():
    a = _arr((2, 3, 4))
    np.testing.assert_array_equal(run1(lambda x: x[1, ::-1, 1:3], [tt(F32, [2, 3, 4])], a), a[1, ::-1, 1:3])
    np.testing.assert_array_equal(run1(lambda x: x[-1], [tt(F32, [2, 3, 4])], a), a[-1])
    np.testing.assert_array_equal(run1(lambda x: x[..., 2], [tt(F32, [2, 3, 4])], a), a[..., 2])

    def same(x):
        assert x[:] is x and x[...] is x
        return x

    run1(same, [tt(F32, [2, 3, 4])], a)


def test_tensorvalue_index_input():
    a = _arr((5, 3))
    idx = np.array([[4, 0], [-1, 2]], dtype=np.int32)
    got = run1(lambda x, i: x[i, 1:], [tt(F32, [5, 3]), tt(DType.int32, [2, 2])], a, idx)
    np.testing.assert_array_equal(got, a[idx, 1:])
    got = run1(lambda x, i: x[:, i], [tt(F32, [5, 3]), tt(DType.int64, [4])], a, np.array([0, 2, 2, -3]))
    np.testing.assert_array_equal(got, a[:, [0, 2, 2, -3]])


def test_symbolic_result_types():
    def f(x):
        assert x[1:].shape == [Dim("n") - 1, 3, "m"]
        assert x[::-1].shape == ["n", 3, "m"]
        assert x[::2].shape == [(Dim("n") + 1) // 2, 3, "m"]
        assert x[::-2].shape == [(Dim("n") + 1) // 2, 3, "m"]
        assert x[..., 1:-1].shape == ["n", 3, Dim("m") - 2]
        assert x[:, None, 1].shape == ["n", 1, "m"]
        assert x[-1].shape == [3, "m"]
        assert x[0, 1:, :Dim("m") - 1].shape == [2, Dim("m") - 1]
        assert x[2:5].shape == [3, 3, "m"]
        assert x[:, :, (slice(0, 2), "two")].shape == ["n", 3, "two"]
        return x

    _sym_graph(["n", 3, "m"], f)


@pytest.mark.parametrize("n,m", [(5, 4), (8, 7)])
def test_symbolic_executes_at_two_sizes(n, m):
    a = _arr((n, 3, m), n)

    def f(x):
        return [x[1:], x[::-2], x[..., 1:-1], x[:, None, 1], x[-1], x[1:-1:2, ::-1, :Dim("m") - 1]]

    outs = run_graph(f, [tt(F32, ["n", 3, "m"])], a)
    wants = [a[1:], a[::-2], a[..., 1:-1], a[:, None, 1], a[-1], a[1:-1:2, ::-1, : m - 1]]
    for got, want in zip(outs, wants):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("lo,hi", [(1, 4), (0, 6), (3, 3)])
def test_tensor_bounds_with_out_dim(lo, hi):
    a = _arr((6, 2))
    types = [tt(F32, [6, 2]), tt(DType.int64, []), tt(DType.int64, [])]

    def f(x, s, e):
        y = x[(slice(s, e), "k")]
        assert y.shape == ["k", 2]
        return y

    got = run1(f, types, a, np.array(lo), np.array(hi))
    np.testing.assert_array_equal(got, a[lo:hi])
    got = run1(lambda x, s, e: x[(slice(e, s, -1), "k"), 1], types, a, np.array(lo), np.array(hi))
    np.testing.assert_array_equal(got, a[hi:lo:-1, 1])


def test_out_dim_checked_at_execution():
    a = _arr((4,))
    with pytest.raises(Exception, match="slice_tensor"):
        run1(lambda x: x[(slice(1, None), "n")], [tt(F32, ["n"])], a)
    got = run1(lambda x: x[(slice(1, None), Dim("n") - 1),], [tt(F32, ["n"])], a)
    np.testing.assert_array_equal(got, a[1:])


def test_slice_errors():
    def check(idx, exc, match, shape=(2, 3)):
        with pytest.raises(exc, match=match):
            _sym_graph(list(shape), lambda x: ops.slice_tensor(x, idx))

    check([0, 3], IndexError, r"slice_tensor: index 3 is out of range for axis 1 of size 3")
    check([-3], IndexError, r"index -3 is out of range for axis 0 of size 2")
    check([0, 0, 0], IndexError, r"slice_tensor: too many indices for a rank-2")
    check([..., 0, ...], IndexError, "single ellipsis")
    check([slice(None, None, 0)], ValueError, r"slice_tensor: index 0 \(axis 0\): slice step cannot be zero")
    check([True], TypeError, "bool is not a valid index")
    check([1.5], TypeError, "unsupported index")
    check([slice(0.5, None)], TypeError, "slice start must be")
    check([np.array([0.0, 1.0])], ValueError, r"^indices.dtype=float64 must be an integer type\.")
    check([np.array([True, False])], TypeError, "boolean mask")
    check([(slice(0, 2), 3)], ValueError, "has 2 elements, but out_dim is 3")
    check([(slice(0, 2), 3, 4)], TypeError, r"must be \(slice, out_dim\)")
    with pytest.raises(ValueError, match="tensor bounds, so its size is unknown"):
        _sym_graph([4], lambda x, s: x[s:], more=[TensorType(DType.int64, [], DeviceRef.CPU())])


# ------------------------------------------------------------------ gather
@st.composite
def gather_case(draw):
    shape = draw(shapes(min_rank=1, max_rank=3, min_side=1, max_side=4))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    ishape = draw(shapes(min_rank=0, max_rank=2, min_side=0, max_side=3))
    seed = draw(st.integers(0, 2**16))
    n = shape[axis]
    idx = np.random.default_rng(seed).integers(-n, n, size=ishape)
    return shape, axis, idx


@given(gather_case(), st.sampled_from([np.int32, np.int64]))
def test_gather_matches_take(case, idt):
    shape, axis, idx = case
    a = _arr(shape, 2)
    idx = idx.astype(idt)
    got = run1(lambda x, i: ops.gather(x, i, axis=axis), [tt(F32, shape), tt(DType.from_numpy(idx.dtype), idx.shape)],
               a, idx)
    want = np.take(a, idx, axis=axis)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_gather_types_and_errors():
    it = TensorType(DType.int64, ["k", 2], DeviceRef.CPU())
    out = _sym_graph(["n", "m", 5], lambda x, i: ops.gather(x, i, axis=1), more=[it])
    assert out.shape == ["n", "k", 2, 5]
    out = _sym_graph(["n", "m", 5], lambda x, i: ops.gather(x, i), more=[it])
    assert out.shape == ["n", "m", "k", 2]
    with pytest.raises(IndexError, match=r"^Axis out of range \(expected to be in range of \[-2, 1\], but got 3\)"):
        _sym_graph([2, 3], lambda x: ops.gather(x, np.array([0]), axis=3))
    with pytest.raises(ValueError, match="^indices.dtype=float64 must be an integer type"):
        _sym_graph([2, 3], lambda x: ops.gather(x, np.array([0.5])))
    with pytest.raises(ValueError, match="gather: input must have rank >= 1"):
        _sym_graph([], lambda x: ops.gather(x, np.array([0])))


# ------------------------------------------------------------------ gather_nd
def _gather_nd_ref(a, idx, b):
    k = idx.shape[-1]
    bshape, gshape = a.shape[:b], idx.shape[b:-1]
    out = np.empty(bshape + gshape + a.shape[b + k:], a.dtype)
    for bi in np.ndindex(*bshape):
        for gi in np.ndindex(*gshape):
            out[bi + gi] = a[bi + tuple(idx[bi + gi])]
    return out


@st.composite
def gather_nd_case(draw):
    shape = draw(shapes(min_rank=1, max_rank=4, min_side=1, max_side=3))
    b = draw(st.integers(0, len(shape) - 1))
    k = draw(st.integers(1, len(shape) - b))
    gshape = draw(shapes(min_rank=0, max_rank=2, min_side=1, max_side=3))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    ishape = shape[:b] + gshape
    cols = [rng.integers(-shape[b + j], shape[b + j], size=ishape) for j in range(k)]
    idx = np.stack(cols, axis=-1) if ishape else np.array([c for c in cols])
    return shape, b, idx.reshape(ishape + (k,)).astype(np.int64)


@given(gather_nd_case())
def test_gather_nd_matches_loops(case):
    shape, b, idx = case
    a = _arr(shape, 3)
    got = run1(lambda x, i: ops.gather_nd(x, i, batch_dims=b), [tt(F32, shape), tt(DType.int64, idx.shape)], a, idx)
    want = _gather_nd_ref(a, idx, b)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_gather_nd_spec_example():
    inp = TensorType(DType.bfloat16, ["a", "b", "c", "d", "e"], DeviceRef.CPU())
    ind = TensorType(DType.int32, ["a", "f", 3], DeviceRef.CPU())
    with Graph("gather_nd", input_types=[inp, ind]) as graph:
        x, i = graph.inputs
        g = ops.gather_nd(x, i, batch_dims=1)
        assert g.type == TensorType(DType.bfloat16, ["a", "f", "e"], DeviceRef.CPU())


@pytest.mark.parametrize("a_,f_", [(2, 3), (3, 1)])
def test_gather_nd_symbolic_executes(a_, f_):
    shape = (a_, 3, 2, 4)
    a = _arr(shape, a_)
    rng = np.random.default_rng(a_)
    idx = np.stack([rng.integers(0, 3, (a_, f_)), rng.integers(-2, 2, (a_, f_))], -1).astype(np.int32)
    got = run1(lambda x, i: ops.gather_nd(x, i, batch_dims=1),
               [tt(F32, ["a", 3, 2, "e"]), tt(DType.int32, ["a", "f", 2])], a, idx)
    np.testing.assert_array_equal(got, _gather_nd_ref(a, idx, 1))


def test_gather_nd_errors():
    def check(shape, ishape, b, exc, match):
        it = TensorType(DType.int64, ishape, DeviceRef.CPU())
        with pytest.raises(exc, match=match):
            _sym_graph(shape, lambda x, i: ops.gather_nd(x, i, batch_dims=b), more=[it])

    check([2, 3], [4, "k"], 0, ValueError, r"^index last dimension must be static: indices=TensorValue\(")
    check([2, 3], [4, 3], 0, ValueError, r"gather_nd: batch_dims \(0\) \+ index depth \(3\) exceeds")
    check([2, 3], [3, 1], 1, ValueError, r"^input=TensorValue\(.*\) and indices=TensorValue\(.*\) must match up to batch_dims=1")
    check([2, 3], [2], 1, ValueError, "must have rank > batch_dims")
    check([2, 3], [2, 1], -1, ValueError, "batch_dims must be >= 0")
    check([2, 3], [2, 1], 0.5, TypeError, "batch_dims must be an int")


# ------------------------------------------------------------------ scatter
def _scatter_ref(a, upd, idx, axis):
    out = a.copy()
    for pos in np.ndindex(*idx.shape):
        tgt = list(pos)
        tgt[axis] = idx[pos]
        out[tuple(tgt)] = upd[pos]
    return out


@st.composite
def scatter_case(draw):
    shape = draw(shapes(min_rank=1, max_rank=3, min_side=1, max_side=4))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    ishape = list(draw(st.integers(1, s)) for s in shape)
    ax = axis % len(shape)
    # unique positions along the axis: the first ishape[ax] of a random permutation
    perm_shape = list(ishape)
    perm_shape[ax] = shape[ax]
    perm = np.argsort(rng.random(perm_shape), axis=ax)
    idx = np.take(perm, np.arange(ishape[ax]), axis=ax)
    if draw(st.booleans()):
        idx = idx - shape[ax]  # negative indices count from the end
    return shape, axis, idx.astype(np.int64)


@given(scatter_case())
def test_scatter_matches_loops(case):
    shape, axis, idx = case
    a = _arr(shape, 4)
    upd = _arr(idx.shape, 5)
    got = run1(lambda x, u, i: ops.scatter(x, u, i, axis=axis),
               [tt(F32, shape), tt(F32, idx.shape), tt(DType.int64, idx.shape)], a, upd, idx)
    np.testing.assert_array_equal(got, _scatter_ref(a, upd, idx % np.array(shape[axis]), axis % len(shape)))


def test_scatter_symbolic_and_errors():
    ut = TensorType(F32, ["n", 2], DeviceRef.CPU())
    it = TensorType(DType.int64, ["n", 2], DeviceRef.CPU())
    out = _sym_graph(["n", 5], lambda x, u, i: ops.scatter(x, u, i, axis=1), more=[ut, it])
    assert out.shape == ["n", 5]
    for n in (2, 3):
        a, u = _arr((n, 5), n), _arr((n, 2), n + 1)
        i = np.tile(np.array([[4, 1]]), (n, 1))
        got = run1(lambda x, uu, ii: ops.scatter(x, uu, ii, axis=1),
                   [tt(F32, ["n", 5]), tt(F32, ["n", 2]), tt(DType.int64, ["n", 2])], a, u, i)
        np.testing.assert_array_equal(got, _scatter_ref(a, u, i, 1))

    def check(fn, exc, match):
        with pytest.raises(exc, match=match):
            _sym_graph([3, 4], fn)

    # MAX 26.7 does not check the shapes of updates and indices (B2.1)
    check(lambda x: ops.scatter(x, ops.constant(np.zeros((3, 1)), DType.float64, DeviceRef.CPU()),
                                np.zeros((3, 1), np.int64)), ValueError,
          r"^The input dtype 'DType.float32' and updates dtype 'DType.float64' must match\.")
    check(lambda x: ops.scatter(x, np.zeros((3, 1)), np.zeros((3, 1), np.int64), axis=2), ValueError,
          r"^Invalid axis value 2\. Axis must be in range \[-2, 1\]")


# ------------------------------------------------------------------ scatter_nd
def _scatter_nd_ref(a, upd, idx):
    out = a.copy()
    for pos in np.ndindex(*idx.shape[:-1]):
        out[tuple(idx[pos])] = upd[pos]
    return out


@st.composite
def scatter_nd_case(draw):
    shape = draw(shapes(min_rank=1, max_rank=3, min_side=1, max_side=4))
    k = draw(st.integers(1, len(shape)))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    total = int(np.prod(shape[:k]))
    m = draw(st.integers(1, total))
    flat = rng.choice(total, size=m, replace=False)
    idx = np.stack(np.unravel_index(flat, shape[:k]), axis=-1).astype(np.int64)
    if draw(st.booleans()):
        idx = idx.reshape((1, m, k))
    return shape, idx


@given(scatter_nd_case())
def test_scatter_nd_matches_loops(case):
    shape, idx = case
    k = idx.shape[-1]
    a = _arr(shape, 6)
    upd = _arr(idx.shape[:-1] + shape[k:], 7)
    got = run1(lambda x, u, i: ops.scatter_nd(x, u, i),
               [tt(F32, shape), tt(F32, upd.shape), tt(DType.int64, idx.shape)], a, upd, idx)
    np.testing.assert_array_equal(got, _scatter_nd_ref(a, upd, idx))


def test_scatter_nd_partial_symbolic_and_errors():
    for n in (3, 5):
        a, u = _arr((n, 4), n), _arr((2, 4), n)
        i = np.array([[n - 1], [-n]])
        got = run1(lambda x, uu, ii: ops.scatter_nd(x, uu, ii),
                   [tt(F32, ["n", 4]), tt(F32, [2, 4]), tt(DType.int64, [2, 1])], a, u, i)
        np.testing.assert_array_equal(got, _scatter_nd_ref(a, u, i))

    def check(ushape, ishape, exc, match):
        with pytest.raises(exc, match=match):
            _sym_graph([3, 4], lambda x: ops.scatter_nd(x, np.zeros(ushape, np.float32), np.zeros(ishape, np.int64)))

    # MAX 26.7 does not check the shapes (B2.2): only the dtypes
    with pytest.raises(ValueError, match=r"^The input dtype \(DType.float32\) and updates dtype \(DType.float64\) must match$"):
        _sym_graph([3, 4], lambda x: ops.scatter_nd(x, ops.constant(np.zeros((2, 4)), DType.float64, DeviceRef.CPU()),
                                                       np.zeros((2, 1), np.int64)))
