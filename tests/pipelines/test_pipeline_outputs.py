"""What ``TextGenerationPipeline.execute`` returns: tokens and log probabilities (computed by the
pipeline, checked against transformers on a tiny random Llama)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from lm_support import make_tiny_llama

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    d = make_tiny_llama(str(tmp_path_factory.mktemp("tiny_lp")))
    hf = transformers.AutoModelForCausalLM.from_pretrained(d).eval()
    llm = LLM(PipelineConfig(model_path=d, max_length=128, max_batch_size=8, device_specs="cpu"))
    return llm, hf


def _hf_logits(hf, ids):
    with torch.no_grad():
        return hf(torch.as_tensor(np.asarray(ids, np.int64))[None]).logits[0].double()


def test_pipeline_outputs_carry_sampled_token_log_probabilities(tiny):
    from max.interfaces import SamplingParams, TextGenerationInputs

    llm, hf = tiny
    params = SamplingParams(temperature=0.9, top_k=40, seed=3, max_new_tokens=5, ignore_eos=True)
    a = llm.make_context("import torch", params)
    b = llm.make_context("class A:", params)
    a.log_probabilities = 3  # b asks for none
    got = {a.request_id: [], b.request_id: []}
    lps = []
    for _ in range(5):
        outs = llm.pipeline.execute(TextGenerationInputs([{a.request_id: a, b.request_id: b}], num_steps=1))
        for rid, o in outs.items():
            got[rid].extend(o.tokens)
        lps.extend(outs[a.request_id].log_probabilities)
        assert outs[b.request_id].log_probabilities is None
    llm.pipeline.release(a.request_id)
    llm.pipeline.release(b.request_id)
    assert len(lps) == 5
    ids = [int(t) for t in a.prompt_tokens] + got[a.request_id]
    ref = torch.log_softmax(_hf_logits(hf, ids), dim=-1)
    n0 = len(a.prompt_tokens)
    for k, lp in enumerate(lps):
        row = ref[n0 - 1 + k]
        tok = got[a.request_id][k]
        assert abs(lp.token_log_probabilities[0] - float(row[tok])) < 1e-4
        top = lp.top_log_probabilities[0]
        want = torch.topk(row, 3)
        for t, v in zip(want.indices.tolist(), want.values.tolist()):
            assert abs(top[t] - v) < 1e-4
        assert tok in top  # the sampled token is always listed
