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


def test_reduction_over_an_empty_axis_builds_as_in_max():
    """https://docs.modular.com/max/api/python/graph.ops/ (``sum``, ``mean``, ``argmax``): the pages state
    the result shape (the axis becomes size 1) and say nothing of empty axes.  MAX 26.7 accepts a size-0
    axis (``[2, 0, 3] -> [2, 1, 3]``; max-behaviours.md B5.1); sum/mean/prod then give numpy's values
    (0, NaN, 1)."""
    for op in (ops.sum, ops.mean, ops.argmax):
        with Graph("empty_axis", input_types=[TensorType(DType.float32, [2, 0, 3], C)]) as g:
            x = g.inputs[0].tensor
            assert [int(d) for d in op(x, 1).shape] == [2, 1, 3]
            y = op(x, 2)  # a non-empty axis of an empty tensor: the result is empty too
            assert [int(d) for d in y.shape] == [2, 0, 1]
    with Graph("empty_vals", input_types=[TensorType(DType.float32, [2, 0, 3], C)]) as g:
        x = g.inputs[0].tensor
        g.output(ops.sum(x, 1), ops.mean(x, 1), ops.prod(x, 1))
    a = np.zeros((2, 0, 3), np.float32)
    s, m, p = _run(g, a)
    np.testing.assert_array_equal(s, a.sum(axis=1, keepdims=True))
    np.testing.assert_array_equal(m, np.full((2, 1, 3), np.nan, np.float32))  # numpy's mean of nothing
    np.testing.assert_array_equal(p, a.prod(axis=1, keepdims=True))


def test_bool_arithmetic_and_mean_of_bool_give_bool():
    """https://docs.modular.com/max/api/python/graph.ops/ (``sub``, ``add``, ``sum``, ``mean``): the pages
    list the operands' types but not which dtypes the arithmetic accepts; MAX 26.7 accepts bool operands and
    gives bool (max-behaviours.md B5.2, B6.1: computed as integers, non-zero is True).  The float path
    still matches numpy."""
    with Graph("bools", input_types=[TensorType(DType.bool, [2, 3], C)]) as g:
        b = g.inputs[0].tensor
        assert ops.sub(b, b).dtype is DType.bool
        assert ops.mean(b, 1).dtype is DType.bool and ops.sum(b, 1).dtype is DType.bool
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
        for cond in (i, f):  # MAX 26.7: a ValueError (max-behaviours.md B7.1)
            with pytest.raises(ValueError, match="^Expected condition to be a boolean tensor, but got a tensor with dtype"):
                ops.where(cond, f, f)
        g.output(ops.where(i != 0, f, -f))
    ints = np.array([[0, 2, -1], [0, 0, 5]], np.int32)
    vals = np.arange(6, dtype=np.float32).reshape(2, 3) + 1
    (out,) = _run(g, ints, vals)
    np.testing.assert_array_equal(out, np.where(ints != 0, vals, -vals))


def test_float_indices_for_gather_and_scatter_are_refused():
    """https://docs.modular.com/max/api/python/graph.ops/ (``gather``, ``gather_nd``, ``scatter``,
    ``scatter_nd``): the indices are "index values"/"positions"; the pages do not say a float tensor is
    accepted; MAX 26.7 refuses them with a ValueError (max-behaviours.md B2.4, B9.3; no silent truncation
    of 1.7 to 1).  Integer indices match numpy."""
    types = [TensorType(DType.float32, [2, 3], C), TensorType(DType.float32, [2, 3], C),
             TensorType(DType.int64, [2, 3], C)]
    with Graph("idx", input_types=types) as g:
        x, fi, ii = (v.tensor for v in g.inputs)
        for call, msg in ((lambda: ops.gather(x, fi, 1), "indices.dtype=float32 must be an integer type."),
                          (lambda: ops.scatter(x, x, fi, 1), "Invalid indices dtype: 'DType.float32'. Indices must be"),
                          (lambda: ops.gather_nd(x, fi), "indices.dtype=float32 must be an integer type."),
                          (lambda: ops.scatter_nd(x, x[0], fi[:, :2]), "Invalid indices dtype: 'DType.float32'")):
            with pytest.raises(ValueError, match="^" + msg.replace(".", "\\.")):
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


