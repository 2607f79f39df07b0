"""max.nn.sampling (MAX 26.7 names) against numpy: exact where the result is deterministic, by frequencies
over many rows where it is random (tolerances are > 5 standard errors)."""

from __future__ import annotations

import numpy as np
import pytest

from max.dtype import DType
from max.graph import DeviceRef, TensorType
from max.nn import sampling as S

from support import run_graph

CPU = DeviceRef.CPU()
F32, I64, U32 = DType.float32, DType.int64, DType.uint32


def _t(dt, shape):
    return TensorType(dt, shape, CPU)


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_min_p_one_is_greedy_and_min_p_filters():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((5, 11)).astype(np.float32)
    s = S.MinPSampler(F32, [5, 11])
    (tok,) = run_graph(lambda x: s(x, 1.0), [_t(F32, [5, 11])], logits)
    assert tok.shape == (5, 1) and tok.dtype == np.int64
    np.testing.assert_array_equal(tok[:, 0], logits.argmax(-1))
    n = 4000
    p = np.array([0.5, 0.3, 0.15, 0.05])
    rows = np.tile(np.log(p).astype(np.float32), (n, 1))
    mp = np.full(n, 0.25, np.float32)  # keeps p >= 0.125: tokens 0, 1, 2
    s2 = S.MinPSampler(F32, [n, 4], seed=3)
    (tok,) = run_graph(lambda x, m: s2(x, m), [_t(F32, [n, 4]), _t(F32, [n])], rows, mp)
    freq = np.bincount(tok[:, 0], minlength=4) / n
    want = np.array([0.5, 0.3, 0.15, 0.0]) / 0.95
    assert freq[3] == 0 and np.abs(freq - want).max() < 0.04, freq
    # temperature flattens the distribution before the filter
    s3 = S.MinPSampler(F32, [n, 4], temperature=2.0, min_p=0.0, seed=4)
    (tok,) = run_graph(lambda x: s3(x), [_t(F32, [n, 4])], rows)
    want = _softmax(np.log(p) / 2.0)
    assert np.abs(np.bincount(tok[:, 0], minlength=4) / n - want).max() < 0.04
    with pytest.raises(ValueError):
        S.MinPSampler(F32, [2, 3], temperature=0)


