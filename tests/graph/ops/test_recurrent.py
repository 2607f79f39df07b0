"""causal_conv1d, selective_scan and gated_delta_rule against float64 token-by-token numpy references:
ragged batches (empty, one-token and multi-chunk requests), per-request state slots read and written
back, other slots untouched; build-time errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from max.driver import Buffer
from max.dtype import DType
from max.graph import BufferType, DeviceRef, Graph, TensorType, ops
from support import session, isa_params

CPU = DeviceRef.CPU()


def _tt(dt: DType, shape) -> TensorType:
    return TensorType(dt, shape, CPU)


def _batch(data, n_slots: int, decode: bool) -> tuple[list[int], np.ndarray, np.ndarray]:
    """(lengths, offsets uint32 [B+1], distinct slots int64 [B])."""
    n = data.draw(st.integers(1, min(4, n_slots)))
    lens = [1] * n if decode else data.draw(st.lists(st.integers(0, 11), min_size=n, max_size=n))
    slots = np.array(data.draw(st.permutations(range(n_slots)))[:n], np.int64)
    offs = np.zeros(n + 1, np.uint32)
    np.cumsum(lens, out=offs[1:])
    return lens, offs, slots


def _run(build, types, arrays, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Run a one-op graph whose first input is the state buffer; returns (output, state after)."""
    with Graph("recurrent", input_types=[BufferType(DType.from_numpy(state.dtype), state.shape, CPU), *types]) as g:
        st_buf, *rest = g.inputs
        g.output(build(st_buf.buffer, *[v.tensor for v in rest]))
    host = state.copy()
    (out,) = session().load(g).execute(Buffer.from_numpy(host), *[Buffer.from_numpy(a) for a in arrays])
    return out.to_numpy(), host


def _tol(dt: DType) -> float:
    return 1e-9 if dt is DType.float64 else 2e-4


DTYPES = st.sampled_from([DType.float32, DType.float64])


# ---------------------------------------------------------------- conv1d
def conv_ref(x, w, bias, state, slots, lens, silu):
    x, w, state = (a.astype(np.float64) for a in (x, w, state))
    y = np.zeros_like(x)
    t = 0
    K = w.shape[1]
    for b, n in enumerate(lens):
        win = state[slots[b]].copy()  # [C, K-1]
        for _ in range(n):
            full = np.concatenate([win, x[t][:, None]], 1)  # [C, K]
            v = (full * w).sum(1) + (bias if bias is not None else 0)
            y[t] = v / (1 + np.exp(-v)) if silu else v
            win = full[:, 1:]
            t += 1
        state[slots[b]] = win
    return y, state


@settings(deadline=None, max_examples=40)
@given(data=st.data(), seed=st.integers(0, 2**16), dt=DTYPES)
def test_causal_conv1d_matches_reference(data, seed, dt):
    rng = np.random.default_rng(seed)
    C, K, S = data.draw(st.integers(1, 9)), data.draw(st.integers(1, 5)), data.draw(st.integers(1, 5))
    lens, offs, slots = _batch(data, S, data.draw(st.booleans()))
    has_bias, silu = data.draw(st.booleans()), data.draw(st.booleans())
    npd = dt.to_numpy()
    x = rng.standard_normal((sum(lens), C)).astype(npd)
    w = rng.standard_normal((C, K)).astype(npd)
    bias = rng.standard_normal(C).astype(npd) if has_bias else None
    state = rng.standard_normal((S, C, K - 1)).astype(npd)
    types = [_tt(dt, ["T", C]), _tt(dt, [C, K]), _tt(DType.int64, ["B"]), _tt(DType.uint32, ["B1"])]
    arrays = [x, w, slots, offs]
    if has_bias:
        types.append(_tt(dt, [C]))
        arrays.append(bias)

    def build(s, xv, wv, sl, of, *b):
        return ops.causal_conv1d(xv, wv, s, sl, of, bias=b[0] if b else None, activation="silu" if silu else None)

    y, after = _run(build, types, arrays, state)
    ry, rs = conv_ref(x, w, bias, state, slots, lens, silu)
    assert y.dtype == npd and y.shape == ry.shape
    np.testing.assert_allclose(y, ry, rtol=_tol(dt), atol=_tol(dt))
    np.testing.assert_allclose(after, rs, rtol=_tol(dt), atol=_tol(dt))


