"""max_pool2d / avg_pool2d (NHWC) against a float64 loop reference and torch; resize (bicubic) against torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from max.dtype import DType
from max.graph import Dim, Graph, ops
from max.graph.ops import InterpolationMode
from support import run1, session, to_input, tt

TOL = dict(rtol=1e-5, atol=1e-5)


def _out(n, k, s, d, p, ceil):
    eff = d * (k - 1) + 1
    num = n + 2 * p - eff
    o = (-(-num // s) if ceil else num // s) + 1
    if ceil and (o - 1) * s >= n + p:
        o -= 1
    return o


def _pool_ref(x, k, s, d, p, ceil, kind, count_boundary=True):
    """Loop reference in float64 over an NHWC array (PyTorch's window and divisor rules)."""
    x = x.astype(np.float64)
    n, h, w, c = x.shape
    oh, ow = _out(h, k[0], s[0], d[0], p[0], ceil), _out(w, k[1], s[1], d[1], p[1], ceil)
    out = np.empty((n, oh, ow, c))
    for i in range(oh):
        rows = [i * s[0] - p[0] + a * d[0] for a in range(k[0])]
        for j in range(ow):
            cols = [j * s[1] - p[1] + b * d[1] for b in range(k[1])]
            vr = [r for r in rows if 0 <= r < h]
            vc = [q for q in cols if 0 <= q < w]
            win = x[:, vr][:, :, vc].reshape(n, -1, c)
            if kind == "max":
                out[:, i, j] = win.max(1) if win.shape[1] else -np.inf
            else:
                if count_boundary:
                    cnt = sum(r < h + p[0] for r in rows) * sum(q < w + p[1] for q in cols)
                else:
                    cnt = len(vr) * len(vc)
                out[:, i, j] = win.sum(1) / max(cnt, 1)
    return out


@st.composite
def pool_case(draw):
    k = [draw(st.integers(1, 3)) for _ in range(2)]
    s = [draw(st.integers(1, 3)) for _ in range(2)]
    d = [draw(st.integers(1, 2)) for _ in range(2)]
    p = [draw(st.integers(0, k[i] // 2 + draw(st.integers(0, 1)))) for i in range(2)]
    ceil = draw(st.booleans())
    sizes = []
    for i in range(2):
        lo = max(1, d[i] * (k[i] - 1) + 1 - 2 * p[i])
        sizes.append(draw(st.integers(lo, lo + 5)))
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    return k, s, d, p, ceil, (n, *sizes, c)


def _args(k, s, d, p):
    # single ints where both axes agree, tuples otherwise
    one = lambda v: v[0] if v[0] == v[1] else tuple(v)  # noqa: E731
    return tuple(k), one(s), one(d), one(p)


@given(case=pool_case(), seed=st.integers(0, 2**16))
def test_max_pool2d_matches_reference(case, seed):
    k, s, d, p, ceil, shape = case
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    out = run1(lambda a: ops.max_pool2d(a, *_args(k, s, d, p), ceil_mode=ceil), [tt(DType.float32, shape)], x)
    ref = _pool_ref(x, k, s, d, p, ceil, "max")
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, **TOL)
    if p[0] <= k[0] // 2 and p[1] <= k[1] // 2:  # what torch accepts
        tref = F.max_pool2d(torch.from_numpy(x).double().permute(0, 3, 1, 2), k, s, p, d, ceil)
        np.testing.assert_allclose(out, tref.permute(0, 2, 3, 1).numpy(), **TOL)


@given(case=pool_case(), count_boundary=st.booleans(), seed=st.integers(0, 2**16))
def test_avg_pool2d_matches_reference(case, count_boundary, seed):
    k, s, d, p, ceil, shape = case
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    out = run1(lambda a: ops.avg_pool2d(a, *_args(k, s, d, p), ceil_mode=ceil, count_boundary=count_boundary),
               [tt(DType.float32, shape)], x)
    ref = _pool_ref(x, k, s, d, p, ceil, "avg", count_boundary)
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, **TOL)
    if d == [1, 1] and p[0] <= k[0] // 2 and p[1] <= k[1] // 2:  # what torch accepts
        tref = F.avg_pool2d(torch.from_numpy(x).double().permute(0, 3, 1, 2), k, s, p, ceil, count_boundary)
        np.testing.assert_allclose(out, tref.permute(0, 2, 3, 1).numpy(), **TOL)


def test_pool_float64_float16_and_defaults():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 6, 5, 3))
    for dt in (DType.float64, DType.float16):
        xa = x.astype(dt.to_numpy())
        tol = 1e-12 if dt is DType.float64 else 2e-3
        out = run1(lambda a: ops.max_pool2d(a, (2, 2)), [tt(dt, x.shape)], xa)
        assert out.dtype == dt.to_numpy() and out.shape == (2, 5, 4, 3)
        np.testing.assert_allclose(out.astype(np.float64), _pool_ref(xa, (2, 2), (1, 1), (1, 1), (0, 0), False, "max"),
                                   rtol=tol, atol=tol)
        out = run1(lambda a: ops.avg_pool2d(a, (3, 2), 2), [tt(dt, x.shape)], xa)
        np.testing.assert_allclose(out.astype(np.float64),
                                   _pool_ref(xa, (3, 2), (2, 2), (1, 1), (0, 0), False, "avg"), rtol=tol, atol=tol)


