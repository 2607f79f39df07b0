"""The n-gram (prompt lookup) draft of speculative decoding: its proposals against a brute-force
reference, greedy output token-identical to decoding without a draft (alone, batched, with a sampled
request beside), acceptance counted, a one-hot proposal keeps the target distribution, clear config
errors, and ``max generate --speculative-method ngram``'s summary."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lm_support import make_tiny_llama, make_tokenizer

torch = pytest.importorskip("torch")

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _reference(tokens: list[int], k: int, lo: int, hi: int) -> list[int]:
    L = len(tokens)
    for n in range(hi, lo - 1, -1):
        if n > L - 1:
            continue
        suffix = tokens[L - n:]
        for i in range(L - n - 1, -1, -1):  # latest earlier occurrence first
            if tokens[i:i + n] == suffix:
                return tokens[i + n:i + n + k]
    return []


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=40), st.integers(1, 6), st.integers(1, 4), st.integers(0, 3))
def test_proposal_matches_brute_force(tokens, k, lo, extra):
    from max.pipelines.lib.ngram_draft import ngram_proposal

    hi = lo + extra
    assert ngram_proposal(np.array(tokens), k, lo, hi) == _reference(tokens, k, lo, hi)


def test_proposal_examples_and_bounds():
    from max.pipelines.lib.ngram_draft import ngram_proposal, prompt_lookup_bounds

    #                 0  1  2  3  4  5  6  7  8
    assert ngram_proposal([5, 6, 7, 8, 9, 5, 6, 7], 3, 1, 3) == [8, 9, 5]  # "5 6 7" seen at 0
    assert ngram_proposal([1, 2, 9, 1, 2, 3, 1, 2], 2, 2, 2) == [3, 1]  # latest "1 2" before the suffix: at 3
    assert ngram_proposal([1, 2, 3, 4], 3, 1, 2) == []
    assert prompt_lookup_bounds(None, None) == (5, 5)
    assert prompt_lookup_bounds(None, 4) == (4, 4) and prompt_lookup_bounds(2, None) == (2, 2)
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        prompt_lookup_bounds(3, 2)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A tiny Llama with small weights: its greedy continuation falls into cycles after a few tokens (so
    the n-gram draft is both rejected, early on, and accepted)."""
    return make_tiny_llama(str(tmp_path_factory.mktemp("ngram") / "target"), tokenizer=make_tokenizer(),
                           initializer_range=0.002)


def _llm(path, **kw):
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    return LLM(PipelineConfig(model_path=path, max_length=256, max_batch_size=8, device_specs="cpu", **kw))


PROMPTS = ["def forward(x): return x def forward(x): return", "import os", "x", "a b c d a b c d a b"]


def test_greedy_is_token_identical_and_acceptance_is_counted(target):
    from max.interfaces import SamplingParams

    p = SamplingParams(top_k=1, max_new_tokens=40, ignore_eos=True)
    plain = _llm(target)
    want = plain.generate(PROMPTS, max_new_tokens=40, sampling_params=p, use_tqdm=False)
    spec = _llm(target, speculative_method="ngram", num_speculative_tokens=4, prompt_lookup_min=1,
                prompt_lookup_max=3)
    assert type(spec.pipeline).__name__ == "SpeculativeDecodingTextGenerationPipeline"
    assert spec.generate(PROMPTS[:1], max_new_tokens=40, sampling_params=p, use_tqdm=False) == want[:1]
    assert spec.generate(PROMPTS, max_new_tokens=40, sampling_params=p, use_tqdm=False) == want
    m = spec.pipeline.metrics
    assert m.rounds > 0 and m.draft_tokens_proposed >= m.rounds and m.draft_tokens_accepted > 0
    assert m.tokens_generated >= m.rounds + m.draft_tokens_accepted
    # a sampled request beside greedy ones, in one batch: the greedy ones are unchanged
    sampled = SamplingParams(temperature=0.9, top_k=-1, seed=3, max_new_tokens=40, ignore_eos=True)
    ctxs = [spec.make_context(q, p) for q in PROMPTS] + [spec.make_context("a b c d a b", sampled)]
    toks: dict = {c.request_id: [] for c in ctxs}
    for c in ctxs:
        spec.scheduler.submit(c, lambda o: toks[o.request_id].extend(o.tokens))
    spec.scheduler.run_until_idle()
    got = [toks[c.request_id] for c in ctxs]
    assert len(got[-1]) == 40
    assert [plain.pipeline.tokenizer.delegate.decode(g) for g in got[:-1]] == want
    for mgr in spec.pipeline.kv_managers:
        assert mgr.num_free_pages == mgr.total_num_pages


def test_a_one_hot_proposal_keeps_the_target_distribution():
    """The n-gram draft's proposal t (q one-hot): accepted with probability p(t), else a token from p
    without t -- the result is distributed as p."""
    from types import SimpleNamespace

    from max.interfaces import SamplingParams
    from max.pipelines.lib.speculative_decoding import SpeculativeDecodingTextGenerationPipeline, token_probabilities

    g = torch.Generator().manual_seed(1)
    params = SamplingParams(temperature=1.0, top_k=-1, seed=0)
    target_logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0, 1.5], [0.0] * 6])
    p = token_probabilities(target_logits[:1], params)[0]
    pipe = SpeculativeDecodingTextGenerationPipeline.__new__(SpeculativeDecodingTextGenerationPipeline)
    pipe._gens = {"r": g}
    ctx = SimpleNamespace(request_id="r", sampling_params=params)
    n = 1500
    counts = np.zeros(6)
    accepted = 0
    for _ in range(n):
        acc, nxt = pipe._verify(ctx, [1], [None], target_logits)
        counts[acc[0] if acc else nxt] += 1
        accepted += bool(acc)
    expected = p.numpy() * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 20.5, (chi2, counts, expected)  # 5 degrees of freedom: p-value > 0.001
    assert abs(accepted / n - float(p[1])) < 0.04  # 4 standard deviations


def test_config_errors(target):
    from max.pipelines import PipelineConfig

    with pytest.raises(ValueError, match="needs no draft model"):
        PipelineConfig(model_path=target, speculative_method="ngram", draft_model_path=target)
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        PipelineConfig(model_path=target, speculative_method="ngram", prompt_lookup_min=4, prompt_lookup_max=2)
    with pytest.raises(ValueError, match="speculative_method"):
        PipelineConfig(model_path=target, speculative_method="eagle")


def test_max_generate_summary(target):
    from click.testing import CliRunner

    from max.entrypoints.cli import main

    r = CliRunner().invoke(main, ["generate", "--model-path", target, "--devices", "cpu", "--prompt",
                                  "a b c d a b c d a b", "--max-new-tokens", "12", "--speculative-method", "ngram",
                                  "--prompt-lookup-min", "1", "--prompt-lookup-max", "3"])
    assert r.exit_code == 0, r.output
    assert "Draft acceptance rate:" in r.output