# ---------------------------------------------------------------- SSD scan
def softplus_ref(x):
    x = np.asarray(x, np.float64)
    return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0)


def step_size_ref(dt, dt_bias, limit):
    """Mamba-2's step size from the raw projection: clamp(softplus(dt + dt_bias), *limit), float64."""
    d = np.asarray(dt, np.float64) + (0 if dt_bias is None else np.asarray(dt_bias, np.float64))
    return np.clip(softplus_ref(d), limit[0], limit[1])


def ssd_ref(x, dt, A, B, C, D, state, slots, lens):
    x, dt, A, B, C, state = (a.astype(np.float64) for a in (x, dt, A, B, C, state))
    H, G = x.shape[1], B.shape[1]
    y = np.zeros_like(x)
    t = 0
    for b, n in enumerate(lens):
        h = state[slots[b]].copy()  # [H, P, N]
        for _ in range(n):
            for hh in range(H):
                gi = hh // (H // G)
                h[hh] = np.exp(dt[t, hh] * A[hh]) * h[hh] + dt[t, hh] * np.outer(x[t, hh], B[t, gi])
                y[t, hh] = h[hh] @ C[t, gi] + (D[hh] * x[t, hh] if D is not None else 0)
            t += 1
        state[slots[b]] = h
    return y, state


@settings(deadline=None, max_examples=40)
@given(data=st.data(), seed=st.integers(0, 2**16), dtype=DTYPES)
def test_selective_scan_matches_reference(data, seed, dtype):
    rng = np.random.default_rng(seed)
    G = data.draw(st.integers(1, 2))
    H = G * data.draw(st.integers(1, 3))
    P, N, S = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 5)), data.draw(st.integers(1, 4))
    chunk = data.draw(st.integers(1, 8))
    lens, offs, slots = _batch(data, S, data.draw(st.booleans()))
    has_d = data.draw(st.booleans())
    raw = data.draw(st.sampled_from([None, "softplus", "bias", "bias+limit"]))  # the op takes softplus(dt + bias)
    npd = dtype.to_numpy()
    T = sum(lens)
    x = rng.standard_normal((T, H, P)).astype(npd)
    dt = (rng.uniform(0.01, 1.0, (T, H)) if raw is None else 2 * rng.standard_normal((T, H))).astype(npd)
    dt_bias = rng.standard_normal(H).astype(npd) if raw and raw.startswith("bias") else None
    limit = (0.1, 0.9) if raw == "bias+limit" else (0.0, float("inf"))
    A = -rng.uniform(0.1, 2.0, H).astype(npd)
    B = rng.standard_normal((T, G, N)).astype(npd)
    C = rng.standard_normal((T, G, N)).astype(npd)
    D = rng.standard_normal(H).astype(npd) if has_d else None
    state = rng.standard_normal((S, H, P, N)).astype(npd)
    types = [_tt(dtype, ["T", H, P]), _tt(dtype, ["T", H]), _tt(dtype, [H]), _tt(dtype, ["T", G, N]),
             _tt(dtype, ["T", G, N]), _tt(DType.int64, ["B"]), _tt(DType.uint32, ["B1"])]
    arrays = [x, dt, A, B, C, slots, offs]
    if has_d:
        types.append(_tt(dtype, [H]))
        arrays.append(D)
    if dt_bias is not None:
        types.append(_tt(dtype, [H]))
        arrays.append(dt_bias)

    def build(s, xv, dv, av, bv, cv, sl, of, *rest):
        return ops.selective_scan(xv, dv, av, bv, cv, s, sl, of, D=rest[0] if has_d else None, chunk_size=chunk,
                                  dt_bias=rest[-1] if dt_bias is not None else None, dt_softplus=raw == "softplus",
                                  dt_limit=limit)

    y, after = _run(build, types, arrays, state)
    ry, rs = ssd_ref(x, step_size_ref(dt, dt_bias, limit) if raw else dt, A, B, C, D, state, slots, lens)
    tol = _tol(dtype) * 10
    np.testing.assert_allclose(y, ry, rtol=tol, atol=tol)
    np.testing.assert_allclose(after, rs, rtol=tol, atol=tol)


