"""Speculative decoding behind ``max serve`` (the ``openai`` client): with the served tiny model as its
own draft, greedy answers equal the plain server's, and /metrics reports the acceptance."""

from __future__ import annotations

import httpx
import pytest


@pytest.fixture(scope="module")
def spec_server(tiny_model):
    from max.entrypoints.cli import build_config
    from max.serve.server import ServerThread, build_app

    app = build_app(build_config(tiny_model, None, "cpu", 256, 8, draft_model_path=tiny_model,
                                 num_speculative_tokens=3), served_model_name="tiny")
    with ServerThread(app) as srv:
        yield srv


def test_speculative_server_matches_the_plain_one(spec_server, client):
    import openai

    spec = openai.OpenAI(base_url=spec_server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    msg = [{"role": "user", "content": "Write a function"}]
    for kw in (dict(messages=msg), dict(messages=msg, stream=True)):
        a = spec.chat.completions.create(model="tiny", max_tokens=16, temperature=0, extra_body={"ignore_eos": True},
                                         **kw)
        b = client.chat.completions.create(model="tiny", max_tokens=16, temperature=0,
                                           extra_body={"ignore_eos": True}, **kw)
        if kw.get("stream"):
            a = "".join(c.choices[0].delta.content or "" for c in a if c.choices)
            b = "".join(c.choices[0].delta.content or "" for c in b if c.choices)
        else:
            a, b = a.choices[0].message.content, b.choices[0].message.content
        assert a == b
    text = httpx.get(spec_server.url + "/metrics").text
    ratio = [ln for ln in text.splitlines() if ln.startswith("maxserve_spec_decode_acceptance_ratio")]
    assert ratio and float(ratio[0].split()[-1]) == 1.0
