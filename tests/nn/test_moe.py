"""max.nn.MoE / MoEGate and their ops (moe_route, moe_experts_ffn) against a float64 numpy reference; the
routed experts both through the native few-token kernel (lmx_moe_ffn, every ISA variant) and the grouped
matmuls of longer batches."""

from __future__ import annotations

import numpy as np
import pytest

from max.dtype import DType
from max.graph import DeviceRef, TensorType, ops
from max.nn import MLP, MoE, MoEGate
from max.nn.moe import moe_experts_ffn, moe_route
from support import run_graph, isa_params

E, H, I, K, T = 6, 16, 12, 2, 9


def _ref_route(logits, k, routing, renormalize, scaling, n_group=1, topk_group=1):
    lg = logits.astype(np.float64)
    if routing == "topk_softmax":
        ids = np.argsort(-lg, axis=1, kind="stable")[:, :k]
        v = np.take_along_axis(lg, ids, 1)
        w = np.exp(v - v.max(1, keepdims=True))
        w /= w.sum(1, keepdims=True)
    else:
        p = np.exp(lg - lg.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        sel = p.copy()
        if n_group > 1:
            g = p.reshape(len(p), n_group, -1).max(-1)
            keep = np.argsort(-g, 1, kind="stable")[:, :topk_group]
            mask = np.zeros_like(g, bool)
            np.put_along_axis(mask, keep, True, 1)
            sel = np.where(np.repeat(mask, p.shape[1] // n_group, 1), p, 0.0)
        ids = np.argsort(-sel, axis=1, kind="stable")[:, :k]
        w = np.take_along_axis(sel, ids, 1)
        if renormalize:
            w /= w.sum(1, keepdims=True)
    return ids, w * scaling


def _ref_ffn(x, ids, w, g, u, d, act="silu", alpha=1.702, limit=7.0, biases=(None, None, None)):
    from math import erf

    gb, ub, db = biases
    out = np.zeros_like(x, dtype=np.float64)
    for t in range(len(x)):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            a, b = g[e] @ x[t], u[e] @ x[t]
            a, b = a + (gb[e] if gb is not None else 0), b + (ub[e] if ub is not None else 0)
            if act == "silu":
                h = a / (1 + np.exp(-a)) * b
            elif act == "gelu_tanh":
                h = 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a ** 3))) * b
            elif act == "gelu":
                h = 0.5 * a * (1 + np.vectorize(erf)(a / np.sqrt(2))) * b
            else:
                a, b = np.minimum(a, limit), np.clip(b, -limit, limit)
                h = (b + 1) * a / (1 + np.exp(-alpha * a))
            out[t] += w[t, j] * (d[e] @ h + (db[e] if db is not None else 0))
    return out


@pytest.mark.parametrize("routing,renorm,scaling,groups", [("softmax_topk", True, 1.0, (1, 1)),
                                                           ("softmax_topk", False, 2.5, (3, 2)),
                                                           ("topk_softmax", False, 1.0, (1, 1))])
