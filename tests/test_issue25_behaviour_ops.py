"""Issue 25's remaining behaviour items (round 2): ``fold`` with symbolic kernel sizes, the op type rules
the MAX op pages state (reductions, bool arithmetic, ``where``, scatter/gather indices), ``Tensor.from_dim``,
and how ``Dim`` / ``Tensor`` / ``experimental.nn`` modules print.  Each docstring names the MAX page it
follows; where the page is silent the test pins libremax's current behaviour and says so."""

from __future__ import annotations

import numpy as np
import pytest

from max.driver import Buffer
from max.dtype import DType
from max.graph import DeviceRef, Dim, Graph, StaticDim, TensorType, ops

C = DeviceRef.CPU()


def _col2im(x: np.ndarray, out_hw, k, stride=(1, 1), dilation=(1, 1), padding=(0, 0)) -> np.ndarray:
    """Independent float64 fold reference: every column of ``x`` adds its kh*kw patch into the output."""
    n, ckk, _ = x.shape
    kh, kw = k
    c = ckk // (kh * kw)
    hp, wp = out_hw[0] + 2 * padding[0], out_hw[1] + 2 * padding[1]
    out = np.zeros((n, c, hp, wp))
    bh = (hp - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    bw = (wp - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    cols = x.astype(np.float64).reshape(n, c, kh, kw, bh, bw)
    for i in range(kh):
        for j in range(kw):
            for bi in range(bh):
                for bj in range(bw):
                    out[:, :, bi * stride[0] + i * dilation[0], bj * stride[1] + j * dilation[1]] += cols[:, :, i, j, bi, bj]
    return out[:, :, padding[0]:padding[0] + out_hw[0], padding[1]:padding[1] + out_hw[1]]


def _run(g: Graph, *arrays: np.ndarray) -> list[np.ndarray]:
    from max.engine import InferenceSession

    model = InferenceSession().load(g)
    return [r.to_numpy() for r in model.execute(*(Buffer.from_numpy(a) for a in arrays))]


def test_fold_with_symbolic_kernel_sizes():
    """https://docs.modular.com/max/api/python/graph.ops/ (``fold``) -- ``kernel_size`` is a pair of
    ``int | str | Dim``, so it may be symbolic: the channel dim is then ``input.shape[1] // (kh * kw)``
    and the sizes are checked when the graph runs.  Values against a float64 numpy col2im."""
    in_types = [TensorType(DType.float32, [1, "ckk", "l"], C), TensorType(DType.float32, ["kh", "kw"], C)]
    with Graph("fold_sym", input_types=in_types) as g:
        x, kern = (v.tensor for v in g.inputs)
        y = ops.fold(x, (4, 5), (kern.shape[0], Dim("kw")), stride=(1, 2), padding=(1, 0))
        assert not isinstance(y.shape[1], StaticDim)  # ckk // (kh * kw)
        assert y.shape[1].evaluate({"ckk": 12, "kh": 2, "kw": 3}) == 2
        assert [int(d) for d in y.shape[2:]] == [4, 5]
        g.output(y)
    rng = np.random.default_rng(0)
    for kh, kw, c in ((2, 3, 2), (3, 1, 1)):
        bh, bw = (4 + 2 - (kh - 1) - 1) // 1 + 1, (5 - (kw - 1) - 1) // 2 + 1
        x = rng.standard_normal((1, c * kh * kw, bh * bw)).astype(np.float32)
        (out,) = _run(g, x, np.zeros((kh, kw), np.float32))
        assert out.shape == (1, c, 4, 5)
        np.testing.assert_allclose(out, _col2im(x, (4, 5), (kh, kw), (1, 2), (1, 1), (1, 0)), rtol=1e-5, atol=1e-5)
    # the run-time checks: L that does not match, a dim 1 that is no multiple of kh * kw
    with pytest.raises(Exception, match="blocks"):
        _run(g, np.zeros((1, 6, 7), np.float32), np.zeros((2, 3), np.float32))
    with pytest.raises(Exception, match="multiple of the kernel size product"):
        _run(g, np.zeros((1, 7, 15), np.float32), np.zeros((2, 3), np.float32))


def test_tensor_from_dim():
    """https://docs.modular.com/max/api/python/generated/max.experimental.tensor.Tensor/ (the constructors;
    ``from_dim``: the page we could find gives no body for it, so libremax's rule, pinned here, is: a rank-0
    tensor holding the size, int64 unless ``dtype`` says otherwise; a symbolic dim only inside a graph,
    where it reads the size the graph runs with).  Reference: the sizes computed in Python/numpy."""
    from max.engine import InferenceSession
    from max.experimental import functional as F
    from max.experimental.tensor import Tensor

    t = Tensor.from_dim(Dim(7))
    assert (t.dtype, list(t.shape), t.item()) == (DType.int64, [], 7)
    assert Tensor.from_dim(3, dtype=DType.float32).item() == 3.0
    assert Tensor.from_dim(Dim(4) * 5 - 1).item() == 19
    with pytest.raises(ValueError, match="symbolic"):
        Tensor.from_dim(Dim("batch"))
    with pytest.raises(TypeError, match="from_dim"):
        Tensor.from_dim(1.5)
    with Graph("from_dim", input_types=[TensorType(DType.float32, ["n", 3], C)]) as g:
        n = g.inputs[0].tensor.shape[0]
        g.output(F.from_dim(n * 2 + 1), F.from_dim(n, dtype=DType.int32))
    for rows in (1, 5):
        a, b = (r.to_numpy() for r in InferenceSession().load(g).execute(Buffer.from_numpy(np.zeros((rows, 3), np.float32))))
        assert a.shape == () and int(a) == rows * 2 + 1
        assert b.dtype == np.int32 and int(b) == rows


def test_reduction_over_an_empty_axis_is_refused_at_build_time():
    """https://docs.modular.com/max/api/python/graph.ops/ (``sum``, ``mean``, ``argmax``): the pages state
    the result shape (the axis becomes size 1) and say nothing of empty axes.  libremax keeps its current,
    pinned behaviour: a ValueError naming the op and the axis when the graph is built (numpy's ``mean`` of
    nothing would be a NaN with a warning; nothing silently reads undefined values)."""
    for op in (ops.sum, ops.mean, ops.argmax):
        with Graph("empty_axis", input_types=[TensorType(DType.float32, [2, 0, 3], C)]) as g:
            x = g.inputs[0].tensor
            with pytest.raises(ValueError, match=rf"{op.__name__}: cannot reduce axis 1 .* it has size 0"):
                op(x, 1)
            y = op(x, 2)  # a non-empty axis of an empty tensor is fine: the result is empty too
            assert [int(d) for d in y.shape] == [2, 0, 1]


def test_bool_arithmetic_and_mean_of_bool_are_refused():
    """https://docs.modular.com/max/api/python/graph.ops/ (``sub``, ``add``, ``sum``, ``mean``): the pages
    list the operands' types but not which dtypes the arithmetic accepts; libremax keeps its current, pinned
    rule: arithmetic and reductions take numeric tensors, and a bool one is a TypeError at build time that
    says to cast first (numpy also refuses ``bool - bool``).  After the cast the values match numpy."""
    with Graph("bools", input_types=[TensorType(DType.bool, [2, 3], C)]) as g:
        b = g.inputs[0].tensor
        with pytest.raises(TypeError, match="sub: operands must be numeric"):
            ops.sub(b, b)
        with pytest.raises(TypeError, match="mean: x must be numeric, got DType.bool; cast it first"):
            ops.mean(b, 1)
        with pytest.raises(TypeError, match="sum: x must be numeric"):
            ops.sum(b, 1)
        f = b.cast(DType.float32)
        g.output(ops.mean(f, 1), ops.sub(f, ops.constant(1.0, DType.float32, C)))
    mask = np.array([[True, False, True], [False, False, True]])
    with pytest.raises(TypeError):
        np.subtract(mask, mask)
    m, s = _run(g, mask)
    np.testing.assert_allclose(m, mask.mean(axis=1, keepdims=True), rtol=1e-6)
    np.testing.assert_array_equal(s, mask.astype(np.float32) - 1)


def test_where_needs_a_bool_condition():
    """https://docs.modular.com/max/api/python/graph.ops/ (``where``): the condition "must have a boolean
    dtype", so an int or float condition is a TypeError at build time; with a bool condition the values
    match ``numpy.where``."""
    types = [TensorType(DType.int32, [2, 3], C), TensorType(DType.float32, [2, 3], C)]
    with Graph("where", input_types=types) as g:
        i, f = (v.tensor for v in g.inputs)
        for cond in (i, f):
            with pytest.raises(TypeError, match="where: condition must be a bool tensor"):
                ops.where(cond, f, f)
        g.output(ops.where(i != 0, f, -f))
    ints = np.array([[0, 2, -1], [0, 0, 5]], np.int32)
    vals = np.arange(6, dtype=np.float32).reshape(2, 3) + 1
    (out,) = _run(g, ints, vals)
    np.testing.assert_array_equal(out, np.where(ints != 0, vals, -vals))


def test_float_indices_for_gather_and_scatter_are_refused():
    """https://docs.modular.com/max/api/python/graph.ops/ (``gather``, ``gather_nd``, ``scatter``,
    ``scatter_nd``): the indices are "index values"/"positions"; the pages do not say a float tensor is
    accepted, and libremax keeps its current, pinned rule: integer indices only, a TypeError at build time
    otherwise (no silent truncation of 1.7 to 1).  Integer indices match numpy."""
    types = [TensorType(DType.float32, [2, 3], C), TensorType(DType.float32, [2, 3], C),
             TensorType(DType.int64, [2, 3], C)]
    with Graph("idx", input_types=types) as g:
        x, fi, ii = (v.tensor for v in g.inputs)
        for call, name in ((lambda: ops.gather(x, fi, 1), "gather"), (lambda: ops.scatter(x, x, fi, 1), "scatter"),
                           (lambda: ops.gather_nd(x, fi), "gather_nd"),
                           (lambda: ops.scatter_nd(x, x[0], fi[:, :2]), "scatter_nd")):
            with pytest.raises(TypeError, match=rf"{name}: indices must be an integer tensor"):
                call()
        g.output(ops.gather(x, ii, 1), ops.scatter(x, x * 10, ii, 1))
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    idx = np.array([[2, 0, 1], [1, 2, 0]], np.int64)  # a permutation per row: no duplicate writes
    gathered, scattered = _run(g, a, a, idx)
    np.testing.assert_array_equal(gathered, np.take(a, idx, axis=1))
    ref = a.copy()
    for r in range(2):
        for j in range(3):
            ref[r, idx[r, j]] = a[r, j] * 10
    np.testing.assert_array_equal(scattered, ref)
