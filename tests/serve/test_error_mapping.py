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


def _internal(r: httpx.Response) -> None:
    assert r.status_code == 500, r.text
    err = r.json()["error"]
    assert err["code"] == "internal_error" and "our bug" not in err["message"], err


def test_our_own_value_error_is_a_500_with_a_logged_trace(server, failing_tokenizer, monkeypatch, caplog):
    """A ValueError (or TypeError) from our code in the request path is the server's fault: 500, the traceback in
    the log, the client told only a reference; the next request is served."""
    for exc in (ValueError("our bug"), TypeError("our bug")):
        failing_tokenizer[0] = exc
        caplog.clear()
        with caplog.at_level("ERROR", logger="max.serve"):
            _internal(post(server, "/v1/chat/completions", json={"messages": MSG, "max_tokens": 2}))
        logged = [rec for rec in caplog.records if rec.exc_info and rec.exc_info[1] is exc]
        assert logged, [rec.getMessage() for rec in caplog.records]
    monkeypatch.undo()
    r = post(server, "/v1/chat/completions", json={"messages": MSG, "max_tokens": 2})
    assert r.status_code == 200, r.text


def test_embeddings_value_error_is_a_500_client_errors_400():
    import numpy as np

    from max.serve.app import EmbeddingsEngine, create_app
    from max.serve.server import ServerThread

    class Pipeline:
        raise_: BaseException = ValueError("our bug")

        def encode_texts(self, texts):
            if self.raise_ is not None:
                raise self.raise_
            return np.ones((len(texts), 4), np.float32), len(texts)

    pipe = Pipeline()
    with ServerThread(create_app("emb", embedder=EmbeddingsEngine(pipe))) as srv:
        _internal(post(srv, "/v1/embeddings", json={"input": "hello", "model": "emb"}))
        pipe.raise_ = PromptTooLong("input 0 has 9 tokens, more than 4", length=9, limit=4, param="input")
        r = post(srv, "/v1/embeddings", json={"input": "hello", "model": "emb"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "input", r.text
        assert r.json()["error"]["code"] == "context_length_exceeded"
        pipe.raise_ = None
        r = post(srv, "/v1/embeddings", json={"input": "hello", "model": "emb"})
        assert r.status_code == 200 and len(r.json()["data"]) == 1, r.text


def test_chat_template_errors_are_the_clients(server, monkeypatch):
    """A template that rejects the client's messages (raise_exception) is a 400 about messages."""
    tok = server.engine.tokenizer
    monkeypatch.setattr(tok.delegate, "chat_template",
                        "{% if messages[0]['role'] != 'system' %}{{ raise_exception('a system message first') }}"
                        "{% endif %}{{ messages[0]['content'] }}")
    r = post(server, "/v1/chat/completions", json={"messages": MSG, "max_tokens": 2})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages" and "a system message first" in err["message"], err


def test_template_errors_on_tokenize_and_count_tokens(server, monkeypatch):
    tok = server.engine.tokenizer
    monkeypatch.setattr(tok.delegate, "chat_template", "{{ raise_exception('no users here') }}")
    r = post(server, "/tokenize", json={"messages": MSG})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    assert "no users here" in r.json()["error"]["message"]
    r = post(server, "/v1/messages/count_tokens", json={"model": "tiny", "messages": MSG})
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "no users here" in body["error"]["message"]
