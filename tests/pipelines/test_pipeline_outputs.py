"""What ``TextGenerationPipeline.execute`` returns: tokens and log probabilities (computed by the
pipeline, checked against transformers on a tiny random Llama)."""

from __future__ import annotations

import asyncio
import os
import re

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


def _run(llm, ctxs):
    got = {c.request_id: [] for c in ctxs}
    for c in ctxs:
        llm.scheduler.submit(c, lambda o: got[o.request_id].extend(o.tokens))
    llm.scheduler.run_until_idle()
    return [got[c.request_id] for c in ctxs]


def test_logits_processors_run_every_step_on_their_own_row(tiny):
    from max.interfaces import SamplingParams

    llm, _ = tiny
    calls = []

    def force(inputs):
        lg = torch.from_dlpack(inputs.logits)
        assert lg.shape[0] == 1 and lg.dtype == torch.float32
        calls.append(inputs.context.request_id)
        lg.fill_(-float("inf"))
        lg[0, 42] = 0.0

    free = SamplingParams(top_k=1, max_new_tokens=6, ignore_eos=True)
    forced = SamplingParams(top_k=1, max_new_tokens=6, ignore_eos=True, logits_processors=[force])
    solo = _run(llm, [llm.make_context("import os", free)])[0]
    a = llm.make_context("import os", free)
    b = llm.make_context("import os", forced)
    got_a, got_b = _run(llm, [a, b])
    assert got_b == [42] * 6 and calls == [b.request_id] * 6  # called on every step, for its request only
    assert got_a == solo


def test_logit_bias_bans_and_forces(tiny):
    from max.interfaces import SamplingParams

    llm, _ = tiny
    base = SamplingParams(top_k=1, max_new_tokens=5, ignore_eos=True)
    solo = _run(llm, [llm.make_context("class A", base)])[0]
    ban = SamplingParams(top_k=1, max_new_tokens=5, ignore_eos=True, logit_bias={t: -100 for t in set(solo)})
    banned = _run(llm, [llm.make_context("class A", ban)])[0]
    assert not set(banned) & set(solo)
    force = SamplingParams(temperature=1.0, seed=0, max_new_tokens=5, ignore_eos=True, logit_bias={"77": 100})
    assert _run(llm, [llm.make_context("class A", force)])[0] == [77] * 5
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={5: 101})
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.make_context("x", SamplingParams(logit_bias={10**7: 1.0}))


def test_llm_generate_with_a_json_schema_batched_with_free_prompts(tiny):
    import json

    import jsonschema

    from max.interfaces import SamplingParams

    llm, _ = tiny
    schema = {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
                                               "kind": {"enum": ["a", "b"]}, "note": {"type": "string",
                                                                                     "maxLength": 8}},
              "required": ["id", "kind", "note"], "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    outs = llm.generate(["def f", "import os", "x = 1"], max_new_tokens=100, use_tqdm=False, response_format=rf,
                        sampling_params=SamplingParams(temperature=1.0, seed=9))
    for o in outs:
        jsonschema.validate(json.loads(o), schema)
    free = SamplingParams(top_k=1, max_new_tokens=8, ignore_eos=True)
    solo = _run(llm, [llm.make_context("import os", free)])[0]
    mixed = [llm.make_context("import os", free),
             llm.make_context("import os", SamplingParams(top_k=1, max_new_tokens=100), response_format=rf)]
    got_free, got_json = _run(llm, mixed)
    assert got_free == solo
    jsonschema.validate(json.loads(llm.tokenizer.decode_sync(got_json, skip_special_tokens=True)), schema)
    with pytest.raises(ValueError, match="does not compile"):
        llm.generate(["x"], use_tqdm=False, response_format={"type": "regex", "regex": "(("})


def test_max_generate_regex_and_bad_schema(tmp_path_factory):
    from click.testing import CliRunner

    from max.entrypoints.cli import main

    d = make_tiny_llama(str(tmp_path_factory.mktemp("tiny_cli")))
    r = CliRunner().invoke(main, ["generate", "--model-path", d, "--devices", "cpu", "--prompt", "x",
                                  "--regex", "[a-z]{3}-[0-9]{2}", "--max-new-tokens", "20"])
    assert r.exit_code == 0, r.output
    assert re.fullmatch(r"x[a-z]{3}-[0-9]{2}", r.stdout.splitlines()[0]), r.stdout  # the prompt, then the output
    r = CliRunner().invoke(main, ["generate", "--model-path", d, "--devices", "cpu", "--json-schema",
                                  '{"type": "wat"}'])
    assert r.exit_code != 0 and "does not compile" in r.output
    r = CliRunner().invoke(main, ["generate", "--model-path", d, "--regex", "a", "--json-object"])
    assert r.exit_code != 0 and "one output constraint" in r.output


def test_prefix_cache_is_looked_up_before_chunking(tmp_path_factory):
    """A 1,024-token prompt seen before reuses 7 of its 8 pages (the last token is always computed)
    whatever the prefill chunk size, and the output is the same as without the cache."""
    from max.entrypoints.llm import LLM
    from max.interfaces import SamplingParams, TextGenerationRequest
    from max.pipelines import PipelineConfig

    d = make_tiny_llama(str(tmp_path_factory.mktemp("tiny_pc")), max_position_embeddings=2048)
    ids = [10 + (i * 7) % 900 for i in range(1024)]
    params = SamplingParams(top_k=1, max_new_tokens=3, ignore_eos=True)
    results = {}
    for chunk, caching in ((256, True), (100, True), (8192, False)):
        llm = LLM(PipelineConfig(model_path=d, max_length=1100, max_batch_size=2, device_specs="cpu",
                                 prefill_chunk_size=chunk, enable_prefix_caching=caching))
        outs = []
        for k in range(2):
            req = TextGenerationRequest(request_id=f"r{k}", model_name="m", prompt=ids, sampling_params=params)
            outs.append(_run(llm, [asyncio.run(llm.tokenizer.new_context(req))])[0])
        mgr = llm.pipeline.kv_managers[0]
        results[chunk] = outs
        if caching:
            assert mgr.prefix_cache_hit_tokens == 896, chunk
            assert mgr.prefix_cache_queried_tokens == 2 * 1024 + 2  # each prompt once, plus two decode tokens
    assert results[256] == results[100] == results[8192] and results[256][0] == results[256][1]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        req = TextGenerationRequest(request_id="bad", model_name="m", prompt=[5, 10**6], sampling_params=params)
        asyncio.run(llm.tokenizer.new_context(req))
