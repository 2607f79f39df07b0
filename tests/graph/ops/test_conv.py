"""conv2d / conv3d / conv2d_transpose / fold against float64 torch references (layouts converted here)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from max.dtype import DType
from max.graph import ConvInputLayout, Dim, FilterLayout, Graph, ops
from support import run1, session, to_input, tt

NHWC, NCHW = ConvInputLayout.NHWC, ConvInputLayout.NCHW
TOL = dict(rtol=1e-4, atol=1e-4)


def _t64(a):
    return torch.from_numpy(np.ascontiguousarray(a)).double()


def _to_layout(a, layout, order):
    """``a`` in torch order (letters ``order``) permuted to ``layout``."""
    return np.ascontiguousarray(a.transpose([order.index(ch) for ch in layout]))


def _torch_pad(x, padding):
    nd = len(padding) // 2
    flat = []
    for i in reversed(range(nd)):
        flat += [padding[2 * i], padding[2 * i + 1]]
    return F.pad(x, flat)


def _run_conv(op, x_l, w_l, b, **kw):
    types = [tt(DType.float32, x_l.shape), tt(DType.float32, w_l.shape)]
    arrays = [x_l, w_l]
    if b is not None:
        types.append(tt(DType.float32, b.shape))
        arrays.append(b)
        return run1(lambda x, w, bb: op(x, w, bias=bb, **kw), types, *arrays)
    return run1(lambda x, w: op(x, w, **kw), types, *arrays)


# ================================================================== conv2d / conv3d
@st.composite
def conv_case(draw, nd):
    groups = draw(st.integers(1, 3))
    cpg = draw(st.integers(1, 3 if nd == 2 else 2))
    fpg = draw(st.integers(1, 3 if nd == 2 else 2))
    k = [draw(st.integers(1, 3)) for _ in range(nd)]
    s = [draw(st.integers(1, 3)) for _ in range(nd)]
    d = [draw(st.integers(1, 2)) for _ in range(nd)]
    p = [draw(st.integers(0, 2)) for _ in range(2 * nd)]
    sizes = []
    for i in range(nd):
        eff = d[i] * (k[i] - 1) + 1
        lo = max(1, eff - p[2 * i] - p[2 * i + 1])
        sizes.append(draw(st.integers(lo, lo + (5 if nd == 2 else 3))))
    n = draw(st.integers(1, 2))
    bias = draw(st.booleans())
    layout = draw(st.sampled_from([NHWC, NCHW]))
    flayouts = ["RSCF", "FCRS", "CFRS"] if nd == 2 else ["QRSCF", "FCQRS"]
    fl = draw(st.sampled_from(flayouts))
    return groups, cpg, fpg, k, s, d, p, sizes, n, bias, layout, fl


def _check_conv(nd, case, seed):
    groups, cpg, fpg, k, s, d, p, sizes, n, bias, layout, fl = case
    rng = np.random.default_rng(seed)
    cin, cout = cpg * groups, fpg * groups
    x = rng.standard_normal((n, cin, *sizes)).astype(np.float32)  # torch order N C spatial
    w = rng.standard_normal((cout, cpg, *k)).astype(np.float32)  # torch order F C spatial
    b = rng.standard_normal(cout).astype(np.float32) if bias else None
    ref = (F.conv2d if nd == 2 else F.conv3d)(
        _torch_pad(_t64(x), p), _t64(w), None if b is None else _t64(b), s, 0, d, groups).numpy()
    sp = "RS" if nd == 2 else "QRS"
    x_l = _to_layout(x, "N" + sp + "C", "NC" + sp) if layout is NHWC else x
    w_l = _to_layout(w, fl, "FC" + sp)
    op = ops.conv2d if nd == 2 else ops.conv3d
    out = _run_conv(op, x_l, w_l, b, stride=tuple(s), dilation=tuple(d), padding=tuple(p), groups=groups,
                    input_layout=layout, filter_layout=FilterLayout(fl))
    if layout is NHWC:
        out = _to_layout(out, "NC" + sp, "N" + sp + "C")
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, **TOL)


@given(case=conv_case(2), seed=st.integers(0, 2**16))
def test_conv2d_matches_torch(case, seed):
    _check_conv(2, case, seed)


@given(case=conv_case(3), seed=st.integers(0, 2**16))
def test_conv3d_matches_torch(case, seed):
    _check_conv(3, case, seed)


def test_conv2d_defaults_padding_example_and_ints():
    # the reference's padding example: [0, 1, 2, 1] on a 2x3 input gives a 3x6 padded input
    x = np.arange(1, 7, dtype=np.float32).reshape(1, 2, 3, 1)
    w = np.ones((1, 1, 1, 1), np.float32)
    out = run1(lambda a, f: ops.conv2d(a, f, padding=(0, 1, 2, 1)), [tt(DType.float32, x.shape),
                                                                      tt(DType.float32, w.shape)], x, w)
    expect = np.array([[0, 0, 1, 2, 3, 0], [0, 0, 4, 5, 6, 0], [0, 0, 0, 0, 0, 0]], np.float32)
    np.testing.assert_array_equal(out[0, :, :, 0], expect)
    # single ints are repeated; constant filters/bias from numpy arrays
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 6, 6, 2)).astype(np.float32)
    w = rng.standard_normal((3, 3, 2, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    out = run1(lambda a: ops.conv2d(a, w, stride=2, dilation=1, padding=1, bias=b), [tt(DType.float32, x.shape)], x)
    ref = F.conv2d(_t64(x).permute(0, 3, 1, 2), _t64(w).permute(3, 2, 0, 1), _t64(b), 2, 1).permute(0, 2, 3, 1)
    np.testing.assert_allclose(out, ref.numpy(), **TOL)


def test_conv2d_float64_and_float16():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 5, 5, 3))
    w = rng.standard_normal((2, 2, 3, 4))
    ref = F.conv2d(_t64(x).permute(0, 3, 1, 2), _t64(w).permute(3, 2, 0, 1)).permute(0, 2, 3, 1).numpy()
    out = run1(lambda a, f: ops.conv2d(a, f), [tt(DType.float64, x.shape), tt(DType.float64, w.shape)], x, w)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)
    x16, w16 = x.astype(np.float16), w.astype(np.float16)
    out = run1(lambda a, f: ops.conv2d(a, f), [tt(DType.float16, x.shape), tt(DType.float16, w.shape)], x16, w16)
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=2e-2, atol=3e-2)


def test_conv2d_symbolic_shapes():
    with Graph("t", input_types=[tt(DType.float32, ["n", "h", "w", 3]), tt(DType.float32, [3, 3, 3, 8])]) as g:
        x, w = (v.tensor for v in g.inputs)
        y = ops.conv2d(x, w, stride=(2, 2), padding=(1, 1, 0, 2))
        assert y.shape == ["n", (Dim("h") - 1) // 2 + 1, (Dim("w") - 1) // 2 + 1, 8]
        g.output(y)
    model = session().load(g)
    rng = np.random.default_rng(3)
    w = rng.standard_normal((3, 3, 3, 8)).astype(np.float32)
    for shape in [(1, 5, 7, 3), (2, 8, 4, 3)]:
        x = rng.standard_normal(shape).astype(np.float32)
        out = model.execute(to_input(x), to_input(w))[0].to_numpy()
        ref = F.conv2d(F.pad(_t64(x).permute(0, 3, 1, 2), (0, 2, 1, 1)), _t64(w).permute(3, 2, 0, 1), stride=2)
        np.testing.assert_allclose(out, ref.permute(0, 2, 3, 1).numpy(), **TOL)
    # NCHW keeps the layout of the input in the result
    with Graph("t2", input_types=[tt(DType.float32, ["n", 4, "h", 9])]) as g:
        y = ops.conv2d(g.inputs[0].tensor, np.zeros((6, 2, 3, 3), np.float32), groups=2,
                       input_layout=NCHW, filter_layout=FilterLayout.FCRS)
        assert y.shape == ["n", 6, Dim("h") - 2, 7]


def _err(fn, types, exc, match):
    with pytest.raises(exc, match=match):
        with Graph("e", input_types=types) as g:
            fn(*(v.tensor for v in g.inputs))


X = tt(DType.float32, [1, 6, 6, 4])


@pytest.mark.parametrize("kw,wshape,exc,match", [
    ({}, [3, 3, 3, 8], ValueError, r"conv2d: x has 4 input channels but filter .* has 3 channels per group x 1"),
    ({"groups": 2}, [3, 3, 4, 8], ValueError, r"conv2d: x has 4 input channels .* 4 channels per group x 2 group"),
    ({"groups": 2}, [3, 3, 2, 7], ValueError, r"conv2d: filter has 7 output channels, which is not divisible by groups=2"),
    ({"groups": 0}, [3, 3, 4, 8], ValueError, r"conv2d: groups must be a positive int"),
    ({"stride": (0, 1)}, [3, 3, 4, 8], ValueError, r"conv2d: stride must be positive"),
    ({"dilation": (1, -1)}, [3, 3, 4, 8], ValueError, r"conv2d: dilation must be positive"),
    ({"padding": (1, 1)}, [3, 3, 4, 8], ValueError, r"conv2d: padding must have 4 entries"),
    ({"padding": (0, 0, -1, 0)}, [3, 3, 4, 8], ValueError, r"conv2d: padding must be non-negative"),
    ({"stride": (1.5, 1)}, [3, 3, 4, 8], TypeError, r"conv2d: stride must be an int or a tuple of 2 ints"),
    ({"filter_layout": FilterLayout.QRSCF}, [3, 3, 4, 8], ValueError, r"conv2d: filter_layout .*QRSCF.* not valid"),
    ({"input_layout": "NDHWC"}, [3, 3, 4, 8], ValueError, r"conv2d: input_layout must be a ConvInputLayout"),
    ({}, [3, 3, 4], ValueError, r"conv2d: filter must have rank 4"),
    ({}, [7, 3, 4, 8], ValueError, r"conv2d: the H axis of size 6 .* smaller than the dilated kernel"),
    ({"dilation": (1, 3)}, [3, 3, 4, 8], ValueError, r"conv2d: the W axis"),
])
def test_conv2d_errors(kw, wshape, exc, match):
    _err(lambda x, w: ops.conv2d(x, w, **kw), [X, tt(DType.float32, wshape)], exc, match)


def test_conv_more_errors():
    w = tt(DType.float32, [3, 3, 4, 8])
    _err(lambda x, f: ops.conv2d(x, f), [tt(DType.float32, [6, 6, 4]), w], ValueError, r"conv2d: x must have rank 4")
    _err(lambda x, f: ops.conv2d(x, f), [tt(DType.int32, [1, 6, 6, 4]), tt(DType.int32, [3, 3, 4, 8])],
         TypeError, r"conv2d: x must be a floating-point tensor")
    _err(lambda x, f: ops.conv2d(x, f), [X, tt(DType.float64, [3, 3, 4, 8])], TypeError,
         r"conv2d: filter dtype (DType\.)?float64 differs from x dtype (DType\.)?float32")
    _err(lambda x, f, b: ops.conv2d(x, f, bias=b), [X, w, tt(DType.float32, [4])], ValueError,
         r"conv2d: bias must have shape \[8\]")
    _err(lambda x, f: ops.conv3d(x, f), [X, w], ValueError, r"conv3d: x must have rank 5")
    _err(lambda x, f: ops.conv3d(x, f, filter_layout=FilterLayout.RSCF),
         [tt(DType.float32, [1, 4, 4, 4, 2]), tt(DType.float32, [1, 1, 2, 3])], ValueError,
         r"conv3d: filter_layout .*RSCF.* not valid for a 3-D")
    _err(lambda x, f: ops.conv3d(x, f, padding=(1, 1, 1, 1)),
         [tt(DType.float32, [1, 4, 4, 4, 2]), tt(DType.float32, [1, 1, 1, 2, 3])], ValueError,
         r"conv3d: padding must have 6 entries")
    _err(lambda x, f: ops.conv2d_transpose(x, f), [X, tt(DType.float32, [3, 3, 8, 5])], ValueError,
         r"conv2d_transpose: x has 4 input channels but filter .* expects 5")
    _err(lambda x, f: ops.conv2d_transpose(x, f, output_paddings=(-1, 0)), [X, tt(DType.float32, [3, 3, 8, 4])],
         ValueError, r"conv2d_transpose: output_paddings must be non-negative")
    _err(lambda x, f: ops.conv2d_transpose(x, f, padding=(4, 4, 0, 0)), [tt(DType.float32, [1, 2, 2, 4]),
         tt(DType.float32, [3, 3, 8, 4])], ValueError, r"conv2d_transpose: the H output size would be -4")


# ================================================================== conv2d_transpose
def _transpose_ref(x, w, b, s, d, p, op):
    """The gradient of conv2d (same filter/strides/dilations/paddings) w.r.t. its input, by autograd.

    x: (N, Cin, H, W) input of the transposed conv; w: torch ConvTranspose order (Cin, Cout, kh, kw).
    """
    xt, wt = _t64(x), _t64(w)
    h = (x.shape[2] - 1) * s[0] + d[0] * (w.shape[2] - 1) + 1 - p[0] - p[1] + op[0]
    wd = (x.shape[3] - 1) * s[1] + d[1] * (w.shape[3] - 1) + 1 - p[2] - p[3] + op[1]
    z = torch.zeros((x.shape[0], w.shape[1], h, wd), dtype=torch.float64, requires_grad=True)
    y = F.conv2d(_torch_pad(z, p), wt, None, s, 0, d)
    assert y.shape == xt.shape, (y.shape, xt.shape)
    (y * xt).sum().backward()
    out = z.grad
    if b is not None:
        out = out + _t64(b).view(1, -1, 1, 1)
    return out.numpy()


@given(data=st.data(), seed=st.integers(0, 2**16))
def test_conv2d_transpose_is_conv2d_gradient(data, seed):
    cin, cout = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    k = [data.draw(st.integers(1, 3)) for _ in range(2)]
    s = [data.draw(st.integers(1, 3)) for _ in range(2)]
    d = [data.draw(st.integers(1, 2)) for _ in range(2)]
    sizes = [data.draw(st.integers(1, 5)) for _ in range(2)]
    p = []
    for i in range(2):
        full = (sizes[i] - 1) * s[i] + d[i] * (k[i] - 1) + 1
        before = data.draw(st.integers(0, min(2, full - 1)))
        p += [before, data.draw(st.integers(0, min(2, full - 1 - before)))]
    op = [data.draw(st.integers(0, s[i] - 1)) for i in range(2)]
    bias = data.draw(st.booleans())
    layout = data.draw(st.sampled_from([NHWC, NCHW]))
    fl = data.draw(st.sampled_from(["RSCF", "FCRS"]))
    rng = np.random.default_rng(seed)
    n = 2
    x = rng.standard_normal((n, cin, *sizes)).astype(np.float32)
    w = rng.standard_normal((cin, cout, *k)).astype(np.float32)  # torch order: in, out, kh, kw = F C R S
    b = rng.standard_normal(cout).astype(np.float32) if bias else None
    ref = _transpose_ref(x, w, b, s, d, p, op)
    x_l = _to_layout(x, "NRSC", "NCRS") if layout is NHWC else x
    w_l = _to_layout(w, fl, "FCRS")
    out = _run_conv(ops.conv2d_transpose, x_l, w_l, b, stride=tuple(s), dilation=tuple(d), padding=tuple(p),
                    output_paddings=tuple(op), input_layout=layout, filter_layout=FilterLayout(fl))
    if layout is NHWC:
        out = _to_layout(out, "NCRS", "NRSC")
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, **TOL)


def test_conv2d_transpose_matches_torch_output_padding():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 3, 4, 5)).astype(np.float32)  # NCHW
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)  # in, out, kh, kw
    b = rng.standard_normal(2).astype(np.float32)
    for s, p, op, d in [((2, 2), 1, (1, 1), (1, 1)), ((1, 1), 0, (1, 0), (2, 2)), ((3, 2), 2, (2, 1), (1, 1))]:
        ref = F.conv_transpose2d(_t64(x), _t64(w), _t64(b), s, p, op, 1, d).numpy()
        out = _run_conv(ops.conv2d_transpose, x, w, b, stride=s, dilation=d, padding=(p,) * 4,
                        output_paddings=op, input_layout=NCHW, filter_layout=FilterLayout.FCRS)
        np.testing.assert_allclose(out, ref, **TOL)
    # output padding beyond the full result (after = 0) appends zeros (+ bias), as the reference describes
    out = _run_conv(ops.conv2d_transpose, x, w, None, output_paddings=(2, 0), input_layout=NCHW,
                    filter_layout=FilterLayout.FCRS)
    full = F.conv_transpose2d(_t64(x), _t64(w)).numpy()
    assert out.shape == (1, 2, full.shape[2] + 2, full.shape[3])
    np.testing.assert_allclose(out[:, :, :-2], full, **TOL)
    assert not out[:, :, -2:].any()


def test_conv2d_transpose_symbolic_type():
    with Graph("t", input_types=[tt(DType.float32, ["n", "h", "w", 4]), tt(DType.float32, [3, 2, 5, 4])]) as g:
        x, w = (v.tensor for v in g.inputs)
        y = ops.conv2d_transpose(x, w, stride=(2, 3), padding=(1, 0, 0, 1), output_paddings=(1, 0))
        assert y.shape == ["n", (Dim("h") - 1) * 2 + 3 - 1 + 1, (Dim("w") - 1) * 3 + 2 - 1, 5]


# ================================================================== fold
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_fold_matches_torch(data, seed):
    k = [data.draw(st.integers(1, 3)) for _ in range(2)]
    s = [data.draw(st.integers(1, 3)) for _ in range(2)]
    d = [data.draw(st.integers(1, 2)) for _ in range(2)]
    p = [data.draw(st.integers(0, 1)) for _ in range(2)]
    out_hw = [data.draw(st.integers(max(1, d[i] * (k[i] - 1) + 1 - 2 * p[i]), 7)) for i in range(2)]
    blocks = [(out_hw[i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(2)]
    n, c = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3))
    x = np.random.default_rng(seed).standard_normal((n, c * k[0] * k[1], blocks[0] * blocks[1])).astype(np.float32)
    ints = data.draw(st.booleans()) and s[0] == s[1] and d[0] == d[1] and p[0] == p[1]
    args = (s[0], d[0], p[0]) if ints else (tuple(s), tuple(d), tuple(p))
    out = run1(lambda a: ops.fold(a, tuple(out_hw), tuple(k), *args), [tt(DType.float32, x.shape)], x)
    ref = F.fold(_t64(x), tuple(out_hw), tuple(k), tuple(d), tuple(p), tuple(s)).numpy()
    assert out.shape == (n, c, *out_hw)
    np.testing.assert_allclose(out, ref, **TOL)


def test_fold_symbolic_and_errors():
    with Graph("t", input_types=[tt(DType.float32, ["n", 12, "l"])]) as g:
        y = ops.fold(g.inputs[0].tensor, ("h", "w"), (2, 2))
        assert y.shape == ["n", 3, "h", "w"]
    # L is checked at build time when static
    _err(lambda x: ops.fold(x, (4, 5), (2, 2)), [tt(DType.float32, [1, 12, 11])], ValueError,
         r"fold: input has L=11 blocks but output_size \(4, 5\), kernel_size \(2, 2\).* give 3 \* 4 = 12")
    _err(lambda x: ops.fold(x, (4, 5), (2, 2)), [tt(DType.float32, [1, 10, 12])], ValueError,
         r"fold: input dim 1 \(10\) must be a multiple of the kernel size product 2 \* 2 = 4")
    _err(lambda x: ops.fold(x, (4, 5), (2, 2)), [tt(DType.float32, [12, 12])], ValueError, r"fold: input must have rank 3")
    _err(lambda x: ops.fold(x, (4, 5), (0, 2)), [tt(DType.float32, [1, 12, 12])], ValueError,
         r"fold: kernel_size must be positive")
    _err(lambda x: ops.fold(x, (4, 5), (2, 2), stride=0), [tt(DType.float32, [1, 12, 12])], ValueError,
         r"fold: stride must be positive")
    _err(lambda x: ops.fold(x, 4, (2, 2)), [tt(DType.float32, [1, 12, 12])], TypeError,
         r"fold: output_size must be a tuple of two dims")
    _err(lambda x: ops.fold(x, (4, 5), (2, 2)), [tt(DType.int32, [1, 12, 12])], TypeError,
         r"fold: input must be a floating-point tensor")
    _err(lambda x: ops.fold(x, (1, 5), (2, 2)), [tt(DType.float32, [1, 12, 12])], ValueError,
         r"fold: output_size \(1, 5\) with padding \(0, 0\) is smaller than the dilated kernel")
    # ... and when the graph runs when symbolic
    g = Graph("t", lambda x: ops.fold(x, (4, 5), (2, 2)), input_types=[tt(DType.float32, [1, 12, "l"])])
    model = session().load(g)
    x = np.ones((1, 12, 12), np.float32)
    np.testing.assert_allclose(model.execute(to_input(x))[0].to_numpy(), F.fold(_t64(x), (4, 5), (2, 2)).numpy())
    with pytest.raises(Exception, match=r"fold: input has L=11 blocks"):
        model.execute(to_input(np.ones((1, 12, 11), np.float32)))
