"""The dense float32 / bfloat16 / float16 small-M matmul (csrc/dense.c) in every kernel variant this CPU runs.

The register-tiled kernel changes shape with M (a 2*TR x 1 tile at M = 1, TR x TC tiles, a last block
of fewer activation rows, one-row tiles for the last N % TR weight rows, half weights widened into a
float32 panel when M > TC) and splits the rows between threads; none of that may change a row's bits
(batch invariance), and every output must equal float64 within float32 accumulation error.  The ARM
variants are checked under qemu in ``test_native_kernels_arm.py``.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from max.engine import native

if native.lib() is None:  # pragma: no cover - no C compiler on this machine
    pytest.skip(f"native kernels unavailable: {native.error()}", allow_module_level=True)

from max.engine.native import build  # noqa: E402

ISAS = [pytest.param(v, marks=pytest.mark.skipif(v not in native.runnable(),
                                                  reason=f"this CPU cannot execute the {v} kernels"))
        for v, (arch, _, _) in build.VARIANTS.items() if build._arch_matches(arch)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _f64_reference(x: torch.Tensor, ws: list[torch.Tensor], biases, norm) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``norm(x) @ concat(W)^T + b`` and the scale of its rounding error (|x| @ |W|^T + |b|)."""
    xd = x.double()
    if norm is not None:
        nw, eps = norm
        xd = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * nw.double()
    wd = torch.cat([w.double() for w in ws])
    bd = torch.cat([torch.zeros(w.shape[0], dtype=torch.float64) if b is None else b.double()
                    for w, b in zip(ws, biases)])
    return xd @ wd.T + bd, xd.abs() @ wd.abs().T + bd.abs()


@pytest.mark.parametrize("isa", ISAS)
@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 40), ns=st.lists(st.integers(1, 45), min_size=1, max_size=3), k=st.integers(1, 300),
       dtypes=st.lists(st.sampled_from(list(DTYPES)), min_size=3, max_size=3), xpad=st.integers(0, 19),
       ypad=st.integers(0, 5), bias=st.booleans(), norm=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_dense_matmul_matches_float64(isa, m, ns, k, dtypes, xpad, ypad, bias, norm, seed):
    """One call over 1-3 weights of mixed dtypes (odd K: vector tails; odd N: one-row tiles), x and y
    rows at strides wider than K and N, optional biases and the fused RMSNorm, against float64."""
    so = native.lib(isa)
    g = torch.Generator().manual_seed(seed)
    ws = [(torch.randn(n, k, generator=g) * 0.5).to(DTYPES[dt]) for n, dt in zip(ns, dtypes)]
    bs = [torch.randn(n, generator=g) if bias and i != 1 else None for i, n in enumerate(ns)]
    nrm = (torch.randn(k, generator=g), 1e-5) if norm else None
    x = (torch.randn(m, k + xpad, generator=g) * 2)[:, :k]  # row stride k + xpad
    n_out = sum(ns)
    out = torch.full((m, n_out + ypad), float("nan"))[:, :n_out]
    plan = native.MatmulPlan(ws, [native.dense_kind(w.dtype) for w in ws], ["dense"] * len(ws), ns, k, bs, so=so,
                             norm=nrm)
    y = plan(x, out)
    assert y.data_ptr() == out.data_ptr()
    ref, scale = _f64_reference(x, ws, bs, nrm)
    tol = 2e-6 * (float(scale.max()) + 1e-30)
    assert float((y.double() - ref).abs().max()) <= tol
    if ypad:  # nothing written past the N columns of a row
        assert torch.isnan(out.as_strided((m, ypad), (n_out + ypad, 1), n_out)).all()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("k", [83, 520])