def test_route_matches_reference(routing, renorm, scaling, groups):
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((T, E)).astype(np.float32)
    ids, w = run_graph(lambda x: list(moe_route(x, K, routing=routing, renormalize=renorm, scaling=scaling,
                                                n_group=groups[0], topk_group=groups[1])),
                       [TensorType(DType.float32, [T, E], DeviceRef.CPU())], logits)
    rids, rw = _ref_route(logits, K, routing, renorm, scaling, *groups)
    np.testing.assert_array_equal(ids, rids)
    np.testing.assert_allclose(w, rw, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("act,tokens,bias", [("silu", T, False), ("swigluoai", T, True), ("gelu_tanh", 3, False),
                                             ("gelu", 1, True), ("silu", 40, True), ("swigluoai", 40, False)])
def test_experts_ffn_matches_reference(act, tokens, bias):
    """A few tokens (at most NATIVE_MAX_PAIRS pairs: the native kernel) and a longer batch (grouped matmuls)."""
    from max.engine.kernels.moe import NATIVE_MAX_PAIRS

    assert (tokens * K <= NATIVE_MAX_PAIRS) == (tokens < 40)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((tokens, H)).astype(np.float32)
    ids = rng.integers(0, E, (tokens, K)).astype(np.int64)
    w = rng.random((tokens, K)).astype(np.float32)
    g, u = (rng.standard_normal((E, I, H)).astype(np.float32) * 0.3 for _ in range(2))
    d = rng.standard_normal((E, H, I)).astype(np.float32) * 0.3
    biases = tuple(rng.standard_normal(s).astype(np.float32) if bias else None for s in ((E, I), (E, I), (E, H)))
    cpu = DeviceRef.CPU()
    const = lambda a: None if a is None else ops.constant(a, DType.float32, cpu)  # noqa: E731
    types = [TensorType(DType.float32, [tokens, H], cpu), TensorType(DType.int64, [tokens, K], cpu),
             TensorType(DType.float32, [tokens, K], cpu)]
    (out,) = run_graph(lambda a, b, c: moe_experts_ffn(a, b, c, const(g), const(u), const(d),
                                                        gate_bias=const(biases[0]), up_bias=const(biases[1]),
                                                        down_bias=const(biases[2]), activation=act),
                       types, x, ids, w)
    np.testing.assert_allclose(out, _ref_ffn(x, ids, w, g, u, d, act, biases=biases), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("isa", isa_params())
def test_native_experts_kernel_every_isa(isa):
    """lmx_moe_ffn in every ISA variant this CPU runs: odd sizes (tails after the 8-wide partial sums),
    an expert used twice by one token, unused experts, a strided x; an expert id out of range is refused."""
    from max.engine import native

    so = native.lib(isa)
    rng = np.random.default_rng(3)
    # small (one thread), then large enough for the threads to split the experts' rows
    for T2, H2, I2, E2, K2 in ((5, 19, 13, 7, 3), (8, 67, 45, 5, 2)):
        xfull = rng.standard_normal((T2, H2 + 4)).astype(np.float32)
        x = xfull[:, :H2]
        ids = rng.integers(0, E2 - 1, (T2, K2)).astype(np.int64)  # the last expert unused
        ids[0, :2] = 2
        w = rng.random((T2, K2)).astype(np.float32)
        g, u = (rng.standard_normal((E2, I2, H2)).astype(np.float32) * 0.3 for _ in range(2))
        d = rng.standard_normal((E2, H2, I2)).astype(np.float32) * 0.3
        db = rng.standard_normal((E2, H2)).astype(np.float32)
        ws = np.empty(T2 * K2 * (2 * H2 + 3 * I2), np.float32)
        out = np.empty((T2, H2), np.float32)

        def call(ids_):
            return so.lmx_moe_ffn(T2, H2, I2, K2, E2, xfull.ctypes.data, H2 + 4, ids_.ctypes.data, w.ctypes.data,
                                  g.ctypes.data, u.ctypes.data, d.ctypes.data, None, None, db.ctypes.data, 0, 1.702,
                                  7.0, ws.ctypes.data, out.ctypes.data)

        assert call(ids) == 0
        np.testing.assert_allclose(out, _ref_ffn(x, ids, w, g, u, d, "silu", biases=(None, None, db)),
                                   rtol=1e-5, atol=1e-5)
    bad = ids.copy()
    bad[2, 1] = E2
    assert call(bad) == 1
    bad[2, 1] = -1
    assert call(bad) == 1


def test_moe_layer_with_shared_experts_matches_reference():
    from max.graph import Graph

    rng = np.random.default_rng(2)
    dev = DeviceRef.CPU()
    moe = MoE([dev], H, E, K, I, has_shared_experts=True, shared_experts_dim=8, dtype=DType.float32,
              gate_cls=lambda *a, **k: MoEGate(*a, **k, renormalize=True))
    sd = {n: rng.standard_normal([int(s) for s in w.shape]).astype(np.float32) * 0.3
          for n, w in moe.raw_state_dict().items()}
    moe.load_state_dict(sd)
    x = rng.standard_normal((T, H)).astype(np.float32)
    (out,) = run_graph(lambda a: moe(a), [TensorType(DType.float32, [T, H], dev)], x, weights=moe.state_dict())
    ids, w = _ref_route(x @ sd["gate.gate_score.weight"].T, K, "softmax_topk", True, 1.0)
    g = np.stack([sd[f"experts.{e}.gate_proj.weight"] for e in range(E)])
    u = np.stack([sd[f"experts.{e}.up_proj.weight"] for e in range(E)])
    d = np.stack([sd[f"experts.{e}.down_proj.weight"] for e in range(E)])
    ref = _ref_ffn(x, ids, w, g, u, d)
    sg, su, sdn = (sd[f"shared_experts.{p}_proj.weight"].astype(np.float64) for p in ("gate", "up", "down"))
    a, b = x @ sg.T, x @ su.T
    ref += (a / (1 + np.exp(-a)) * b) @ sdn.T
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    _ = (Graph, MLP)


def test_bad_arguments_fail_at_build_time():
    from max.graph import Graph

    with Graph("g", input_types=[TensorType(DType.float32, [T, E], DeviceRef.CPU())]) as gr:
        with pytest.raises(ValueError, match="moe_route: k must be"):
            moe_route(gr.inputs[0], E + 1)
        with pytest.raises(ValueError, match="moe_route: routing"):
            moe_route(gr.inputs[0], 2, routing="sigmoid")
    with pytest.raises(NotImplementedError, match="ep_size"):
        MoE([DeviceRef.CPU()], H, E, K, I, ep_size=2)
