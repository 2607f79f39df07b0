"""Speculative decoding on tiny random Llamas sharing one tokenizer: greedy output is token-identical to
decoding without a draft, rejection sampling keeps the target distribution (chi-square), acceptance is
counted (metrics, ``max generate``'s summary, Prometheus gauges), and a draft with another vocabulary is
refused at load."""

from __future__ import annotations

import os

import numpy as np
import pytest

from lm_support import make_tiny_llama, make_tokenizer

torch = pytest.importorskip("torch")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
PROMPTS = ["def forward", "import os", "class A:", "return x"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec")
    tok = make_tokenizer()
    target = make_tiny_llama(str(root / "target"), tokenizer=tok)
    draft = make_tiny_llama(str(root / "draft"), tokenizer=tok, seed=5, num_hidden_layers=1)
    other = make_tiny_llama(str(root / "other"), tokenizer=make_tokenizer(vocab_size=700), seed=6)
    return target, draft, other


def _llm(path, **kw):
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    return LLM(PipelineConfig(model_path=path, max_length=256, max_batch_size=8, device_specs="cpu", **kw))


def test_greedy_is_token_identical_and_acceptance_is_counted(models):
    from max.interfaces import SamplingParams

    target, draft, _ = models
    p = SamplingParams(top_k=1, max_new_tokens=20, ignore_eos=True)
    want = _llm(target).generate(PROMPTS, max_new_tokens=20, sampling_params=p, use_tqdm=False)
    for d, expect_all in ((draft, False), (target, True)):  # a different draft, and the target as its own draft
        spec = _llm(target, draft_model_path=d, num_speculative_tokens=4)
        assert type(spec.pipeline).__name__ == "SpeculativeDecodingTextGenerationPipeline"
        assert spec.generate(PROMPTS, max_new_tokens=20, sampling_params=p, use_tqdm=False) == want
        m = spec.pipeline.metrics
        assert m.rounds > 0 and m.draft_tokens_proposed >= m.rounds
        # the first token comes from the prompt step, the last (one slot left) from a plain step
        assert len(PROMPTS) * 18 <= m.tokens_generated <= len(PROMPTS) * 19
        if expect_all:
            assert m.acceptance_rate == 1.0 and m.tokens_per_round > 4  # 4 drafts + the bonus token per step
        for mgr in spec.pipeline.kv_managers:
            assert mgr.num_free_pages == mgr.total_num_pages


def test_rejection_sampling_keeps_the_target_distribution():
    """Draft tokens from q, accepted with min(1, p/q), residual resampling: the result is distributed as p."""
    from types import SimpleNamespace

    from max.interfaces import SamplingParams
    from max.pipelines.lib.speculative_decoding import SpeculativeDecodingTextGenerationPipeline, token_probabilities

    g = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=1.0, top_k=-1, seed=0)
    target_logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0, 1.5], [0.0] * 6])
    draft_logits = torch.tensor([[0.0, 2.0, 0.0, 1.0, -1.0, 0.5]])
    p = token_probabilities(target_logits[:1], params)[0]
    q = token_probabilities(draft_logits, params)[0]
    pipe = SpeculativeDecodingTextGenerationPipeline.__new__(SpeculativeDecodingTextGenerationPipeline)
    pipe._gens = {"r": g}
    ctx = SimpleNamespace(request_id="r", sampling_params=params)
    n = 5000
    counts = np.zeros(6)
    accepted = 0
    for _ in range(n):
        d = int(torch.multinomial(q, 1, generator=g)[0])
        acc, nxt = pipe._verify(ctx, [d], [q], target_logits)
        counts[acc[0] if acc else nxt] += 1
        accepted += bool(acc)
    expected = p.numpy() * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 20.5, (chi2, counts, expected)  # 5 degrees of freedom: p-value > 0.001
    assert abs(accepted / n - float(torch.minimum(p, q).sum())) < 0.02  # acceptance = sum(min(p, q))


def test_token_probabilities_over_the_whole_vocabulary():
    from max.interfaces import SamplingParams
    from max.pipelines.lib.speculative_decoding import token_probabilities

    lg = torch.randn(3, 300, generator=torch.Generator().manual_seed(1)) * 2
    ref = torch.softmax(lg.double() / 0.8, dim=-1)
    got = token_probabilities(lg, SamplingParams(temperature=0.8, top_k=0))
    assert torch.allclose(got.double(), ref, atol=1e-6)
    cut = token_probabilities(lg, SamplingParams(temperature=0.8, top_k=0, min_p=0.1)).double()
    keep = ref >= 0.1 * ref.max(dim=-1, keepdim=True).values
    assert torch.equal(cut > 0, keep)
    assert torch.allclose(cut, torch.where(keep, ref, 0) / torch.where(keep, ref, 0).sum(-1, keepdim=True),
                          atol=1e-6)
    top255 = token_probabilities(lg, SamplingParams(temperature=0.8, top_k=-1))
    assert int((top255[0] > 0).sum()) == 255


def test_max_generate_summary_and_serve_metrics(models):
    from click.testing import CliRunner

    from max.entrypoints.cli import build_config, main
    from max.serve.server import build_app

    target, draft, _ = models
    r = CliRunner().invoke(main, ["generate", "--model-path", target, "--devices", "cpu", "--prompt", "import",
                                  "--max-new-tokens", "12", "--draft-model-path", target,
                                  "--num-speculative-tokens", "3"])
    assert r.exit_code == 0, r.output
    assert "Draft acceptance rate: 100.0%" in r.output
    app = build_app(build_config(target, None, "cpu", 256, 4, draft_model_path=draft), served_model_name="t")
    body, _ = app.state.serve.metrics.render()
    assert b"maxserve_spec_decode_acceptance_ratio" in body and b"maxserve_spec_decode_draft_tokens_proposed" in body


def test_a_draft_with_another_vocabulary_is_refused(models):
    target, _, other = models
    with pytest.raises(ValueError, match="vocabulary"):
        _llm(target, draft_model_path=other)