def test_tensor_dim_and_type_print_as_the_docs_show():
    """https://docs.modular.com/max/develop/tensors (printing a tensor shows its ``TensorType(dtype=...,
    shape=[Dim(...), ...], device=cpu:0)`` then its values as nested Python lists, a float32 tensor's ints
    as ``1.0``); https://docs.modular.com/max/api/python/graph/dim (``print(Dim("batch") * 5)`` shows the
    expression ``batch * 5``); https://docs.modular.com/max/api/python/generated/max.graph.TensorType/
    (``print(t.dtype)`` -> ``DType.float32``; ``print(t.shape)``: MAX 26.7 prints ``[Dim(2), Dim(3)]``,
    max-behaviours.md B1.6).  Values against numpy."""
    from max.experimental.tensor import Tensor
    from max.graph import AlgebraicDim

    data = [[1, 2, 3], [4, 5, 6]]
    t = Tensor.constant(data)
    # MAX 26.7 prints eager tensors as their repr (max-behaviours.md B14.1-B14.4), not as the page shows
    dev = "device=Device(type=cpu,id=0)"
    assert str(t) == repr(t) == f"Tensor([1 2 3\n 4 5 6], dtype=DType.float32, {dev})"
    assert str(Tensor.constant([1, 2, 3, 4, 5])) == f"Tensor([1 2 3 4 5], dtype=DType.float32, {dev})"
    assert str(Tensor(42, dtype=DType.int32)) == f"Tensor(42, dtype=DType.int32, {dev})"
    assert str(Tensor([True, False])) == f"Tensor([ True False], dtype=DType.bool, {dev})"
    expr = Dim("batch") * 5
    assert isinstance(expr, AlgebraicDim) and str(expr) == "batch * 5"
    assert -Dim("x") - 4 == -(Dim("x") + 4)
    assert (repr(Dim(5)), str(Dim(5)), repr(Dim("batch")), str(Dim("batch"))) == ("Dim(5)", "5", "Dim('batch')", "batch")
    tt = TensorType(DType.float32, (2, 3), device=C)
    assert (str(tt.dtype), str(tt.shape)) == ("DType.float32", "[Dim(2), Dim(3)]")


def test_experimental_linear_takes_dims_and_modules_print_nested():
    """https://docs.modular.com/max/api/python/generated/max.experimental.nn.Linear/ -- ``in_dim`` and
    ``out_dim`` are ``DimLike`` (so ``Linear(in_dim=Dim(2), out_dim=3)`` works) and read back as ``Dim``
    properties; ``bias`` is a Tensor or 0.  https://docs.modular.com/max/api/python/generated/max.experimental.nn.Sequential/
    -- children are named ``"0"``, ``"1"``, ...  The printed form is MAX 26.7's (rich's pretty layout).  The layer's output against numpy."""
    from max.experimental.nn import Linear, Sequential
    from max.experimental.tensor import Tensor

    lin = Linear(in_dim=Dim(2), out_dim=3)
    assert (lin.in_dim, lin.out_dim) == (Dim(2), Dim(3)) and isinstance(lin.in_dim, Dim)
    # MAX 26.7's printed form (max-behaviours.md B16.1/B16.2): bias only when False, rich's layout
    assert repr(lin) == "Linear(in_dim=Dim(2), out_dim=Dim(3))"
    model = Sequential(lin, Sequential(Linear(3, 4, bias=False), Linear(Dim(4), Dim(2))))
    assert repr(model) == (
        "Sequential(\n"
        "    Linear(in_dim=Dim(2), out_dim=Dim(3)),\n"
        "    Sequential(\n"
        "        Linear(in_dim=Dim(3), out_dim=Dim(4), bias=False),\n"
        "        Linear(in_dim=Dim(4), out_dim=Dim(2))\n"
        "    )\n"
        ")"
    )
    assert str(model) == repr(model)
    assert sorted(dict(model.parameters)) == ["0.bias", "0.weight", "1.0.weight", "1.1.bias", "1.1.weight"]
    x = np.array([[0.5, -1.0], [2.0, 0.25]], np.float32)
    params = {k: np.from_dlpack(v).astype(np.float64) for k, v in model.parameters}
    ref = x @ params["0.weight"].T + params["0.bias"]
    ref = ref @ params["1.0.weight"].T
    ref = ref @ params["1.1.weight"].T + params["1.1.bias"]
    np.testing.assert_allclose(np.from_dlpack(model(Tensor(x))), ref, rtol=1e-5, atol=1e-5)
    for bad in (Dim("n"), 0, True, 2.5):
        with pytest.raises(ValueError, match="Linear: in_dim must be a positive static dim"):
            Linear(bad, 3)


