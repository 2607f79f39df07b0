"""irfft against numpy/torch float64; nonzero against np.nonzero; masked_scatter against a numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from max.dtype import DType
from max.graph import Dim, Graph, ops
from max.graph.ops import Normalization
from support import run1, session, to_input, tt


# ================================================================== irfft
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_irfft_matches_torch(data, seed):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=2, max_side=6))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    n = data.draw(st.one_of(st.none(), st.integers(1, 12)))
    norm = data.draw(st.sampled_from(["backward", "ortho", "forward", Normalization.ORTHO]))
    cplx = data.draw(st.booleans())
    dt = data.draw(st.sampled_from([DType.float32, DType.float64]))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((*shape, 2) if cplx else shape).astype(dt.to_numpy())
    out = run1(lambda a: ops.irfft(a, n, axis, norm, input_is_complex=cplx), [tt(dt, x.shape)], x)
    x64 = x.astype(np.float64)
    xc = x64[..., 0] + 1j * x64[..., 1] if cplx else x64.astype(np.complex128)
    ref = torch.fft.irfft(torch.from_numpy(xc), n=n, dim=axis, norm=str(Normalization(norm))).numpy()
    np.testing.assert_allclose(ref, np.fft.irfft(xc, n, axis, norm=str(Normalization(norm))), atol=1e-12)
    assert out.dtype == dt.to_numpy() and out.shape == ref.shape
    tol = 1e-4 if dt is DType.float32 else 1e-10
    np.testing.assert_allclose(out, ref, rtol=tol, atol=tol)


def test_irfft_half_types_and_symbolic():
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float16)
    out = run1(lambda a: ops.irfft(a), [tt(DType.float16, x.shape)], x)
    assert out.dtype == np.float16 and out.shape == (3, 8)
    np.testing.assert_allclose(out.astype(np.float64), np.fft.irfft(x.astype(np.float64)), atol=5e-3)
    with Graph("t", input_types=[tt(DType.float32, ["b", "m", 2])]) as g:
        x = g.inputs[0].tensor
        y = ops.irfft(x, input_is_complex=True, axis=1)
        assert y.shape == ["b", 2 * (Dim("m") - 1)]
        z = ops.irfft(x, n=6, input_is_complex=True, normalization=Normalization.FORWARD)
        assert z.shape == ["b", 6]
        g.output(y, z)
    model = session().load(g)
    a = np.random.default_rng(1).standard_normal((2, 4, 2)).astype(np.float32)
    y, z = (o.to_numpy() for o in model.execute(to_input(a)))
    ac = a[..., 0] + 1j * a[..., 1]
    np.testing.assert_allclose(y, np.fft.irfft(ac), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(z, np.fft.irfft(ac, 6, norm="forward"), rtol=1e-5, atol=1e-5)


def _err(fn, types, exc, match):
    with pytest.raises(exc, match=match):
        with Graph("e", input_types=types) as g:
            fn(*(v.tensor for v in g.inputs))


def test_irfft_errors():
    F4 = tt(DType.float32, [3, 4])
    _err(lambda x: ops.irfft(np.ones(4, np.float32)), [F4], TypeError, r"irfft: input_tensor must be a tensor value")
    _err(lambda x: ops.irfft(x), [tt(DType.int32, [3, 4])], TypeError, r"irfft: input_tensor must be a floating")
    _err(lambda x: ops.irfft(x, input_is_complex=True), [F4], ValueError, r"irfft: input_is_complex=True needs a last dim of size 2")
    _err(lambda x: ops.irfft(x, axis=2), [F4], IndexError, r"^Axis out of range \(expected to be in range of \[-2, 1\], but got 2\)")
    _err(lambda x: ops.irfft(x, axis=1, input_is_complex=True), [tt(DType.float32, [3, 2])], IndexError,
         r"^Axis out of range \(expected to be in range of \[-1, 0\], but got 1\)")
    _err(lambda x: ops.irfft(x, n=0), [F4], ValueError, r"irfft: the output length n must be positive")
    _err(lambda x: ops.irfft(x, n=2.0), [F4], TypeError, r"irfft: n must be an int or None")
    _err(lambda x: ops.irfft(x), [tt(DType.float32, [3, 1])], ValueError, r"irfft: the output length n must be positive, got 0")
    _err(lambda x: ops.irfft(x, normalization="none"), [F4], ValueError, r"irfft: normalization must be")
    _err(lambda x: ops.irfft(x), [tt(DType.float32, [])], ValueError, r"irfft: input_tensor must have rank >= 1")


# ================================================================== nonzero
@given(data=st.data())
def test_nonzero_matches_numpy(data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=5))
    dt = data.draw(st.sampled_from([DType.bool, DType.int32, DType.float32]))
    x = data.draw(hnp.arrays(dt.to_numpy(), shape, elements=st.sampled_from([0, 1, 2]).map(dt.to_numpy().type)))
    out = run1(lambda a: ops.nonzero(a, "nz"), [tt(dt, shape)], x)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, np.argwhere(x).reshape(-1, len(shape)))
    np.testing.assert_array_equal(out.T, np.stack(np.nonzero(x)).reshape(len(shape), -1))


def test_nonzero_binds_out_dim_and_checks_static():
    with Graph("t", input_types=[tt(DType.float32, [3, 4])]) as g:
        idx = ops.nonzero(g.inputs[0].tensor, "count")
        assert idx.shape == ["count", 2] and idx.dtype is DType.int64
        # the bound dim flows into later ops
        g.output(idx, ops.reshape(idx, [Dim("count") * 2]))
    model = session().load(g)
    x = np.array([[0, 1, 0, 2], [0, 0, 0, 0], [3, 0, 0, 4]], np.float32)
    idx, flat = (o.to_numpy() for o in model.execute(to_input(x)))
    np.testing.assert_array_equal(idx, np.argwhere(x))
    np.testing.assert_array_equal(flat, np.argwhere(x).reshape(-1))
    g = Graph("s", lambda a: ops.nonzero(a, 4), input_types=[tt(DType.float32, [3, 4])])
    model = session().load(g)
    np.testing.assert_array_equal(model.execute(to_input(x))[0].to_numpy(), np.argwhere(x))
    with pytest.raises(Exception, match=r"nonzero: x has 3 non-zero elements but out_dim is 4"):
        model.execute(to_input(np.eye(3, 4, dtype=np.float32)))
    _err(lambda a: ops.nonzero(a, 13), [tt(DType.float32, [3, 4])], ValueError, r"nonzero: out_dim=13 exceeds")
    _err(lambda a: ops.nonzero(a, -1), [tt(DType.float32, [3, 4])], ValueError, r"nonzero: out_dim must be non-negative")
    _err(lambda a: ops.nonzero(a, None), [tt(DType.float32, [3, 4])], TypeError, r"nonzero: out_dim is required")
    _err(lambda a: ops.nonzero(a, "n"), [tt(DType.float32, [])], ValueError, r"nonzero: x must have rank >= 1")


# ================================================================== masked_scatter
def _masked_scatter_ref(x, mask, updates):
    shape = np.broadcast_shapes(x.shape, mask.shape)
    out = np.broadcast_to(x, shape).copy()
    m = np.broadcast_to(mask, shape)
    out[m] = updates.reshape(-1)[: int(m.sum())]
    return out


@given(data=st.data(), seed=st.integers(0, 2**16))
def test_masked_scatter_matches_numpy(data, seed):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    mshape = data.draw(hnp.broadcastable_shapes(shape, min_dims=1, max_dims=len(shape), min_side=1, max_side=4))
    rng = np.random.default_rng(seed)
    dt = data.draw(st.sampled_from([DType.float32, DType.int64]))
    x = rng.integers(-50, 50, shape).astype(dt.to_numpy())
    mask = rng.random(mshape) < 0.5
    full = int(np.broadcast_to(mask, np.broadcast_shapes(shape, mshape)).sum())
    extra = data.draw(st.integers(0, 3))
    updates = rng.integers(100, 200, (full + extra,)).astype(dt.to_numpy())
    out_dim = data.draw(st.sampled_from(["n", full]))
    out = run1(lambda a, m, u: ops.masked_scatter(a, m, u, out_dim),
               [tt(dt, shape), tt(DType.bool, mshape), tt(dt, updates.shape)], x, mask, updates)
    ref = _masked_scatter_ref(x, mask, updates)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    np.testing.assert_array_equal(out, ref)


def test_masked_scatter_types_and_errors():
    with Graph("t", input_types=[tt(DType.float32, ["b", 4]), tt(DType.bool, [1, 4]), tt(DType.float32, [2, 3])]) as g:
        x, m, u = (v.tensor for v in g.inputs)
        y = ops.masked_scatter(x, m, u, "n")
        assert y.shape == ["b", 4] and y.dtype is DType.float32
    A = [tt(DType.float32, [2, 3]), tt(DType.bool, [2, 3]), tt(DType.float32, [4])]
    _err(lambda x, m, u: ops.masked_scatter(x, m, u, 5), A, ValueError,
         r"masked_scatter: out_dim=5 true positions but updates \[Dim\(4\)\] holds only 4")
    _err(lambda x, m, u: ops.masked_scatter(x, u, u, 2), A, TypeError, r"masked_scatter: mask must be a bool tensor")
    _err(lambda x, m, u: ops.masked_scatter(x, m, ops.cast(u, DType.float64), 2), A, ValueError,
         r"masked_scatter: updates dtype .*float64 differs from input dtype .*float32")
    _err(lambda x, m, u: ops.masked_scatter(x, ops.reshape(m, [3, 2]), u, 2), A, ValueError,
         r"masked_scatter: input and mask shapes \[Dim\(2\), Dim\(3\)\] and \[Dim\(3\), Dim\(2\)\] cannot be broadcast")
    g = Graph("s", lambda x, m, u: ops.masked_scatter(x, m, u, 2), input_types=A)
    model = session().load(g)
    x = np.zeros((2, 3), np.float32)
    u = np.arange(1, 5, dtype=np.float32)
    with pytest.raises(Exception, match=r"masked_scatter: mask has 3 true elements but out_dim is 2"):
        model.execute(to_input(x), to_input(np.eye(2, 3, dtype=bool) | np.eye(2, 3, 1, dtype=bool)[::-1]), to_input(u))
    m = np.array([[True, False, False], [False, False, True]])
    np.testing.assert_array_equal(model.execute(to_input(x), to_input(m), to_input(u))[0].to_numpy(),
                                  _masked_scatter_ref(x, m, u))
