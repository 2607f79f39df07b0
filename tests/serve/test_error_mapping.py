"""Client errors are mapped to HTTP once: an InvalidRequest raised by a check deep in the request path is
answered by the app's one handler, its field named as the route's body names it (the prompt field, the
prompt's index among several, the sampling fields' OpenAI names), in OpenAI's shape, and in Anthropic's on
/v1/messages; the server keeps serving."""

from __future__ import annotations

import httpx
import pytest

from max.interfaces.errors import InvalidRequest, PromptTooLong
from max.serve.invalid import FieldMap

MSG = [{"role": "user", "content": "hi"}]


def post(server, path, **kw):
    return httpx.post(server.url + path, timeout=30, **kw)


@pytest.fixture
def failing_tokenizer(server, monkeypatch):
    """The served tokenizer's new_context raises what the test puts in ``raise_[0]``."""
    tok = server.engine.tokenizer
    raise_: list = [None]

    async def new_context(request):
        raise raise_[0]

    monkeypatch.setattr(tok, "new_context", new_context)
    return raise_


def test_one_handler_for_invalid_request(server):
    handlers = server.app.exception_handlers
    assert InvalidRequest in handlers
    assert not any(issubclass(k, InvalidRequest) for k in handlers if isinstance(k, type) and k is not InvalidRequest)


def test_a_check_in_the_prompt_path_names_the_routes_field(server, failing_tokenizer):
    failing_tokenizer[0] = InvalidRequest("the image is unreadable", param="images", code="invalid_image",
                                          where="tokenizer")
    r = post(server, "/v1/chat/completions", json={"messages": MSG, "max_tokens": 2})
    assert r.status_code == 400, r.text
    assert r.json() == {"error": {"message": "the image is unreadable", "type": "invalid_request_error",
                                  "param": "messages", "code": "invalid_image"}}
    r = post(server, "/v1/completions", json={"prompt": ["a", "b"], "max_tokens": 2})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["message"], err["param"], err["code"]) == ("prompt[0]: the image is unreadable", "prompt",
                                                           "invalid_image")
    failing_tokenizer[0] = PromptTooLong("the prompt has 99 tokens", length=99, limit=4)
    r = post(server, "/v1/completions", json={"prompt": "a", "max_tokens": 2})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "context_length_exceeded" and r.json()["error"]["param"] == "prompt"
    failing_tokenizer[0] = InvalidRequest("min_new_tokens exceeds max_new_tokens", param="min_new_tokens")
    r = post(server, "/v1/chat/completions", json={"messages": MSG, "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens", r.text


def test_anthropic_route_keeps_its_shape(server, failing_tokenizer):
    failing_tokenizer[0] = InvalidRequest("the image is unreadable", param="images")
    r = post(server, "/v1/messages", json={"model": "tiny", "max_tokens": 2, "messages": MSG})
    assert r.status_code == 400, r.text
    assert r.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                   "message": "the image is unreadable"}}


def test_server_still_serves_after_client_errors(server, failing_tokenizer, monkeypatch):
    failing_tokenizer[0] = InvalidRequest("bad", param="prompt")
    assert post(server, "/v1/completions", json={"prompt": "a", "max_tokens": 2}).status_code == 400
    monkeypatch.undo()
    r = post(server, "/v1/completions", json={"prompt": "a", "max_tokens": 2})
    assert r.status_code == 200, r.text


def test_field_map():
    f = FieldMap(rename={"task": "model", None: "input"}, known=frozenset({"language"}), default="file")
    assert [f.param(p) for p in ("task", None, "language", "audio")] == ["model", "input", "language", "file"]
    assert FieldMap().param("x") == "x" and FieldMap(known=frozenset()).param("x") is None