def test_other_sequence_constructors():
    """https://docs.modular.com/max/api/python/generated/max.experimental.tensor.Tensor/ -- ``data`` is a
    DLPack array, a nested array or a number, and the factories (``constant``, ``zeros``, ``arange``...)
    take shapes and sizes as dims: ranges, tuples, ``Dim``s and ``Shape``s work where lists and ints do,
    and a list whose elements are tensors/DLPack arrays stacks them (as ``numpy.array`` does).  numpy
    builds the reference values; a ragged list is a TypeError."""
    from max.experimental.tensor import Tensor
    from max.graph import Shape

    def vals(t):
        return np.from_dlpack(t)

    np.testing.assert_array_equal(vals(Tensor.constant(range(3))), np.arange(3, dtype=np.float32))
    np.testing.assert_array_equal(vals(Tensor.constant(range(3), dtype=DType.int32)), np.arange(3, dtype=np.int32))
    for shape in ((Dim(2), 3), Shape([2, 3]), range(2, 4)):
        np.testing.assert_array_equal(vals(Tensor.zeros(shape)), np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(vals(Tensor.arange(Dim(4), dtype=DType.int64)), np.arange(4))
    np.testing.assert_array_equal(vals(Tensor.full((2,), 7, dtype=DType.int8)), np.full(2, 7, np.int8))
    stacked = Tensor([Tensor(1.0), np.float32(2.5), np.array(3)])
    np.testing.assert_array_equal(vals(stacked), np.array([1.0, 2.5, 3.0], np.float32))
    rows = Tensor((np.arange(3, dtype=np.float32), range(3, 6)))
    np.testing.assert_array_equal(vals(rows), np.arange(6, dtype=np.float32).reshape(2, 3))
    with pytest.raises(TypeError, match="cannot convert"):
        Tensor([[1, 2], [3]])


def test_experimental_embedding_takes_dims():
    """https://docs.modular.com/max/api/python/generated/max.experimental.nn.Embedding/ -- ``vocab_size`` and
    ``dim`` are ``DimLike``, ``dims`` a ``ShapeLike``; ``dim`` reads back as a ``Dim`` and raises for an
    embedding whose vectors are not 1-d, ``dims`` as the vector's dims.  Printed form (not shown in the
    docs) pinned as libremax's.  The lookup against numpy indexing."""
    from max.experimental.nn import Embedding
    from max.experimental.tensor import Tensor

    e = Embedding(vocab_size=Dim(10), dims=[Dim(2), 3])
    assert e.dims == [Dim(2), Dim(3)] and all(isinstance(d, Dim) for d in e.dims)
    with pytest.raises(ValueError, match="use .dims"):
        e.dim
    assert repr(e) == "Embedding(vocab_size=Dim(10), dims=[Dim(2), Dim(3)])"
    e1 = Embedding(10, dim=Dim(4))
    assert e1.dim == Dim(4) and isinstance(e1.dim, Dim)
    assert repr(e1) == "Embedding(vocab_size=Dim(10), dim=Dim(4))"
    idx = np.array([[3, 0], [9, 3]], np.int64)
    np.testing.assert_array_equal(np.from_dlpack(e(Tensor(idx))), np.from_dlpack(e.weight)[idx])
    with pytest.raises(ValueError, match="positive static dims"):
        Embedding(Dim("v"), dim=4)
