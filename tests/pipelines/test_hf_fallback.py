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
    assert run(prompts) == want
    mgr = llm.pipeline.kv_managers[0]
    assert mgr.num_free_pages == mgr.total_num_pages
    assert isinstance(llm.generate(["import os"], max_new_tokens=4, use_tqdm=False)[0], str)


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
