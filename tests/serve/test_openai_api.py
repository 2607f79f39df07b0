"""The OpenAI-compatible endpoints driven by the official ``openai`` client (and raw SSE over httpx)."""

from __future__ import annotations

import json

import httpx
import pytest

from serve_support import wait_idle

MSG = [{"role": "user", "content": "Write a function"}]


def test_models_and_health(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


def test_chat_completion_non_streaming_usage_and_length(client):
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=7, temperature=0, extra_body={
        "ignore_eos": True})
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    ch = r.choices[0]
    assert ch.message.role == "assistant" and isinstance(ch.message.content, str) and ch.message.content
    assert ch.finish_reason == "length"
    assert r.usage.completion_tokens == 7
    assert r.usage.prompt_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + 7


def test_max_completion_tokens_and_greedy_determinism(client):
    a = client.chat.completions.create(model="tiny", messages=MSG, max_completion_tokens=5, temperature=0,
                                       extra_body={"ignore_eos": True})
    b = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=5, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert a.usage.completion_tokens == 5 and a.choices[0].message.content == b.choices[0].message.content


def test_seeded_sampling_is_reproducible(client):
    kw = dict(model="tiny", messages=MSG, max_tokens=12, temperature=1.0, top_p=0.9, top_k=50, seed=1234,
              presence_penalty=0.5, frequency_penalty=0.5, extra_body={"ignore_eos": True, "min_p": 0.01})
    kw_extra = kw.pop("extra_body")
    kw_extra["top_k"] = kw.pop("top_k")
    a = client.chat.completions.create(**kw, extra_body=kw_extra)
    b = client.chat.completions.create(**kw, extra_body=kw_extra)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_chat_streaming_matches_non_streaming(client):
    full = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=10, temperature=0,
                                          extra_body={"ignore_eos": True})
    stream = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=10, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)


def test_raw_sse_framing_ends_with_done(server):
    body = {"model": "tiny", "messages": MSG, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    for e in events[:-1]:
        obj = json.loads(e[6:])
        assert "usage" not in obj  # no include_usage: chunks carry no usage key


def test_stop_string_cuts_text_and_reports_stop(client):
    base = client.completions.create(model="tiny", prompt="import os", max_tokens=24, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    assert len(base) > 8
    stop = base[len(base) // 2: len(base) // 2 + 3]
    cut = base[: base.find(stop)]
    r = client.completions.create(model="tiny", prompt="import os", max_tokens=24, temperature=0, stop=[stop],
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"
    s = client.completions.create(model="tiny", prompt="import os", max_tokens=24, temperature=0, stop=stop,
                                  stream=True, extra_body={"ignore_eos": True})
    chunks = list(s)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == cut
    assert chunks[-1].choices[0].finish_reason == "stop"
    # the chat endpoint honours stop too
    chat_base = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=24, temperature=0,
                                               extra_body={"ignore_eos": True}).choices[0].message.content
    st = chat_base[len(chat_base) // 2: len(chat_base) // 2 + 3]
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=24, temperature=0, stop=st,
                                       extra_body={"ignore_eos": True})
    assert r.choices[0].message.content == chat_base[: chat_base.find(st)] and r.choices[0].finish_reason == "stop"


def test_completions_list_prompt_echo_and_n(client):
    r = client.completions.create(model="tiny", prompt=["def f", "class A"], max_tokens=5, temperature=0, n=2,
                                  echo=True, extra_body={"ignore_eos": True})
    assert r.object == "text_completion" and [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text.startswith("def f") and r.choices[2].text.startswith("class A")
    assert r.choices[0].text == r.choices[1].text  # greedy: both samples of a prompt agree
    assert r.usage.completion_tokens == 20
    one = client.completions.create(model="tiny", prompt="def f", max_tokens=5, temperature=0,
                                    extra_body={"ignore_eos": True})
    two = client.completions.create(model="tiny", prompt="class A", max_tokens=1)
    assert r.usage.prompt_tokens == one.usage.prompt_tokens + two.usage.prompt_tokens  # once per prompt, not per n
    assert r.choices[0].text == "def f" + one.choices[0].text
    tok = client.completions.create(model="tiny", prompt=[[5, 6, 7, 8]], max_tokens=3, temperature=0)
    assert tok.usage.prompt_tokens == 4


def test_chat_n_greater_than_one_streaming(client):
    chunks = list(client.chat.completions.create(model="tiny", messages=MSG, max_tokens=4, n=3, stream=True,
                                                 temperature=0.8, seed=7, extra_body={"ignore_eos": True}))
    per = {}
    for c in chunks:
        for ch in c.choices:
            per.setdefault(ch.index, []).append(ch)
    assert sorted(per) == [0, 1, 2]
    assert all([x.finish_reason for x in v if x.finish_reason] == ["length"] for v in per.values())


def test_chat_logprobs(client):
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=6, temperature=0, logprobs=True,
                                       top_logprobs=3, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 6
    assert "".join(e.token for e in content) == r.choices[0].message.content
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        assert e.top_logprobs[0].logprob >= e.top_logprobs[-1].logprob
        assert abs(e.top_logprobs[0].logprob - e.logprob) < 1e-4  # greedy: the chosen token is the top one
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token


def test_completion_logprobs_and_echo(server, client):
    r = client.completions.create(model="tiny", prompt="import sys", max_tokens=4, temperature=0, logprobs=2,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert all(v <= 0 for v in lp.token_logprobs) and len(lp.token_logprobs) == 4
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset == sorted(lp.text_offset)
    assert all(len(t) >= 2 for t in lp.top_logprobs)
    # prompt log probabilities need a model served with --enable-echo (tests/serve/test_prompt_logprobs.py)
    e = httpx.post(server.url + "/v1/completions", timeout=30, json={
        "model": "tiny", "prompt": "import sys", "max_tokens": 2, "logprobs": 1, "echo": True})
    assert e.status_code == 400 and e.json()["error"]["param"] == "echo"
    assert "--enable-echo" in e.json()["error"]["message"]
    echo_only = client.completions.create(model="tiny", prompt="import sys", max_tokens=2, echo=True)
    assert echo_only.choices[0].text.startswith("import sys")


def test_metrics_after_traffic(server, client):
    client.chat.completions.create(model="tiny", messages=MSG, max_tokens=3)
    wait_idle(server)
    text = httpx.get(server.url + "/metrics").text
    for name in ("maxserve_requests_total", "maxserve_queue_depth", "maxserve_running_requests",
                 "maxserve_time_to_first_token_seconds_bucket", "maxserve_inter_token_latency_seconds_bucket",
                 "maxserve_prompt_tokens_total", "maxserve_generation_tokens_total", "maxserve_kv_cache_pages_used",
                 "maxserve_kv_cache_pages_total", "maxserve_batch_size_bucket"):
        assert name in text, name
    assert 'maxserve_requests_total{endpoint="/v1/chat/completions",status="200"}' in text
    assert "maxserve_kv_cache_pages_used 0.0" in text


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_default_max_tokens(server, path):
    body = {"model": "tiny", "temperature": 0}
    body.update({"messages": MSG} if "chat" in path else {"prompt": "x = 1"})
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 200
    u = r.json()["usage"]
    assert u["completion_tokens"] >= 1
    if "chat" not in path:
        assert u["completion_tokens"] <= 16  # the OpenAI default of /v1/completions
