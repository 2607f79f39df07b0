"""Fixtures of the serving tests: a tiny random Llama with a locally trained BPE tokenizer
(MODELS.md §6.2, ~0.2 M parameters, built in a few seconds) served by a real uvicorn
server on 127.0.0.1 in a background thread."""

from __future__ import annotations

import os

import pytest

from serve_support import MAX_LENGTH, make_tiny_bert, make_tiny_llama

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")
pytest.importorskip("httpx")

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    return make_tiny_llama(str(tmp_path_factory.mktemp("tiny_llama")))


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> str:
    return make_tiny_bert(str(tmp_path_factory.mktemp("tiny_bert")))


@pytest.fixture(scope="session")
def server(tiny_model):
    """A served tiny Llama (model id 'tiny'), shared by the tests of the session."""
    from max.entrypoints.cli import build_config
    from max.serve.server import ServerThread, build_app

    app = build_app(build_config(tiny_model, None, "cpu", MAX_LENGTH, 16), served_model_name="tiny")
    with ServerThread(app) as srv:
        srv.state = app.state.serve
        srv.engine = app.state.serve.generator
        yield srv


@pytest.fixture(scope="session")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
