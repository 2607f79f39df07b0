"""Bad input answers OpenAI's error shape with the right 4xx, and the server keeps serving."""

from __future__ import annotations

import httpx
import openai
import pytest

from serve_support import MAX_LENGTH, wait_idle

MSG = [{"role": "user", "content": "hi"}]


def _err(r: httpx.Response, status: int, param=None) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if param is not None:
        assert body["error"]["param"] == param, body
    return body["error"]


def post(server, path, **kw):
    return httpx.post(server.url + path, timeout=30, **kw)


@pytest.mark.parametrize("body,param", [
    ({"model": "tiny"}, "messages"),
    ({"messages": "hello"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"content": "no role"}]}, "messages[0].role"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": MSG, "max_tokens": "10"}, "max_tokens"),
    ({"messages": MSG, "max_tokens": 0}, "max_tokens"),
    ({"messages": MSG, "temperature": "hot"}, "temperature"),
    ({"messages": MSG, "temperature": 3.0}, "temperature"),
    ({"messages": MSG, "top_p": 0}, "top_p"),
    ({"messages": MSG, "top_k": -7}, "top_k"),
    ({"messages": MSG, "min_p": 1.5}, "min_p"),
    ({"messages": MSG, "presence_penalty": 9}, "presence_penalty"),
    ({"messages": MSG, "frequency_penalty": -3}, "frequency_penalty"),
    ({"messages": MSG, "stop": 5}, "stop"),
    ({"messages": MSG, "stop": [""]}, "stop"),
    ({"messages": MSG, "n": 0}, "n"),
    ({"messages": MSG, "stream": "yes"}, "stream"),
    ({"messages": MSG, "logprobs": True, "top_logprobs": 50}, "top_logprobs"),
    ({"messages": MSG, "top_logprobs": 2}, "top_logprobs"),
    ({"messages": MSG, "seed": 1.5}, "seed"),
    ({"messages": MSG, "logit_bias": {"5": 101}}, "logit_bias"),
    ({"messages": MSG, "logit_bias": {"five": 1}}, "logit_bias"),
    ({"messages": MSG, "logit_bias": {"99999999": 1}}, "logit_bias"),
    ({"messages": MSG, "response_format": {"type": "xml"}}, "response_format.type"),
    ({"messages": MSG, "response_format": {"type": "json_schema"}}, "response_format"),
])
def test_chat_bad_fields_are_400(server, body, param):
    _err(post(server, "/v1/chat/completions", json=body), 400, param)


@pytest.mark.parametrize("body,param", [
    ({"model": "tiny"}, "prompt"),
    ({"prompt": 12}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": "x", "logprobs": 99}, "logprobs"),
    ({"prompt": "x", "echo": "no"}, "echo"),
    ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
])
def test_completion_bad_fields_are_400(server, body, param):
    _err(post(server, "/v1/completions", json=body), 400, param)


def test_malformed_json_and_non_object_body(server):
    e = _err(post(server, "/v1/chat/completions", content=b'{"messages": [', headers={
        "content-type": "application/json"}), 400)
    assert "JSON" in e["message"]
    _err(post(server, "/v1/chat/completions", json=[1, 2]), 400)
    _err(post(server, "/v1/completions", content=b"\xff\xfe", headers={"content-type": "application/json"}), 400)


def test_unknown_model_is_404(server, client):
    e = _err(post(server, "/v1/chat/completions", json={"model": "gpt-4o", "messages": MSG}), 404, "model")
    assert e["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=1)
    _err(httpx.get(server.url + "/v1/models/nope"), 404)


def test_context_length(server):
    e = _err(post(server, "/v1/chat/completions", json={"messages": MSG, "max_tokens": MAX_LENGTH + 1}), 400,
             "max_tokens")
    assert e["code"] == "context_length_exceeded"
    _err(post(server, "/v1/chat/completions", json={"messages": MSG, "max_completion_tokens": 10_000}), 400,
         "max_completion_tokens")
    long_prompt = "return value " * (MAX_LENGTH * 2)
    e = _err(post(server, "/v1/completions", json={"prompt": long_prompt, "max_tokens": 1}), 400, "prompt")
    assert e["code"] == "context_length_exceeded"
    e = _err(post(server, "/v1/chat/completions", json={"messages": [{"role": "user", "content": long_prompt}]}),
             400, "messages")


def test_embeddings_on_a_generation_model_is_400(server):
    e = _err(post(server, "/v1/embeddings", json={"model": "tiny", "input": "hello"}), 400, "model")
    assert "embeddings" in e["message"]


def test_unknown_route_and_method(server):
    _err(httpx.get(server.url + "/v1/nothing"), 404)
    _err(httpx.get(server.url + "/v1/chat/completions"), 405)


def test_api_key(server):
    server.state.api_key = "sekrit"
    try:
        e = _err(post(server, "/v1/chat/completions", json={"messages": MSG, "max_tokens": 2}), 401)
        assert e["code"] == "invalid_api_key"
        _err(post(server, "/v1/chat/completions", json={"messages": MSG, "max_tokens": 2},
                  headers={"Authorization": "Bearer wrong"}), 401)
        bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        good = openai.OpenAI(base_url=server.url + "/v1", api_key="sekrit", max_retries=0)
        assert good.chat.completions.create(model="tiny", messages=MSG, max_tokens=2).choices
        assert httpx.get(server.url + "/health").status_code == 200  # health and metrics need no key
        assert httpx.get(server.url + "/metrics").status_code == 200
    finally:
        server.state.api_key = None


def test_full_queue_is_503_with_retry_after(server):
    sched = server.engine.scheduler
    sched.max_queue_size = 0
    try:
        r = post(server, "/v1/chat/completions", json={"messages": MSG, "max_tokens": 2})
        e = _err(r, 503)
        assert r.headers["retry-after"] == "1" and e["code"] == "queue_full"
        r = post(server, "/v1/completions", json={"prompt": ["a", "b", "c"], "max_tokens": 2})
        _err(r, 503)
    finally:
        sched.max_queue_size = None
    wait_idle(server)


def test_server_keeps_serving_after_errors(server, client):
    for _ in range(3):
        post(server, "/v1/chat/completions", content=b"nonsense")
        post(server, "/v1/chat/completions", json={"messages": MSG, "top_p": 7})
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=3)
    assert r.choices[0].finish_reason in ("stop", "length")
    wait_idle(server)