def test_logit_penalties_match_formula():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 7)).astype(np.float32)
    counts = rng.integers(0, 3, (3, 7)).astype(np.int64)
    fp, pp, rp = (rng.uniform(0, 1, 3).astype(np.float32) for _ in range(3))
    rp = rp + 1
    (got,) = run_graph(lambda a, c, f, p_, r: S.LogitPenalties()(a, c, f, p_, r),
                       [_t(F32, [3, 7]), _t(I64, [3, 7]), _t(F32, [3]), _t(F32, [3]), _t(F32, [3])],
                       x, counts, fp, pp, rp)
    x64 = x.astype(np.float64) - fp[:, None] * counts - pp[:, None] * (counts > 0)
    want = np.where(counts > 0, np.where(x64 > 0, x64 / rp[:, None], x64 * rp[:, None]), x64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    (same,) = run_graph(lambda a, c: S.LogitPenalties()(a, c), [_t(F32, [3, 7]), _t(I64, [3, 7])], x, counts)
    np.testing.assert_array_equal(same, x)  # no penalties: unchanged


def _spec_batch(rng, B, K, V, gap=2):
    """target rows for request b at offsets[b] .. offsets[b] + K, with unused rows between requests."""
    offsets = np.arange(B + 1, dtype=np.uint32) * (K + 1 + gap)
    rows = rng.standard_normal((int(offsets[-1]), V)).astype(np.float32)
    return rows, offsets


def test_greedy_acceptance_sampler_and_module():
    rng = np.random.default_rng(2)
    B, K, V = 4, 3, 9
    rows, offsets = _spec_batch(rng, B, K, V)
    per = np.stack([rows[offsets[b]:offsets[b] + K + 1] for b in range(B)])  # [B, K+1, V]
    best = per.argmax(-1)
    draft = best[:, :K].copy()
    draft[1, 1] = (draft[1, 1] + 1) % V  # request 1 rejected at 1
    draft[2, 0] = (draft[2, 0] + 1) % V  # request 2 rejected at 0
    types = [_t(I64, [B, K]), _t(F32, list(rows.shape)), _t(U32, [B + 1])]
    for fn in (S.greedy_acceptance_sampler, S.AcceptanceSampler(CPU, greedy=True)):
        first, toks, bonus = run_graph(lambda d, t, o: fn(d, t, o), types, draft, rows, offsets)
        np.testing.assert_array_equal(first, [3, 1, 0, 3])
        np.testing.assert_array_equal(toks, best[:, :K])
        np.testing.assert_array_equal(bonus, best[:, K])


def test_rejection_sampler_greedy_target_is_exact():
    rng = np.random.default_rng(3)
    B, K, V = 3, 2, 6
    rows, offsets = _spec_batch(rng, B, K, V, gap=1)
    per = np.stack([rows[offsets[b]:offsets[b] + K + 1] for b in range(B)])
    best = per.argmax(-1)
    draft = best[:, :K].copy()
    draft[0, 1] = (draft[0, 1] + 2) % V
    dlp = np.log(rng.uniform(0.2, 1.0, (B, K))).astype(np.float32)
    first, toks = run_graph(lambda d, q, t, o: S.RejectionSampler(CPU, top_k=1)(d, q, t, o),
                            [_t(I64, [B, K]), _t(F32, [B, K]), _t(F32, list(rows.shape)), _t(U32, [B + 1])],
                            draft, dlp, rows, offsets)
    np.testing.assert_array_equal(first, [1, 2, 2])
    np.testing.assert_array_equal(toks, best)


def test_rejection_sampler_acceptance_rate():
    # K = 1, one token position: accept probability min(1, p_t / p_d) for the proposed token
    n, V = 4000, 4
    p_t = np.array([0.1, 0.2, 0.3, 0.4])
    rows = np.tile(np.log(p_t).astype(np.float32), (n, 1))
    rows = np.repeat(rows, 2, axis=0)  # two rows per request (K + 1)
    offsets = (np.arange(n + 1) * 2).astype(np.uint32)
    draft = np.full((n, 1), 3, np.int64)
    dlp = np.full((n, 1), np.log(0.8), np.float32)  # p_draft = 0.8 > p_t = 0.4: accept w.p. 0.5
    first, toks = run_graph(lambda d, q, t, o: S.RejectionSampler(CPU, top_k=-1, seed=5)(d, q, t, o),
                            [_t(I64, [n, 1]), _t(F32, [n, 1]), _t(F32, [2 * n, V]), _t(U32, [n + 1])],
                            draft, dlp, rows, offsets)
    assert abs((first == 1).mean() - 0.5) < 0.04
    assert np.abs(np.bincount(toks[:, 0], minlength=V) / n - p_t).max() < 0.04


def test_rejection_sampler_with_residuals_outputs_the_target_distribution():
    rng = np.random.default_rng(6)
    n, V = 6000, 5
    t_logits = np.log(np.array([0.05, 0.15, 0.4, 0.3, 0.1]))
    d_logits = np.log(np.array([0.3, 0.3, 0.1, 0.2, 0.1]))
    p_d = _softmax(d_logits)
    draft = rng.choice(V, size=(n, 1), p=p_d).astype(np.int64)
    rows = np.repeat(np.tile(t_logits.astype(np.float32), (n, 1)), 2, axis=0)
    offsets = (np.arange(n + 1) * 2).astype(np.uint32)
    dl = np.tile(d_logits.astype(np.float32), (n, 1, 1))
    sampler = S.RejectionSamplerWithResiduals(CPU, top_k=-1, seed=7)
    first, rec, bonus = run_graph(lambda d, q, t, o: sampler(d, q, t, o),
                                  [_t(I64, [n, 1]), _t(F32, [n, 1, V]), _t(F32, [2 * n, V]), _t(U32, [n + 1])],
                                  draft, dl, rows, offsets)
    out = np.where(first == 1, draft[:, 0], rec[:, 0])
    p_t = _softmax(t_logits)
    assert np.abs(np.bincount(out, minlength=V) / n - p_t).max() < 0.035
    assert np.abs(np.bincount(bonus, minlength=V) / n - p_t).max() < 0.035
    accept_rate = np.minimum(1, p_t / p_d) @ p_d  # = sum_x min(p_t, p_d)
    assert abs((first == 1).mean() - accept_rate) < 0.035


def test_stochastic_acceptance_sampler():
    n, V = 5000, 4
    p_t = np.array([0.1, 0.2, 0.3, 0.4])
    rows = np.repeat(np.tile(np.log(p_t).astype(np.float32), (n, 1)), 2, axis=0)
    offsets = (np.arange(n + 1) * 2).astype(np.uint32)
    draft = np.full((n, 1), 3, np.int64)  # the draft's argmax proposal
    types = [_t(I64, [n, 1]), _t(F32, [2 * n, V]), _t(U32, [n + 1])]
    first, rec, bonus = run_graph(lambda d, t, o: S.stochastic_acceptance_sampler(d, t, o, seed=9), types,
                                  draft, rows, offsets)
    assert abs((first == 1).mean() - 0.4) < 0.04  # accepted w.p. p_target(3)
    assert not (rec[:, 0] == 3).any()  # recovery never re-proposes the draft token
    assert np.abs(np.bincount(rec[:, 0], minlength=V)[:3] / n - p_t[:3] / 0.6).max() < 0.04
    m = S.AcceptanceSampler(CPU, greedy=False, seed=9)
    first2, _, _ = run_graph(lambda d, t, o: m(d, t, o), types, draft, rows, offsets)
    np.testing.assert_array_equal(first2, first)  # same seed, same draws
    with pytest.raises(ValueError):
        S.AcceptanceSampler(CPU, top_p=0)
    assert set(S.__all__) == {"AcceptanceSampler", "LogitPenalties", "MinPSampler", "RejectionSampler",
                              "RejectionSamplerWithResiduals", "greedy_acceptance_sampler",
                              "stochastic_acceptance_sampler"}