# ---------------------------------------------------------------- gated delta rule
def gdr_prepare_ref(q, k, a, b, A, dt_bias, scale):
    """Qwen3-Next's gating in float64: q/k L2-normalised (q scaled) and repeated over the value heads,
    g = A softplus(a + dt_bias), beta = sigmoid(b)."""
    q, k, a, b, A = (np.asarray(t, np.float64) for t in (q, k, a, b, A))
    H = a.shape[1]
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) * scale
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    q, k = np.repeat(q, H // q.shape[1], axis=1), np.repeat(k, H // k.shape[1], axis=1)
    g = A * softplus_ref(a + (0 if dt_bias is None else np.asarray(dt_bias, np.float64)))
    return q, k, g, 1 / (1 + np.exp(-b))


def gdr_ref(q, k, v, g, beta, state, slots, lens):
    q, k, v, g, beta, state = (a.astype(np.float64) for a in (q, k, v, g, beta, state))
    o = np.zeros_like(v)
    t = 0
    for b, n in enumerate(lens):
        S = state[slots[b]].copy()  # [H, K, V]
        for _ in range(n):
            for h in range(q.shape[1]):
                S[h] *= np.exp(g[t, h])
                delta = beta[t, h] * (v[t, h] - S[h].T @ k[t, h])
                S[h] += np.outer(k[t, h], delta)
                o[t, h] = S[h].T @ q[t, h]
            t += 1
        state[slots[b]] = S
    return o, state


@settings(deadline=None, max_examples=40)
@given(data=st.data(), seed=st.integers(0, 2**16), dtype=DTYPES)
def test_gated_delta_rule_matches_reference(data, seed, dtype):
    rng = np.random.default_rng(seed)
    H, Kd, Vd, S = (data.draw(st.integers(1, n)) for n in (3, 6, 5, 4))
    chunk = data.draw(st.integers(1, 8))
    lens, offs, slots = _batch(data, S, data.draw(st.booleans()))
    npd = dtype.to_numpy()
    T = sum(lens)
    q = rng.standard_normal((T, H, Kd))
    k = rng.standard_normal((T, H, Kd))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)  # the models L2-normalise keys
    v = rng.standard_normal((T, H, Vd))
    g = -rng.uniform(0.0, 2.0, (T, H))
    beta = rng.uniform(0.0, 1.0, (T, H))
    state = rng.standard_normal((S, H, Kd, Vd))
    q, k, v, g, beta, state = (a.astype(npd) for a in (q, k, v, g, beta, state))
    types = [_tt(dtype, ["T", H, Kd]), _tt(dtype, ["T", H, Kd]), _tt(dtype, ["T", H, Vd]), _tt(dtype, ["T", H]),
             _tt(dtype, ["T", H]), _tt(DType.int64, ["B"]), _tt(DType.uint32, ["B1"])]

    def build(s, qv, kv, vv, gv, bv, sl, of):
        return ops.gated_delta_rule(qv, kv, vv, gv, bv, s, sl, of, chunk_size=chunk)

    o, after = _run(build, types, [q, k, v, g, beta, slots, offs], state)
    ro, rs = gdr_ref(q, k, v, g, beta, state, slots, lens)
    tol = _tol(dtype) * 10
    np.testing.assert_allclose(o, ro, rtol=tol, atol=tol)
    np.testing.assert_allclose(after, rs, rtol=tol, atol=tol)


