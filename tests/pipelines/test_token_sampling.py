"""Batched torch sampler: greedy, top-k/p, min-p, penalties, seeds."""

import math

import numpy as np
import pytest
import torch

from max.interfaces import SamplingParams
from max.pipelines.core import TextContext
from max.pipelines.lib.sampling import (
    GeneratorCache,
    rejection_sample,
    sample_for_contexts,
    sample_tokens,
    validate_sampling_params,
)

V = 50


def logits(b=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, V, generator=g) * 3


def sp(**kw):
    kw.setdefault("seed", 1234)
    return SamplingParams(**kw)


def draws(lg, params, n=2000, **kw):
    gens = [torch.Generator().manual_seed(7)]
    return torch.stack([sample_tokens(lg, [params], generators=gens, **kw)[0] for _ in range(n)])


def test_greedy_modes_equal_argmax():
    lg = logits(4)
    am = lg.argmax(-1)
    assert torch.equal(sample_tokens(lg, [sp(temperature=0)] * 4), am)
    assert torch.equal(sample_tokens(lg, [sp(top_k=1, temperature=5.0)] * 4), am)


def test_mixed_batch_rows_independent():
    lg = logits(3)
    params = [sp(temperature=0), sp(temperature=1.0, top_k=5), sp(top_k=1)]
    out = sample_tokens(lg, params)
    assert out[0] == lg[0].argmax() and out[2] == lg[2].argmax()
    assert out[1] in torch.topk(lg[1], 5).indices
    assert out.dtype == torch.int64 and out.shape == (3,)


def test_top_k_support():
    lg = logits()
    top3 = set(torch.topk(lg[0], 3).indices.tolist())
    assert set(draws(lg, sp(top_k=3), 500).tolist()) <= top3


def test_top_k_zero_is_the_whole_vocabulary_and_minus_one_the_top_255():
    # 1000 equally likely tokens: a sampler limited to 255 candidates can never draw the other 745
    flat = torch.zeros(1, 1000)
    allowed = set(torch.topk(flat[0], 255).indices.tolist())
    whole = draws(flat, sp(top_k=0), 600)
    assert len(set(whole.tolist()) - allowed) > 300
    top255 = draws(flat, sp(top_k=-1), 600)
    assert set(top255.tolist()) <= allowed


def test_whole_vocabulary_draws_follow_the_softmax_and_min_p():
    lg = logits()
    n = 4000
    ref = torch.softmax(lg[0].double() / 0.7, dim=-1)
    got = torch.bincount(draws(lg, sp(top_k=0, temperature=0.7), n), minlength=V).double() / n
    assert float((got - ref).abs().max()) < 0.03  # the unsorted path samples the same distribution
    # min_p with no top-k: only tokens at least min_p times as likely as the best one
    hot = torch.softmax(lg[0].double() / 3.0, dim=-1)
    keep = hot >= 0.2 * hot.max()
    assert 3 <= int(keep.sum()) < V
    seen = set(draws(lg, sp(top_k=0, temperature=3.0, min_p=0.2), 500).tolist())
    assert seen <= set(keep.nonzero().flatten().tolist()) and len(seen) >= 2
    # top_p with no top-k goes through the sorted path: the nucleus only
    order = torch.argsort(ref, descending=True)
    mass = torch.cumsum(ref[order], 0) - ref[order]
    nucleus = set(order[mass < 0.5].tolist())
    assert set(draws(lg, sp(top_k=0, temperature=0.7, top_p=0.5), 500).tolist()) <= nucleus


def test_top_p_mass():
    # probabilities 0.5, 0.3, 0.15, 0.05: top_p=0.8 keeps the first two only.
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    lg = torch.log(p)
    got = draws(lg, sp(top_p=0.8), 3000)
    assert set(got.tolist()) == {0, 1}
    frac0 = (got == 0).float().mean().item()
    assert abs(frac0 - 0.5 / 0.8) < 0.04
    assert set(draws(lg, sp(top_p=0.81), 3000).tolist()) == {0, 1, 2}


def test_min_p():
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    got = draws(torch.log(p), sp(min_p=0.5), 2000)  # keeps p >= 0.25
    assert set(got.tolist()) == {0, 1}


def test_distribution_matches_softmax_with_temperature():
    lg = torch.tensor([[1.0, 0.0, -1.0]])
    got = draws(lg, sp(temperature=2.0), 6000)
    expect = torch.softmax(lg[0] / 2.0, -1)
    freq = torch.bincount(got, minlength=3).float() / len(got)
    assert torch.allclose(freq, expect, atol=0.03)


