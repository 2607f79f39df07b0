"""Prompt log probabilities (``echo`` with ``logprobs``, vLLM's ``prompt_logprobs``) from a model served
with ``enable_echo``: computed by the pipeline's log-softmax graph over every prompt position (also
across prefill chunks), equal to transformers' within 1e-4."""

from __future__ import annotations

import numpy as np
import pytest

from lm_support import make_tiny_llama

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPT = "def forward(self, hidden_states): return self.norm(hidden_states)"


@pytest.fixture(scope="module")
def echo_server(tmp_path_factory):
    from max.entrypoints.cli import build_config
    from max.serve.server import ServerThread, build_app

    d = make_tiny_llama(str(tmp_path_factory.mktemp("tiny_echo")))
    hf = transformers.AutoModelForCausalLM.from_pretrained(d).eval()
    app = build_app(build_config(d, None, "cpu", 256, 8, prefill_chunk_size=5, enable_echo=True),
                    served_model_name="tiny")
    with ServerThread(app) as srv:
        srv.hf = hf
        srv.tokenizer = app.state.serve.generator.tokenizer
        yield srv


@pytest.fixture(scope="module")
def eclient(echo_server):
    import openai

    return openai.OpenAI(base_url=echo_server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _reference(server, ids):
    with torch.no_grad():
        return torch.log_softmax(server.hf(torch.as_tensor([ids])).logits[0].double(), dim=-1)


def test_echo_logprobs_match_transformers(echo_server, eclient):
    for _ in range(2):  # the second time the prompt's pages are in the prefix cache: same numbers
        r = eclient.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, temperature=0, logprobs=3,
                                       echo=True, extra_body={"ignore_eos": True})
        lp = r.choices[0].logprobs
        ids = echo_server.tokenizer.encode_sync(PROMPT).tolist()
        n = len(ids)
        assert len(lp.token_logprobs) == n + 3 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        gen = echo_server.tokenizer.encode_sync(r.choices[0].text[len(PROMPT):], add_special_tokens=False).tolist()
        ref = _reference(echo_server, ids + gen[:2])
        for i in range(1, n + 2):
            assert abs(lp.token_logprobs[i] - float(ref[i - 1, (ids + gen)[i]])) < 1e-4, i
        for i in range(1, n):
            top = sorted(lp.top_logprobs[i].values(), reverse=True)[:3]
            np.testing.assert_allclose(top, torch.topk(ref[i - 1], 3).values.numpy(), atol=1e-4)
        assert "".join(lp.tokens) == r.choices[0].text


def test_prompt_logprobs_completions_chat_and_stream(echo_server, eclient):
    r = eclient.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, extra_body={"prompt_logprobs": 2})
    ids = echo_server.tokenizer.encode_sync(PROMPT).tolist()
    ref = _reference(echo_server, ids)
    plp = r.choices[0].model_extra["prompt_logprobs"]
    assert plp[0] is None and len(plp) == len(ids)
    for i in range(1, len(ids)):
        entry = plp[i][str(ids[i])]
        assert abs(entry["logprob"] - float(ref[i - 1, ids[i]])) < 1e-4
        ranked = sorted((v for v in plp[i].values() if v["rank"] is not None), key=lambda v: v["rank"])
        assert [v["rank"] for v in ranked][:2] == [1, 2]
    assert r.choices[0].logprobs is None  # logprobs were not asked for
    chat = eclient.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                           logprobs=True, top_logprobs=1, extra_body={"prompt_logprobs": 1})
    assert chat.model_extra["prompt_logprobs"][0] is None and len(chat.model_extra["prompt_logprobs"]) > 3
    assert len(chat.choices[0].logprobs.content) == chat.usage.completion_tokens  # only the generated tokens
    chunks = list(eclient.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, temperature=0, logprobs=1,
                                             echo=True, stream=True, extra_body={"ignore_eos": True}))
    streamed = [v for c in chunks if c.choices and c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    full = eclient.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, temperature=0, logprobs=1,
                                      echo=True, extra_body={"ignore_eos": True}).choices[0].logprobs.token_logprobs
    np.testing.assert_allclose([v for v in streamed if v is not None], [v for v in full if v is not None],
                               atol=1e-6)