@settings(deadline=None, max_examples=40)
@given(data=st.data(), seed=st.integers(0, 2**16), dtype=DTYPES)
def test_gated_delta_rule_prepares_its_inputs(data, seed, dtype):
    """qk_l2norm / scale / grouped q-k heads / A, dt_bias / beta_sigmoid: the same as preparing the inputs in
    float64 and running the plain rule."""
    rng = np.random.default_rng(seed)
    Hk = data.draw(st.integers(1, 2))
    H = Hk * data.draw(st.integers(1, 3))
    Kd, Vd, S = (data.draw(st.integers(1, n)) for n in (6, 5, 4))
    chunk = data.draw(st.integers(1, 8))
    lens, offs, slots = _batch(data, S, data.draw(st.booleans()))
    has_bias = data.draw(st.booleans())
    npd = dtype.to_numpy()
    T = sum(lens)
    q, k = rng.standard_normal((T, Hk, Kd)), rng.standard_normal((T, Hk, Kd))
    v, a, b = rng.standard_normal((T, H, Vd)), 2 * rng.standard_normal((T, H)), 2 * rng.standard_normal((T, H))
    A, dt_bias = -rng.uniform(0.1, 2.0, H), rng.standard_normal(H) if has_bias else None
    state = rng.standard_normal((S, H, Kd, Vd))
    q, k, v, a, b, A, state = (t.astype(npd) for t in (q, k, v, a, b, A, state))
    scale = float(Kd) ** -0.5
    types = [_tt(dtype, ["T", Hk, Kd]), _tt(dtype, ["T", Hk, Kd]), _tt(dtype, ["T", H, Vd]), _tt(dtype, ["T", H]),
             _tt(dtype, ["T", H]), _tt(DType.int64, ["B"]), _tt(DType.uint32, ["B1"]), _tt(dtype, [H])]
    arrays = [q, k, v, a, b, slots, offs, A]
    if has_bias:
        types.append(_tt(dtype, [H]))
        arrays.append(dt_bias.astype(npd))

    def build(s, qv, kv, vv, av, bv, sl, of, Av, *db):
        return ops.gated_delta_rule(qv, kv, vv, av, bv, s, sl, of, chunk_size=chunk, A=Av,
                                    dt_bias=db[0] if db else None, beta_sigmoid=True, qk_l2norm=True, scale=scale)

    o, after = _run(build, types, arrays, state)
    rq, rk, rg, rb = gdr_prepare_ref(q, k, a, b, A, dt_bias, scale)
    ro, rs = gdr_ref(rq, rk, v, rg, rb, state, slots, lens)
    tol = _tol(dtype) * 10
    np.testing.assert_allclose(o, ro, rtol=tol, atol=tol)
    np.testing.assert_allclose(after, rs, rtol=tol, atol=tol)


def test_prompt_split_over_calls_equals_one_call():
    """Chunked prefill: the state a first call leaves in the slot carries the second call on."""
    rng = np.random.default_rng(3)
    H, P, N, T = 2, 3, 4, 13
    x, B, C = rng.standard_normal((T, H, P)), rng.standard_normal((T, 1, N)), rng.standard_normal((T, 1, N))
    dt, A = rng.uniform(0.1, 1, (T, H)), -rng.uniform(0.5, 1, H)
    types = [_tt(DType.float64, s) for s in (["T", H, P], ["T", H], [H], ["T", 1, N], ["T", 1, N])]
    types += [_tt(DType.int64, ["B"]), _tt(DType.uint32, ["B1"])]

    def build(s, *a):
        return ops.selective_scan(*a[:5], s, *a[5:], chunk_size=4)

    zero = np.zeros((2, H, P, N))
    slot = np.array([1], np.int64)
    whole, s_whole = _run(build, types, [x, dt, A, B, C, slot, np.array([0, T], np.uint32)], zero)
    first, s1 = _run(build, types, [x[:5], dt[:5], A, B[:5], C[:5], slot, np.array([0, 5], np.uint32)], zero)
    second, s2 = _run(build, types, [x[5:], dt[5:], A, B[5:], C[5:], slot, np.array([0, T - 5], np.uint32)], s1)
    np.testing.assert_allclose(np.concatenate([first, second]), whole, atol=1e-12)
    np.testing.assert_allclose(s2, s_whole, atol=1e-12)
    assert not s2[0].any()  # the other slot is untouched


