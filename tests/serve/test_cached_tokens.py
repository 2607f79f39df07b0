"""``usage.prompt_tokens_details.cached_tokens`` (and the Responses API's ``input_tokens_details``) report
the prompt tokens the prefix cache really supplied: a new prompt reports 0, the same prompt again reports
the full KV pages it reused (checked against the KV manager's own hit counter)."""

from __future__ import annotations

import uuid

import httpx


def _prompt() -> str:
    # unique per test (the session's server keeps its prefix cache), long enough for several KV pages
    words = uuid.uuid4().hex
    return " ".join(f"{words[i % 32]}{i}" for i in range(55))


def _hits(server) -> int:
    return int(server.engine.kv_manager.prefix_cache_hit_tokens)


def test_chat_reports_cached_prompt_tokens(server, client):
    page = server.engine.kv_manager.page_size
    msgs = [{"role": "user", "content": _prompt()}]
    first = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2)
    assert page < first.usage.prompt_tokens < 250
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    before = _hits(server)
    second = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > 0 and cached % page == 0 and cached < second.usage.prompt_tokens
    assert cached == _hits(server) - before  # exactly what the prefix cache served this request
    # streamed usage carries it too
    chunks = list(client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == cached


def test_completions_and_responses_report_cached_tokens(server, client):
    prompt = _prompt()
    a = client.completions.create(model="tiny", prompt=prompt, max_tokens=2)
    assert a.usage.prompt_tokens_details.cached_tokens == 0
    b = client.completions.create(model="tiny", prompt=prompt, max_tokens=2)
    assert b.usage.prompt_tokens_details.cached_tokens > 0
    chunks = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=2, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == b.usage.prompt_tokens_details.cached_tokens
    text = _prompt()
    r1 = httpx.post(server.url + "/v1/responses", json={"model": "tiny", "input": text, "max_output_tokens": 2},
                    timeout=60).json()
    r2 = httpx.post(server.url + "/v1/responses", json={"model": "tiny", "input": text, "max_output_tokens": 2},
                    timeout=60).json()
    assert r1["usage"]["input_tokens_details"]["cached_tokens"] == 0
    assert 0 < r2["usage"]["input_tokens_details"]["cached_tokens"] < r2["usage"]["input_tokens"]


def test_no_prefix_cache_reports_zero(tiny_model):
    from max.entrypoints.cli import build_config
    from max.serve.server import ServerThread, build_app

    from serve_support import MAX_LENGTH

    app = build_app(build_config(tiny_model, None, "cpu", MAX_LENGTH, 4, enable_prefix_caching=False),
                    served_model_name="tiny")
    prompt = _prompt()
    with ServerThread(app) as srv:
        for _ in range(2):
            r = httpx.post(srv.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}, timeout=60).json()
            assert r["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