def test_pool_symbolic_shapes():
    with Graph("t", input_types=[tt(DType.float32, ["n", "h", "w", 4])]) as g:
        x = g.inputs[0].tensor
        y = ops.max_pool2d(x, (3, 3), stride=2, padding=1)
        assert y.shape == ["n", (Dim("h") - 1) // 2 + 1, (Dim("w") - 1) // 2 + 1, 4]
        z = ops.avg_pool2d(x, (3, 3), stride=2, ceil_mode=True)  # padding + stride <= kernel: no correction
        assert z.shape == ["n", (Dim("h") - 2) // 2 + 1, (Dim("w") - 2) // 2 + 1, 4]
        g.output(y, z)
    model = session().load(g)
    rng = np.random.default_rng(1)
    for shape in [(1, 7, 8, 4), (2, 4, 5, 4)]:
        x = rng.standard_normal(shape).astype(np.float32)
        y, z = (o.to_numpy() for o in model.execute(to_input(x)))
        np.testing.assert_allclose(y, _pool_ref(x, (3, 3), (2, 2), (1, 1), (1, 1), False, "max"), **TOL)
        np.testing.assert_allclose(z, _pool_ref(x, (3, 3), (2, 2), (1, 1), (0, 0), True, "avg"), **TOL)


def _err(fn, types, exc, match):
    with pytest.raises(exc, match=match):
        with Graph("e", input_types=types) as g:
            fn(*(v.tensor for v in g.inputs))


X = tt(DType.float32, [1, 6, 6, 2])


@pytest.mark.parametrize("op", ["max_pool2d", "avg_pool2d"])
def test_pool_errors(op):
    f = getattr(ops, op)
    _err(lambda x: f(x, (2, 2)), [tt(DType.float32, [6, 6, 2])], ValueError, rf"{op}: input must have rank 4")
    _err(lambda x: f(x, (2, 2)), [tt(DType.int32, [1, 6, 6, 2])], TypeError, rf"{op}: input must be a floating")
    _err(lambda x: f(x, (2, 2), stride=0), [X], ValueError, rf"{op}: stride must be positive")
    _err(lambda x: f(x, (2, 0)), [X], ValueError, rf"{op}: kernel_size must be positive")
    _err(lambda x: f(x, (2, 2, 2)), [X], ValueError, rf"{op}: kernel_size must have 2 entries")
    _err(lambda x: f(x, ("k", 2)), [X], ValueError, rf"{op}: kernel_size must be static")
    _err(lambda x: f(x, (2, 2), dilation=(1, 0)), [X], ValueError, rf"{op}: dilation must be positive")
    _err(lambda x: f(x, (2, 2), padding=-1), [X], ValueError, rf"{op}: padding must be non-negative")
    _err(lambda x: f(x, (7, 2)), [X], ValueError, rf"{op}: the H axis of size 6 .* smaller than the dilated kernel")
    _err(lambda x: f(x, (2, 2), ceil_mode=1), [X], TypeError, rf"{op}: ceil_mode must be a bool")
    _err(lambda x: f(x, (1, 1), stride=2, ceil_mode=True), [tt(DType.float32, [1, "h", 6, 2])], ValueError,
         rf"{op}: ceil_mode on the symbolic H axis h needs padding \+ stride")
    if op == "avg_pool2d":
        _err(lambda x: f(x, (2, 2), count_boundary="no"), [X], TypeError, r"avg_pool2d: count_boundary must be a bool")


# ================================================================== resize
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_resize_bicubic_matches_torch(data, seed):
    n, c = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3))
    h, w = data.draw(st.integers(1, 7)), data.draw(st.integers(1, 7))
    oh, ow = data.draw(st.integers(1, 12)), data.draw(st.integers(1, 12))
    x = np.random.default_rng(seed).standard_normal((n, c, h, w)).astype(np.float32)
    out = run1(lambda a: ops.resize(a, (n, c, oh, ow), InterpolationMode.BICUBIC), [tt(DType.float32, x.shape)], x)
    ref = F.interpolate(torch.from_numpy(x).double(), size=(oh, ow), mode="bicubic", align_corners=False).numpy()
    assert out.shape == (n, c, oh, ow)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_resize_symbolic_and_errors():
    with Graph("t", input_types=[tt(DType.float32, ["n", 3, "h", "w"])]) as g:
        x = g.inputs[0].tensor
        y = ops.resize(x, ["n", 3, Dim("h") * 2, 5], interpolation="bicubic")
        assert y.shape == ["n", 3, Dim("h") * 2, 5]
        g.output(y)
    model = session().load(g)
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 6)).astype(np.float32)
    ref = F.interpolate(torch.from_numpy(x).double(), size=(8, 5), mode="bicubic", align_corners=False).numpy()
    np.testing.assert_allclose(model.execute(to_input(x))[0].to_numpy(), ref, rtol=1e-4, atol=1e-4)
    B = InterpolationMode.BICUBIC
    X4 = tt(DType.float32, [1, 3, 4, 4])
    _err(lambda x: ops.resize(x, (3, 8, 8), B), [tt(DType.float32, [3, 4, 4])], ValueError, r"resize: input must have rank 4")
    _err(lambda x: ops.resize(x, (1, 3, 8), B), [X4], ValueError, r"resize: shape must have 4 entries")
    _err(lambda x: ops.resize(x, 8, B), [X4], NotImplementedError, r"resize: a single int size")
    _err(lambda x: ops.resize(x, (1, 3, 8, 8)), [X4], NotImplementedError, r"resize: interpolation BILINEAR")
    _err(lambda x: ops.resize(x, (1, 3, 8, 8), InterpolationMode.NEAREST), [X4], NotImplementedError,
         r"resize: interpolation NEAREST is not implemented")
    _err(lambda x: ops.resize(x, (1, 3, 8, 8), "lanczos"), [X4], ValueError, r"resize: interpolation must be")
    _err(lambda x: ops.resize(x, (1, 4, 8, 8), B), [X4], ValueError, r"resize: shape .* changes the channel dim")
    _err(lambda x: ops.resize(x, (1, 3, 0, 8), B), [X4], ValueError, r"resize: output sizes must be positive")
    _err(lambda x: ops.resize(x, (1, 3, 8, 8), B), [tt(DType.int32, [1, 3, 4, 4])], TypeError,
         r"resize: input must be a floating")
    assert [m.value for m in InterpolationMode] == ["bicubic", "bilinear", "nearest"]
