"""MAX 26.7 names of max.nn: ConvTranspose1d, FusedMLP, MissingLayer and max.nn.state_space (issue 37)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from max import nn
from max.driver import CPU, Buffer
from max.dtype import DType
from max.engine import InferenceSession
from max.graph import BufferType, DeviceRef, Graph, TensorType
from max.nn import state_space as ss

from support import run_graph, tt
from support import test_device_ref as dev_ref

F64 = DType.float64
CPU_REF = DeviceRef.CPU()


def _load_random(module, rng):
    sd = {k: rng.standard_normal([int(d) for d in w.shape]).astype(w.dtype.to_numpy())
          for k, w in module.raw_state_dict().items()}
    module.load_state_dict(sd)
    return sd


@pytest.mark.parametrize("permute", [False, True])
@pytest.mark.parametrize("stride,padding,dilation,output_padding", [(1, 0, 1, 0), (2, 1, 1, 1), (3, 2, 2, 1)])
def test_conv_transpose1d_matches_torch(permute, stride, padding, dilation, output_padding):
    rng = np.random.default_rng(stride * 10 + padding)
    conv = nn.ConvTranspose1d(4, 3, 5, F64, stride=stride, padding=padding, dilation=dilation,
                              output_padding=output_padding, device=dev_ref(), has_bias=True, permute=permute,
                              name="up")
    sd = _load_random(conv, rng)
    assert list(sd) == ["up.weight", "up.bias"]
    w = sd["up.weight"]
    w_t = w if permute else np.transpose(w, (2, 1, 0))  # (k, out, in) -> torch (in, out, k)
    x = rng.standard_normal((2, 7, 3))
    want = torch.nn.functional.conv_transpose1d(
        torch.from_numpy(x).permute(0, 2, 1), torch.from_numpy(np.ascontiguousarray(w_t)),
        torch.from_numpy(sd["up.bias"]), stride=stride, padding=padding, output_padding=output_padding,
        dilation=dilation).permute(0, 2, 1).numpy()
    (got,) = run_graph(lambda v: conv(v), [tt(F64, [2, 7, 3])], x, weights=conv.state_dict())
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12)


def test_conv_transpose1d_rejects_bad_arguments():
    with pytest.raises(ValueError):
        nn.ConvTranspose1d(3, 2, 2, F64, stride=1, output_padding=1)
    with pytest.raises(ValueError):
        nn.ConvTranspose1d(0, 2, 2, F64)


@pytest.mark.parametrize("act", ["silu", "gelu", "relu"])
def test_fused_mlp_matches_numpy_and_mlp(act):
    rng = np.random.default_rng(3)
    mlp = nn.FusedMLP(F64, None, 6, 10, [dev_ref()], has_bias=True, activation_function=act)
    sd = _load_random(mlp, rng)
    assert sorted(sd) == ["down_proj.bias", "down_proj.weight", "gate_up_proj.bias", "gate_up_proj.weight"]
    x = rng.standard_normal((3, 6))
    gu = x @ sd["gate_up_proj.weight"].T + sd["gate_up_proj.bias"]
    gate, up = gu[:, :10], gu[:, 10:]
    actf = {"silu": lambda v: v / (1 + np.exp(-v)), "relu": lambda v: np.maximum(v, 0),
            "gelu": lambda v: torch.nn.functional.gelu(torch.from_numpy(v)).numpy()}[act]
    want = (actf(gate) * up) @ sd["down_proj.weight"].T + sd["down_proj.bias"]
    (got,) = run_graph(lambda v: mlp(v), [tt(F64, [3, 6])], x, weights=mlp.state_dict())
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12)
    with pytest.raises(ValueError):
        nn.FusedMLP(F64, None, 6, 10, [dev_ref()], activation_function="swish")


def test_missing_layer():
    m = nn.MissingLayer("vision_tower", reason="the checkpoint has no vision weights")
    assert m.raw_state_dict() == {} and "vision_tower" in repr(m)
    with pytest.raises(NotImplementedError, match="vision_tower.*no vision weights"):
        m(1)
    for n in ("ConvTranspose1d", "FusedMLP", "MissingLayer"):
        assert n in nn.__all__


# ----------------------------------------------------------------------------- state_space
def _offsets(lens):
    o = np.zeros(len(lens) + 1, np.uint32)
    np.cumsum(lens, out=o[1:])
    return o


def _run_with_state(build, state, arrays, types):
    with Graph("ss", input_types=[BufferType(DType.from_numpy(state.dtype), state.shape, CPU_REF), *types]) as g:
        st, *rest = g.inputs
        out = build(st.buffer, *[v.tensor for v in rest])
        g.output(*([] if out is None else [out]))
    host = state.copy()
    outs = InferenceSession(devices=[CPU()]).load(g).execute(Buffer.from_numpy(host),
                                                             *[Buffer.from_numpy(a) for a in arrays])
    return [o.to_numpy() for o in outs], host


def _conv_ref(x, w, bias, state, slots, lens, silu):
    y, state, t = np.zeros_like(x), state.copy(), 0
    for b, n in enumerate(lens):
        win = state[slots[b]].copy()
        for _ in range(n):
            full = np.concatenate([win, x[t][:, None]], 1)
            v = (full * w).sum(1) + (0 if bias is None else bias)
            y[t] = v / (1 + np.exp(-v)) if silu else v
            win, t = full[:, 1:], t + 1
        state[slots[b]] = win
    return y, state


def test_causal_conv1d_varlen_fwd_channels_first():
    rng = np.random.default_rng(5)
    lens, C, K = [3, 0, 4], 5, 4
    T = sum(lens)
    x, w, bias = rng.standard_normal((T, C)), rng.standard_normal((C, K)), rng.standard_normal(C)
    state, slots = rng.standard_normal((4, C, K - 1)), np.array([2, 0, 3], np.int64)
    (y,), st = _run_with_state(
        lambda s, xt, wt, bt, sl, of: ss.causal_conv1d_varlen_fwd(xt, wt, s, sl, of, bias=bt),
        state, [np.ascontiguousarray(x.T), w, bias, slots, _offsets(lens)],
        [TensorType(F64, [C, T], CPU_REF), TensorType(F64, [C, K], CPU_REF), TensorType(F64, [C], CPU_REF),
         TensorType(DType.int64, [3], CPU_REF), TensorType(DType.uint32, [4], CPU_REF)])
    want, want_state = _conv_ref(x, w, bias, state, slots, lens, silu=True)
    np.testing.assert_allclose(y, want.T, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(st, want_state, rtol=1e-12)


def test_short_conv_ring_tokens_first_no_activation():
    rng = np.random.default_rng(6)
    lens, C, K = [1, 2], 3, 3
    T = sum(lens)
    x, w = rng.standard_normal((T, C)), rng.standard_normal((C, K))
    state, slots = rng.standard_normal((2, C, K - 1)), np.array([1, 0], np.int64)
    (y,), st = _run_with_state(
        lambda s, xt, wt, sl, of: ss.short_conv_ring(xt, wt, s, sl, of), state, [x, w, slots, _offsets(lens)],
        [TensorType(F64, [T, C], CPU_REF), TensorType(F64, [C, K], CPU_REF), TensorType(DType.int64, [2], CPU_REF),
         TensorType(DType.uint32, [3], CPU_REF)])
    want, want_state = _conv_ref(x, w, None, state, slots, lens, silu=False)
    np.testing.assert_allclose(y, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(st, want_state, rtol=1e-12)


def test_gated_delta_recurrence_fwd_matches_recurrence():
    rng = np.random.default_rng(7)
    lens, H, K, V = [2, 3], 2, 4, 3
    T = sum(lens)
    q, k = rng.standard_normal((T, H, K)) * 0.5, rng.standard_normal((T, H, K)) * 0.5
    v = rng.standard_normal((T, H, V))
    g, beta = -np.abs(rng.standard_normal((T, H))) * 0.3, rng.uniform(0, 1, (T, H))
    state, slots = rng.standard_normal((3, H, K, V)) * 0.1, np.array([2, 0], np.int64)
    (o,), st = _run_with_state(
        lambda s, *a: ss.gated_delta_recurrence_fwd(*a[:5], s, a[5], a[6], chunk_size=2), state,
        [q, k, v, g, beta, slots, _offsets(lens)],
        [TensorType(F64, [T, H, K], CPU_REF), TensorType(F64, [T, H, K], CPU_REF), TensorType(F64, [T, H, V], CPU_REF),
         TensorType(F64, [T, H], CPU_REF), TensorType(F64, [T, H], CPU_REF), TensorType(DType.int64, [2], CPU_REF),
         TensorType(DType.uint32, [3], CPU_REF)])
    want, S_all, t = np.zeros_like(v), state.copy(), 0
    for b, n in enumerate(lens):
        S = S_all[slots[b]].copy()
        for _ in range(n):
            for h in range(H):
                S[h] *= np.exp(g[t, h])
                S[h] += np.outer(k[t, h], beta[t, h] * (v[t, h] - S[h].T @ k[t, h]))
                want[t, h] = S[h].T @ q[t, h]
            t += 1
        S_all[slots[b]] = S
    np.testing.assert_allclose(o, want, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(st, S_all, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("into_buffer", [False, True])
def test_mamba2_ssd_chunk_scan_varlen_fwd_inplace(into_buffer):
    rng = np.random.default_rng(8)
    lens, H, P, G, N = [3, 2], 4, 2, 2, 3
    T = sum(lens)
    x, dt = rng.standard_normal((T, H, P)), rng.uniform(0.1, 0.5, (T, H))
    A, B, C, D = -rng.uniform(0.5, 1.5, H), rng.standard_normal((T, G, N)), rng.standard_normal((T, G, N)), \
        rng.standard_normal(H)
    state, slots = rng.standard_normal((2, H, P, N)) * 0.1, np.array([1, 0], np.int64)
    types = [TensorType(F64, [T, H, P], CPU_REF), TensorType(F64, [T, H], CPU_REF), TensorType(F64, [H], CPU_REF),
             TensorType(F64, [T, G, N], CPU_REF), TensorType(F64, [T, G, N], CPU_REF), TensorType(F64, [H], CPU_REF),
             TensorType(DType.int64, [2], CPU_REF), TensorType(DType.uint32, [3], CPU_REF)]
    arrays = [x, dt, A, B, C, D, slots, _offsets(lens)]
    if into_buffer:
        out_host = np.zeros((T, H, P))
        with Graph("ssd", input_types=[BufferType(F64, state.shape, CPU_REF), BufferType(F64, [T, H, P], CPU_REF),
                                       *types]) as gr:
            st_b, out_b, *rest = gr.inputs
            r = [v.tensor for v in rest]
            assert ss.mamba2_ssd_chunk_scan_varlen_fwd_inplace(*r[:5], st_b.buffer, r[6], r[7], D=r[5],
                                                               chunk_size=2, out=out_b.buffer) is None
            gr.output()
        st = state.copy()
        InferenceSession(devices=[CPU()]).load(gr).execute(Buffer.from_numpy(st), Buffer.from_numpy(out_host),
                                                           *[Buffer.from_numpy(a) for a in arrays])
        y = out_host
    else:
        (y,), st = _run_with_state(
            lambda s, *a: ss.mamba2_ssd_chunk_scan_varlen_fwd_inplace(*a[:5], s, a[6], a[7], D=a[5], chunk_size=2),
            state, arrays, types)
    want, S_all, t = np.zeros_like(x), state.copy(), 0
    for b, n in enumerate(lens):
        h = S_all[slots[b]].copy()
        for _ in range(n):
            for hh in range(H):
                gi = hh // (H // G)
                h[hh] = np.exp(dt[t, hh] * A[hh]) * h[hh] + dt[t, hh] * np.outer(x[t, hh], B[t, gi])
                want[t, hh] = h[hh] @ C[t, gi] + D[hh] * x[t, hh]
            t += 1
        S_all[slots[b]] = h
    np.testing.assert_allclose(y, want, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(st, S_all, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("norm_before_gate", [False, True])
def test_gated_group_rmsnorm(norm_before_gate):
    rng = np.random.default_rng(9)
    x, z, w = (rng.standard_normal(s).astype(np.float32) for s in ((3, 8), (3, 8), (8,)))
    (got,) = run_graph(lambda a, b, c: ss.gated_group_rmsnorm(a, b, c, 1e-5, num_groups=2,
                                                              norm_before_gate=norm_before_gate),
                       [TensorType(DType.float32, s, CPU_REF) for s in ((3, 8), (3, 8), (8,))], x, z, w)
    x64, z64 = x.astype(np.float64), z.astype(np.float64)
    silu = z64 / (1 + np.exp(-z64))

    def rms(v):
        g = v.reshape(3, 2, 4)
        return (g / np.sqrt((g ** 2).mean(-1, keepdims=True) + 1e-5)).reshape(3, 8)

    want = (rms(x64) * silu if norm_before_gate else rms(x64 * silu)) * w
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert set(ss.__all__) == {"causal_conv1d_varlen_fwd", "gated_delta_recurrence_fwd", "gated_group_rmsnorm",
                               "mamba2_ssd_chunk_scan_varlen_fwd_inplace", "short_conv_ring"}