def _build_err(types, fn, exc, match):
    with pytest.raises(exc, match=match):
        with Graph("e", input_types=types) as g:
            fn(*[v.buffer if isinstance(t, BufferType) else v.tensor for v, t in zip(g.inputs, types)])


def test_build_time_errors():
    f32, i64 = DType.float32, DType.int64
    buf3 = BufferType(f32, [4, 8, 2], CPU)
    base = [_tt(f32, ["T", 8]), _tt(f32, [8, 3]), buf3, _tt(i64, ["B"]), _tt(DType.uint32, ["B1"])]
    _build_err(base, lambda x, w, s, sl, of: ops.causal_conv1d(x, w, ops.buffer_load(s), sl, of), TypeError,
               "state must be a BufferValue")
    _build_err(base[:2] + [BufferType(f32, [4, 8, 3], CPU)] + base[3:], ops.causal_conv1d, ValueError,
               "state window vs kernel_size - 1")
    _build_err([_tt(f32, ["T", 7])] + base[1:], ops.causal_conv1d, ValueError, "weight channels vs x channels")
    _build_err(base, lambda x, w, s, sl, of: ops.causal_conv1d(x, w, s, sl, of, activation="gelu"), ValueError,
               "activation must be")
    _build_err(base[:3] + [_tt(f32, ["B"]), base[4]], ops.causal_conv1d, TypeError, "slots must be a 1-D integer")
    ssd = [_tt(f32, ["T", 3, 2]), _tt(f32, ["T", 3]), _tt(f32, [3]), _tt(f32, ["T", 2, 4]), _tt(f32, ["T", 2, 4]),
           BufferType(f32, [2, 3, 2, 4], CPU), _tt(i64, ["B"]), _tt(DType.uint32, ["B1"])]
    _build_err(ssd, ops.selective_scan, ValueError, "multiple of the B/C groups")
    gdr = [_tt(f32, ["T", 2, 4]), _tt(f32, ["T", 2, 4]), _tt(f32, ["T", 2, 3]), _tt(f32, ["T", 2]),
           _tt(f32, ["T", 2]), BufferType(f32, [2, 2, 4, 5], CPU), _tt(i64, ["B"]), _tt(DType.uint32, ["B1"])]
    _build_err(gdr, ops.gated_delta_rule, ValueError, "state value dim")
    gqa = [_tt(f32, ["T", 2, 4]), _tt(f32, ["T", 2, 4]), _tt(f32, ["T", 3, 5]), _tt(f32, ["T", 3]),
           _tt(f32, ["T", 3]), BufferType(f32, [2, 3, 4, 5], CPU), _tt(i64, ["B"]), _tt(DType.uint32, ["B1"])]
    _build_err(gqa, ops.gated_delta_rule, ValueError, "multiple of the q/k heads")
    _build_err(gdr[:5] + [BufferType(f32, [2, 2, 4, 3], CPU)] + gdr[6:] + [_tt(f32, [2])],
               lambda *a: ops.gated_delta_rule(*a[:8], dt_bias=a[8]), ValueError, "give A too")
    _build_err(ssd[:3] + [_tt(f32, ["T", 1, 4]), _tt(f32, ["T", 1, 4])] + ssd[5:],
               lambda *a: ops.selective_scan(*a, dt_limit=(0.1, 1.0)), ValueError, "give dt_bias or dt_softplus")
    _build_err(ssd[:3] + [_tt(f32, ["T", 1, 4]), _tt(f32, ["T", 1, 4])] + ssd[5:],
               lambda *a: ops.selective_scan(*a, dt_softplus=True, dt_limit=(1.0, 0.1)), ValueError, "low <= high")