def test_dense_rows_are_bit_identical_at_every_m(isa, dtype, k):
    """A row's result does not depend on M or on the other rows: every M from 1 to 16 (each switch of the
    tile shape: the M = 1 tile, every width of the last activation block, one and two blocks, the half
    weights' widened panel) and 20, 25, 33, 40, at several positions, over 301 weight rows (one-row tiles
    for the last rows; two threads once M * N * K is large enough) gives the same bits as M = 40."""
    so = native.lib(isa)
    g = torch.Generator().manual_seed(k)
    n = 301
    w = torch.randn(n, k, generator=g).to(DTYPES[dtype])
    x = torch.randn(40, k, generator=g) * 3
    plan = native.MatmulPlan([w], [native.dense_kind(w.dtype)], ["dense"], [n], k, so=so)
    full = plan(x).numpy().view(np.uint32)
    for m in [*range(1, 17), 20, 25, 33]:
        for a in sorted({0, 40 - m, (7 * m) % (41 - m)}):
            got = plan(x[a:a + m]).numpy().view(np.uint32)
            np.testing.assert_array_equal(got, full[a:a + m], err_msg=f"{isa} {dtype} M={m} rows {a}:{a + m}")
    # and whatever the other rows hold
    other = x.clone()
    other[::2] = torch.randn(20, k, generator=g) * 100
    np.testing.assert_array_equal(plan(other).numpy().view(np.uint32)[1::2], full[1::2])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_dense_weight_rows_at_a_wider_stride(isa, dtype):
    """Weight rows row_bytes apart (a view of the first K columns of a wider matrix): the same bits as the
    contiguous copy, at M = 1 and across blocks."""
    so = native.lib(isa)
    g = torch.Generator().manual_seed(7)
    n, k, pad = 37, 131, 29
    wide = torch.randn(n, k + pad, generator=g).to(DTYPES[dtype])
    w = wide[:, :k]
    plan = native.MatmulPlan([w.contiguous()], [native.dense_kind(w.dtype)], ["dense"], [n], k, so=so)
    P = ctypes.c_void_p
    for m in (1, 5, 19):
        x = torch.randn(m, k, generator=g)
        y = torch.empty(m, n)
        rc = so.lmx_dense_matmul(m, k, x.data_ptr(), k, 1, (P * 1)(wide.data_ptr()),
                                 (ctypes.c_int * 1)(native.dense_kind(w.dtype)), (ctypes.c_int64 * 1)(n),
                                 (ctypes.c_int64 * 1)(wide.stride(0) * wide.element_size()), None, y.data_ptr(), n,
                                 0, None, 0.0)
        assert rc == 0
        np.testing.assert_array_equal(y.numpy().view(np.uint32), plan(x).numpy().view(np.uint32))
        ref = x.double() @ w.double().T
        assert float((y.double() - ref).abs().max()) <= 1e-6 * float((x.double().abs() @ w.double().abs().T).max())


@pytest.mark.parametrize("isa", ISAS)
def test_dense_scalar_path_matches_float64(isa):
    """The forced scalar path (plain k order) of every kind, against float64."""
    so = native.lib(isa)
    g = torch.Generator().manual_seed(3)
    for dt in DTYPES.values():
        w = torch.randn(19, 77, generator=g).to(dt)
        x = torch.randn(6, 77, generator=g)
        y = native.MatmulPlan([w], [native.dense_kind(dt)], ["dense"], [19], 77, so=so)(x, scalar=True)
        ref = x.double() @ w.double().T
        assert float((y.double() - ref).abs().max()) <= 1e-6 * float((x.double().abs() @ w.double().abs().T).max())


def test_bad_kind_is_refused():
    so = native.lib()
    w, x, y = torch.zeros(4, 8), torch.zeros(1, 8), torch.zeros(1, 4)
    P = ctypes.c_void_p
    rc = so.lmx_dense_matmul(1, 8, x.data_ptr(), 8, 1, (P * 1)(w.data_ptr()), (ctypes.c_int * 1)(8),
                             (ctypes.c_int64 * 1)(4), (ctypes.c_int64 * 1)(32), None, y.data_ptr(), 4, 0, None, 0.0)
    assert rc == -1
