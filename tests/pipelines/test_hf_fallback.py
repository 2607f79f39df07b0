"""The Hugging Face transformers fallback: a causal LM without a native architecture folder (a tiny GPT-2)
runs through LLM / max generate with one warning, greedy tokens equal to transformers, alone and batched;
hf_fallback=False / --no-fallback gives the clear unsupported-architecture error."""

from __future__ import annotations

import logging

import pytest

from support import scheduled_greedy  # noqa: E402

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from family_support import hf_greedy  # noqa: E402
from hf_zoo import REFUSED, ZOO, recurrent_causal_lms, reference_greedy, tiny_model  # noqa: E402
from test_hf_utils import make_bpe_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    tok = transformers.AutoTokenizer.from_pretrained(make_bpe_tokenizer())
    cfg = transformers.GPT2Config(vocab_size=len(tok), n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                  initializer_range=0.2, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    d = tmp_path_factory.mktemp("gpt2")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d, model, tok


def test_unknown_architecture_runs_through_transformers(gpt2_dir, caplog):
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    d, model, tok = gpt2_dir
    with caplog.at_level(logging.WARNING, logger="max.pipelines"):
        llm = LLM(PipelineConfig(model_path=str(d), max_length=64, max_batch_size=4))
    warnings = [r for r in caplog.records if "GPT2LMHeadModel" in r.getMessage()]
    assert len(warnings) == 1 and "transformers" in warnings[0].getMessage()
    prompts = ["def forward(self, x):", "import os"]

    def run(ps):
        return scheduled_greedy(llm, ps, 12)

    want = [hf_greedy(model, tok(p)["input_ids"], 12) for p in prompts]
    assert run(prompts[:1]) == want[:1]
    with caplog.at_level(logging.INFO, logger="max.pipelines"):
        assert run(prompts) == want
        assert run(prompts) == want
    sequential = [r for r in caplog.records if "one after another" in r.getMessage()]
    assert len(sequential) == 1 and "GPT2LMHeadModel" in sequential[0].getMessage()  # said once
    mgr = llm.pipeline.kv_managers[0]
    assert mgr.num_free_pages == mgr.total_num_pages
    assert isinstance(llm.generate(["import os"], max_new_tokens=4, use_tqdm=False)[0], str)


def test_self_check_refuses_a_wrong_per_step_path(gpt2_dir):
    """The load-time guard: a per-step path that forgets its cache (each step sees only its new tokens)
    is refused naming the architecture; a chunk continuation it cannot do only switches to recomputing."""
    from max.pipelines.lib.hf_fallback import FallbackRefused, StepRunner, self_check

    _, model, _ = gpt2_dir
    runner = StepRunner(model, 64)
    self_check(runner, "GPT2LMHeadModel", model.config.vocab_size)
    assert runner.continuation_ok

    class Forgetful(StepRunner):
        def step(self, state, tokens, start):
            return super().step(self.new_state(), tokens[start:], 0)

    with pytest.raises(FallbackRefused, match=r"GPT2LMHeadModel cannot run.*differ from a full forward.*--no-fallback"):
        self_check(Forgetful(model, 64), "GPT2LMHeadModel", model.config.vocab_size)

    class NoChunks(StepRunner):  # multi-token continuations are wrong, single tokens right
        def step(self, state, tokens, start):
            if start > 0 and len(tokens) - start > 1 and self.continuation_ok:
                return super().step(self.new_state(), tokens[start:], 0)
            return super().step(state, tokens, start)

    runner = NoChunks(model, 64)
    self_check(runner, "GPT2LMHeadModel", model.config.vocab_size)
    assert not runner.continuation_ok
    with torch.inference_mode():  # ... so a chunked prompt is recomputed from its first token
        ids = list(range(3, 13))
        state = runner.new_state()
        runner.step(state, ids[:4], 0)
        got = runner.step(state, ids, 4)
        want = model(input_ids=torch.tensor([ids])).logits[0, -1]
    assert torch.allclose(got, want, atol=1e-4)


def test_no_fallback_is_the_clear_error(gpt2_dir):
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    d, _, _ = gpt2_dir
    with pytest.raises(ValueError, match=r"GPT2LMHeadModel.*supported architectures: \[.*LlamaForCausalLM.*"
                                         r"remove --no-fallback"):
        LLM(PipelineConfig(model_path=str(d), max_length=64, hf_fallback=False))


def test_cli_no_fallback_flag(gpt2_dir):
    from click.testing import CliRunner

    from max.entrypoints.cli import main

    d, _, _ = gpt2_dir
    res = CliRunner().invoke(main, ["generate", "--model-path", str(d), "--no-fallback", "--max-new-tokens", "2",
                                    "--devices", "cpu"])
    assert res.exit_code != 0 and "GPT2LMHeadModel" in res.output
    res = CliRunner().invoke(main, ["generate", "--model-path", str(d), "--max-new-tokens", "3", "--devices", "cpu",
                                    "--prompt", "import os"])
    assert res.exit_code == 0, res.output


# --------------------------------------------------------------------------- the zoo: many transformers classes
ZOO_NEW_TOKENS = 6
# "import os" fits one prefill chunk; the other prompt is longer than the chunk (chunked prefill)
ZOO_PROMPTS = ["import os", "def forward(self, x):\n    return self.proj(x) + 1"]


@pytest.fixture(scope="module")
def bpe_tokenizer():
    return transformers.AutoTokenizer.from_pretrained(make_bpe_tokenizer())


@pytest.mark.parametrize("name", list(ZOO), ids=list(ZOO))
def test_zoo_greedy_equals_transformers_generate_or_is_refused(name, bpe_tokenizer, tmp_path):
    """A tiny checkpoint of ``name`` through LLM (the transformers fallback): greedy tokens alone and in a
    batch (one prompt split by chunked prefill) equal transformers' own ``generate`` on the checkpoint;
    or, for the classes in REFUSED, the load is refused naming the class and --no-fallback."""
    from max.entrypoints.llm import LLM
    from max.interfaces import SamplingParams
    from max.pipelines import PipelineConfig

    tiny_model(name).save_pretrained(tmp_path)
    bpe_tokenizer.save_pretrained(tmp_path)
    # tiny models: one thread (two spinning pools per test process only slow them down)
    cfg = PipelineConfig(model_path=str(tmp_path), max_batch_size=4, prefill_chunk_size=8, num_threads=1)
    if name in REFUSED:
        with pytest.raises(ValueError, match=rf"{name} cannot run through the transformers fallback.*--no-fallback"):
            LLM(cfg)
        return
    llm = LLM(cfg)
    ids = [llm.make_context(p, SamplingParams(max_new_tokens=1)).prompt_tokens.tolist() for p in ZOO_PROMPTS]
    assert len(ids[0]) <= 8 < len(ids[1])
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    want = [reference_greedy(ref, i, ZOO_NEW_TOKENS) for i in ids]
    assert scheduled_greedy(llm, ZOO_PROMPTS[:1], ZOO_NEW_TOKENS) == want[:1]
    assert scheduled_greedy(llm, ZOO_PROMPTS, ZOO_NEW_TOKENS) == want
    mgr = llm.pipeline.kv_managers[0]
    assert mgr.num_free_pages == mgr.total_num_pages


def test_generation_config_static_cache(bpe_tokenizer, tmp_path):
    """A checkpoint whose generation config asks for a static cache ("hybrid", as Gemma 2's do) gets one per
    request, sized to the request's max_length, and still the tokens of transformers' generate."""
    from max.entrypoints.llm import LLM
    from max.interfaces import SamplingParams
    from max.pipelines import PipelineConfig

    model = tiny_model("Gemma2ForCausalLM")
    model.generation_config.cache_implementation = "hybrid"
    model.save_pretrained(tmp_path)
    bpe_tokenizer.save_pretrained(tmp_path)
    llm = LLM(PipelineConfig(model_path=str(tmp_path), max_batch_size=4, max_length=32, num_threads=1))
    ids = [llm.make_context(p, SamplingParams(max_new_tokens=1)).prompt_tokens.tolist() for p in ZOO_PROMPTS]
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert ref.generation_config.cache_implementation == "hybrid"
    want = [reference_greedy(ref, i, ZOO_NEW_TOKENS) for i in ids]
    assert scheduled_greedy(llm, ZOO_PROMPTS, ZOO_NEW_TOKENS) == want
    mgr = llm.pipeline.kv_managers[0]
    ctx = llm.make_context("import os", SamplingParams(max_new_tokens=5))
    state = mgr.fetch([ctx])[0]
    assert type(state.kwargs["cache"]).__name__ == "StaticCache"
    assert state.max_cache_len == ctx.max_length == len(ctx.prompt_tokens) + 5  # as generate sizes it
    mgr.release(ctx.request_id)


def test_zoo_covers_every_recurrent_causal_lm():
    """The zoo has >= 25 classes and every recurrent / hybrid causal LM the installed transformers ships;
    prints the covered classes (shown with -rA / -s)."""
    recurrent = recurrent_causal_lms()
    missing = [c for c in recurrent if c not in ZOO]
    assert not missing, f"recurrent / hybrid causal LMs of transformers {transformers.__version__} not in the zoo: " \
                        f"{missing}"
    assert len(ZOO) >= 25
    print(f"\ntransformers {transformers.__version__}: {len(ZOO)} causal-LM classes through the fallback "
          f"({len(recurrent)} recurrent / hybrid):")
    for name in ZOO:
        tag = "recurrent/hybrid" if name in recurrent else "attention"
        print(f"  {name:32s} {tag:17s} " + (f"refused: {REFUSED[name]}" if name in REFUSED else "= generate"))


def test_max_list_says_which_run_natively_and_the_fallback():
    from click.testing import CliRunner

    from max.entrypoints.cli import main

    out = " ".join(CliRunner().invoke(main, ["list"]).output.split())
    assert "Architectures: (these run natively)" in out and "LlamaForCausalLM" in out
    assert "through the transformers fallback" in out and "--no-fallback" in out