def test_run_time_slot_errors():
    x = np.zeros((2, 3), np.float32)
    types = [_tt(DType.float32, ["T", 3]), _tt(DType.float32, [3, 2]), _tt(DType.int64, ["B"]),
             _tt(DType.uint32, ["B1"])]
    state = np.zeros((2, 3, 1), np.float32)
    with pytest.raises(Exception, match="share a state slot"):
        _run(lambda s, *a: ops.causal_conv1d(a[0], a[1], s, a[2], a[3]), types,
             [x, np.ones((3, 2), np.float32), np.array([1, 1], np.int64), np.array([0, 1, 2], np.uint32)], state)
    with pytest.raises(Exception, match="out of range"):
        _run(lambda s, *a: ops.causal_conv1d(a[0], a[1], s, a[2], a[3]), types,
             [x, np.ones((3, 2), np.float32), np.array([2], np.int64), np.array([0, 2], np.uint32)], state)


# ---------------------------------------------------------------- native decode kernels, every ISA variant


@pytest.mark.parametrize("isa", isa_params())
def test_native_decode_kernels_match_reference(isa):
    """lmx_conv1d_decode / lmx_ssd_decode / lmx_gdr_decode (one token per request, slots updated in place)
    against the float64 sequential references, in every ISA variant this CPU runs."""
    from max.engine import native

    so = native.lib(isa)
    rng = np.random.default_rng(7)
    slots = np.array([4, 0, 2], np.int64)
    B, S = 3, 5
    lens = [1] * B
    f32 = np.float32
    # conv: 19 channels, kernel 4, silu and bias
    x, w, b = rng.standard_normal((B, 19)).astype(f32), rng.standard_normal((19, 4)).astype(f32), \
        rng.standard_normal(19).astype(f32)
    st0 = rng.standard_normal((S, 19, 3)).astype(f32)
    st1, y = st0.copy(), np.empty((B, 19), f32)
    assert so.lmx_conv1d_decode(B, 19, 4, x.ctypes.data, 19, w.ctypes.data, b.ctypes.data, st1.ctypes.data,
                                slots.ctypes.data, 19 * 3, 1, y.ctypes.data) == 0
    ry, rs = conv_ref(x, w, b, st0, slots, lens, True)
    np.testing.assert_allclose(y, ry, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(st1, rs, rtol=1e-6, atol=1e-6)
    # SSD: 4 heads in 2 groups, head_dim 5, state 19 (a tail after the 8-wide partial sums)
    H, P, G, N = 4, 5, 2, 19
    x = rng.standard_normal((B, H, P)).astype(f32)
    dt, A = rng.uniform(0.05, 1, (B, H)).astype(f32), -rng.uniform(0.1, 2, H).astype(f32)
    Bm, Cm, D = (rng.standard_normal(s).astype(f32) for s in ((B, G, N), (B, G, N), H))
    st0 = rng.standard_normal((S, H, P, N)).astype(f32)
    st1, y = st0.copy(), np.empty((B, H, P), f32)
    assert so.lmx_ssd_decode(B, H, P, G, N, x.ctypes.data, H * P, dt.ctypes.data, H, A.ctypes.data, Bm.ctypes.data,
                             Cm.ctypes.data, G * N, D.ctypes.data, None, 0, 0.0, 0.0, st1.ctypes.data,
                             slots.ctypes.data, H * P * N, y.ctypes.data) == 0
    ry, rs = ssd_ref(x, dt, A, Bm, Cm, D, st0, slots, lens)
    np.testing.assert_allclose(y, ry, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(st1, rs, rtol=1e-5, atol=1e-5)
    # gated delta rule: 3 heads, K 6, V 11
    H, K, V = 3, 6, 11
    q = rng.standard_normal((B, H, K)).astype(f32)
    k = rng.standard_normal((B, H, K))
    k = (k / np.linalg.norm(k, axis=-1, keepdims=True)).astype(f32)
    v = rng.standard_normal((B, H, V)).astype(f32)
    g, beta = -rng.uniform(0, 2, (B, H)).astype(f32), rng.uniform(0, 1, (B, H)).astype(f32)
    st0 = rng.standard_normal((S, H, K, V)).astype(f32)
    st1, o = st0.copy(), np.empty((B, H, V), f32)
    assert so.lmx_gdr_decode(B, H, H, K, V, q.ctypes.data, H * K, k.ctypes.data, H * K, v.ctypes.data, H * V,
                             g.ctypes.data, beta.ctypes.data, H, None, None, 0, 0, 1.0, st1.ctypes.data,
                             slots.ctypes.data, H * K * V, o.ctypes.data) == 0
    ro, rs = gdr_ref(q, k, v, g, beta, st0, slots, lens)
    np.testing.assert_allclose(o, ro, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(st1, rs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("isa", isa_params())
@settings(deadline=None, max_examples=15)
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_native_decode_kernels_prepare_their_inputs(isa, data, seed):
    """The in-kernel preparation of lmx_ssd_decode (softplus(dt + dt_bias), clamped) and lmx_gdr_decode
    (L2-normalised, scaled, grouped q/k; A softplus(a + dt_bias); sigmoid(b)), over row-strided inputs (column
    slices of a wider matrix, as the models pass them), against the float64 references, every ISA variant."""
    from max.engine import native

    so = native.lib(isa)
    rng = np.random.default_rng(seed)
    f32 = np.float32
    S = 5
    B = data.draw(st.integers(1, 4))
    slots = np.array(data.draw(st.permutations(range(S)))[:B], np.int64)
    lens = [1] * B
    pad = data.draw(st.integers(0, 3))  # extra columns: the row stride exceeds the row
    # SSD
    G = data.draw(st.integers(1, 2))
    H, P, N = G * data.draw(st.integers(1, 3)), data.draw(st.integers(1, 6)), data.draw(st.integers(1, 20))
    wide = rng.standard_normal((B, H * P + 2 * G * N + H + pad)).astype(f32)  # x | B | C | dt (| pad)
    x = wide[:, :H * P].reshape(B, H, P)
    Bm = wide[:, H * P:H * P + G * N].reshape(B, G, N)
    Cm = wide[:, H * P + G * N:H * P + 2 * G * N].reshape(B, G, N)
    dt = wide[:, H * P + 2 * G * N:H * P + 2 * G * N + H] * 2
    wide[:, H * P + 2 * G * N:H * P + 2 * G * N + H] = dt
    A, D, dtb = -rng.uniform(0.1, 2, H).astype(f32), rng.standard_normal(H).astype(f32), \
        rng.standard_normal(H).astype(f32)
    has_b = data.draw(st.booleans())
    lo, hi = data.draw(st.sampled_from([(0.0, float("inf")), (0.1, 0.9)]))
    st0 = rng.standard_normal((S, H, P, N)).astype(f32)
    st1, y = st0.copy(), np.empty((B, H, P), f32)
    W = wide.shape[1]
    base = wide.ctypes.data
    assert so.lmx_ssd_decode(B, H, P, G, N, base, W, base + 4 * (H * P + 2 * G * N), W, A.ctypes.data,
                             base + 4 * H * P, base + 4 * (H * P + G * N), W, D.ctypes.data,
                             dtb.ctypes.data if has_b else None, 1, lo, hi, st1.ctypes.data, slots.ctypes.data,
                             H * P * N, y.ctypes.data) == 0
    ry, rs = ssd_ref(x, step_size_ref(dt, dtb if has_b else None, (lo, hi)), A, Bm, Cm, D, st0, slots, lens)
    np.testing.assert_allclose(y, ry, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(st1, rs, rtol=2e-5, atol=2e-5)
    # gated delta rule
    Hk = data.draw(st.integers(1, 2))
    H, K, V = Hk * data.draw(st.integers(1, 3)), data.draw(st.integers(1, 20)), data.draw(st.integers(1, 12))
    wide = rng.standard_normal((B, 2 * Hk * K + H * V + 2 * H + pad)).astype(f32)  # q | k | v | a | b (| pad)
    W, base = wide.shape[1], wide.ctypes.data
    q = wide[:, :Hk * K].reshape(B, Hk, K)
    k = wide[:, Hk * K:2 * Hk * K].reshape(B, Hk, K)
    v = wide[:, 2 * Hk * K:2 * Hk * K + H * V].reshape(B, H, V)
    a = wide[:, 2 * Hk * K + H * V:2 * Hk * K + H * V + H]
    b = wide[:, 2 * Hk * K + H * V + H:2 * Hk * K + H * V + 2 * H]
    A, dtb = -rng.uniform(0.1, 2, H).astype(f32), rng.standard_normal(H).astype(f32)
    scale = float(K) ** -0.5
    st0 = rng.standard_normal((S, H, K, V)).astype(f32)
    st1, o = st0.copy(), np.empty((B, H, V), f32)
    assert so.lmx_gdr_decode(B, H, Hk, K, V, base, W, base + 4 * Hk * K, W, base + 8 * Hk * K, W,
                             base + 4 * (2 * Hk * K + H * V), base + 4 * (2 * Hk * K + H * V + H), W, A.ctypes.data,
                             dtb.ctypes.data if has_b else None, 1, 1, scale, st1.ctypes.data, slots.ctypes.data,
                             H * K * V, o.ctypes.data) == 0
    rq, rk, rg, rb = gdr_prepare_ref(q, k, a, b, A, dtb if has_b else None, scale)
    ro, rs = gdr_ref(rq, rk, v, rg, rb, st0, slots, lens)
    np.testing.assert_allclose(o, ro, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(st1, rs, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("isa", isa_params())
@settings(deadline=None, max_examples=20)
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_native_conv1d_decode_matches_reference(isa, data, seed):
    """lmx_conv1d_decode over any kernel size (the 4-tap form and the loop), channel counts around the
    vector widths (SiLU's vector body and tail), row-strided x, large |y| (SiLU's saturation), every ISA."""
    from max.engine import native

    so = native.lib(isa)
    rng = np.random.default_rng(seed)
    f32 = np.float32
    S = 4
    B = data.draw(st.integers(1, 4))
    slots = np.array(data.draw(st.permutations(range(S)))[:B], np.int64)
    C, K = data.draw(st.integers(1, 40)), data.draw(st.integers(1, 5))
    pad, silu, has_bias = data.draw(st.integers(0, 3)), data.draw(st.booleans()), data.draw(st.booleans())
    wide = (rng.standard_normal((B, C + pad)) * data.draw(st.sampled_from([1.0, 60.0]))).astype(f32)
    x = wide[:, :C]
    w, bias = rng.standard_normal((C, K)).astype(f32), rng.standard_normal(C).astype(f32)
    st0 = rng.standard_normal((S, C, K - 1)).astype(f32)
    st1, y = st0.copy(), np.empty((B, C), f32)
    assert so.lmx_conv1d_decode(B, C, K, wide.ctypes.data, C + pad, w.ctypes.data,
                                bias.ctypes.data if has_bias else None, st1.ctypes.data, slots.ctypes.data,
                                C * (K - 1), int(silu), y.ctypes.data) == 0
    ry, rs = conv_ref(x, w, bias if has_bias else None, st0, slots, [1] * B, silu)
    np.testing.assert_allclose(y, ry, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(st1, rs.astype(f32))  # the window only moves values


def test_a_steps_layout_is_worked_out_once_for_all_its_layers():
    """Every recurrent layer of a step passes the same slots/offsets tensors: the layout (and its checks)
    is reused while they are unchanged, and worked out again for new tensors or after an in-place change."""
    import torch

    from max.engine.kernels import recurrent as rk

    slots = torch.tensor([2, 0], dtype=torch.uint32)
    offsets = torch.tensor([0, 1, 4], dtype=torch.uint32)
    first = rk._layout("causal_conv1d", slots, offsets, 4, 4)
    assert rk._layout("selective_scan", slots, offsets, 4, 4) is first
    assert first[1][1].tolist() == [2] and first[2] == [(1, 4, 0)]
    offsets[1] = 3  # same tensor, new values: a new layout
    again = rk._layout("causal_conv1d", slots, offsets, 4, 4)
    assert again is not first and again[2] == [(0, 3, 2)]
    with pytest.raises(ValueError, match="share a state slot"):
        rk._layout("causal_conv1d", torch.tensor([1, 1], dtype=torch.uint32), offsets, 4, 4)