def test_seed_reproducible_and_batch_independent():
    lg = logits(2)
    a = sample_tokens(lg, [sp(seed=5), sp(seed=9)])
    b = sample_tokens(lg, [sp(seed=5), sp(seed=9)])
    assert torch.equal(a, b)
    # the same seeded request gives the same stream whatever its batch neighbours are
    cache1, cache2 = GeneratorCache(), GeneratorCache()
    s1 = [sample_tokens(lg[:1], [sp(seed=5)], generators=[cache1.get("r", 5)])[0].item() for _ in range(20)]
    s2 = [sample_tokens(lg, [sp(seed=5), sp(seed=77)],
                        generators=[cache2.get("r", 5), cache2.get("x", 77)])[0].item() for _ in range(20)]
    assert s1 == s2 and len(set(s1)) > 1
    cache1.release("r")
    assert len(cache1) == 0


def test_penalties_change_argmax():
    lg = torch.tensor([[2.0, 1.9, 0.0, -1.0]])
    assert sample_tokens(lg, [sp(temperature=0)])[0] == 0
    hist = [np.array([0])]
    assert sample_tokens(lg, [sp(temperature=0, frequency_penalty=0.5)], output_tokens=hist)[0] == 1
    assert sample_tokens(lg, [sp(temperature=0, presence_penalty=0.5)], output_tokens=hist)[0] == 1
    # frequency scales with the count; presence does not
    hist2 = [np.array([1, 1, 1])]
    out = sample_tokens(torch.tensor([[2.0, 2.5, 0.0, -1.0]]), [sp(temperature=0, frequency_penalty=0.2)],
                        output_tokens=hist2)
    assert out[0] == 0
    out = sample_tokens(torch.tensor([[2.0, 2.5, 0.0, -1.0]]), [sp(temperature=0, presence_penalty=0.2)],
                        output_tokens=hist2)
    assert out[0] == 1
    # repetition penalty divides positive logits of prompt tokens
    out = sample_tokens(lg, [sp(temperature=0, repetition_penalty=1.2)], output_tokens=[np.array([], int)],
                        prompt_tokens=[np.array([0])])
    assert out[0] == 1
    # and multiplies negative ones (makes them less likely)
    neg = torch.tensor([[-1.0, -1.1, -5.0]])
    out = sample_tokens(neg, [sp(temperature=0, repetition_penalty=1.5)], output_tokens=[np.array([0])])
    assert out[0] == 1


def test_banned_tokens_and_contexts():
    lg = torch.tensor([[5.0, 1.0, 0.0]])
    assert sample_tokens(lg, [sp(temperature=0)], banned_tokens=[np.array([0])])[0] == 1
    c = TextContext(max_length=10, tokens=np.array([1, 2]), eos_token_ids={0},
                    sampling_params=sp(temperature=0, min_new_tokens=1))
    assert sample_for_contexts(lg, [c])[0] == 1  # EOS masked before min_new_tokens
    c.update(1)
    assert sample_for_contexts(lg, [c], GeneratorCache())[0] == 0


def test_return_logits_and_validation():
    lg = logits(2)
    toks, proc = sample_tokens(lg, [sp(), sp()], return_logits=True)
    assert proc.shape == lg.shape
    with pytest.raises(ValueError, match="2 rows"):
        sample_tokens(lg, [sp()])
    with pytest.raises(ValueError, match="batch, vocab"):
        sample_tokens(lg[0], [sp()])
    with pytest.raises(ValueError, match="exceeds the vocabulary"):
        validate_sampling_params(sp(top_k=100), vocab_size=V)
    with pytest.raises(ValueError, match="out of range"):
        sample_tokens(lg, [sp(frequency_penalty=1.0)] * 2, output_tokens=[np.array([V + 3]), None])


def test_rejection_sample():
    g = torch.Generator().manual_seed(0)
    V_ = 4
    draft = torch.tensor([[1, 2]])
    same = torch.full((1, 2, V_), 0.25)
    target = torch.full((1, 3, V_), 0.25)
    n, nxt = rejection_sample(draft, same, target, g)
    assert n.item() == 2 and 0 <= nxt.item() < V_  # identical distributions: all accepted
    tgt = target.clone()
    tgt[0, 0] = torch.tensor([1.0, 0.0, 0.0, 0.0])  # target never picks token 1
    n, nxt = rejection_sample(draft, same, tgt, g)
    assert n.item() == 0 and nxt.item() == 0
    assert not math.isnan(float(nxt))
