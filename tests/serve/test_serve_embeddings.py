"""``/v1/embeddings`` against a test double of ``EmbeddingsPipeline.encode_texts`` (the real pipeline lands
separately), and ``build_app`` picking the embeddings path from the model's task."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest

DIM = 8


class FakeEmbeddingsPipeline:
    """``encode_texts(texts) -> (float32 (n, DIM), total prompt tokens)``: unit vectors seeded by the text."""

    def __init__(self):
        self.calls = []

    def encode_texts(self, texts):
        self.calls.append(list(texts))
        rows = []
        for t in texts:
            seed = sum(map(ord, t)) if isinstance(t, str) else sum(t)
            v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
            rows.append(v / np.linalg.norm(v))
        return np.stack(rows), sum(len(t.split()) if isinstance(t, str) else len(t) for t in texts)


@pytest.fixture(scope="module")
def emb_server():
    from max.serve.app import EmbeddingsEngine, create_app
    from max.serve.server import ServerThread

    fake = FakeEmbeddingsPipeline()
    app = create_app("tiny-embed", embedder=EmbeddingsEngine(fake))
    with ServerThread(app) as srv:
        srv.fake = fake
        yield srv


def test_embeddings_float_and_base64_via_openai_client(emb_server):
    c = openai.OpenAI(base_url=emb_server.url + "/v1", api_key="x", max_retries=0)
    want = FakeEmbeddingsPipeline().encode_texts(["hello world", "good morning sun"])[0]
    r = c.embeddings.create(model="tiny-embed", input=["hello world", "good morning sun"], encoding_format="float")
    assert [d.index for d in r.data] == [0, 1] and r.model == "tiny-embed"
    np.testing.assert_allclose(np.array([d.embedding for d in r.data]), want, rtol=1e-6)
    assert r.usage.prompt_tokens == 5 and r.usage.total_tokens == 5
    r64 = c.embeddings.create(model="tiny-embed", input="hello world")  # the client asks for base64 and decodes it
    np.testing.assert_allclose(np.array(r64.data[0].embedding), want[0], rtol=1e-6)


def test_embeddings_raw_shapes(emb_server):
    r = httpx.post(emb_server.url + "/v1/embeddings", json={"input": "a b c", "encoding_format": "base64"})
    d = r.json()
    assert r.status_code == 200 and d["object"] == "list" and d["data"][0]["object"] == "embedding"
    vec = np.frombuffer(base64.b64decode(d["data"][0]["embedding"]), dtype="<f4")
    assert vec.shape == (DIM,)
    r = httpx.post(emb_server.url + "/v1/embeddings", json={"input": ["a", "b"], "dimensions": 4})
    e = np.array([x["embedding"] for x in r.json()["data"]])
    assert e.shape == (2, 4) and np.allclose(np.linalg.norm(e, axis=1), 1, atol=1e-5)


@pytest.mark.parametrize("body,status,param", [
    ({}, 400, "input"),
    ({"input": 3}, 400, "input"),
    ({"input": []}, 400, "input"),
    ({"input": [""]}, 400, "input"),
    ({"input": [[1, 2], []]}, 400, "input"),
    ({"input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
    ({"input": "x", "dimensions": 99}, 400, "dimensions"),
    ({"input": "x", "model": "other"}, 404, "model"),
])
def test_embeddings_errors(emb_server, body, status, param):
    r = httpx.post(emb_server.url + "/v1/embeddings", json=body)
    assert r.status_code == status and r.json()["error"]["param"] == param


def test_token_id_inputs(emb_server):
    r = httpx.post(emb_server.url + "/v1/embeddings", json={"input": [5, 6, 7]})
    assert r.status_code == 200 and len(r.json()["data"]) == 1 and r.json()["usage"]["prompt_tokens"] == 3
    r = httpx.post(emb_server.url + "/v1/embeddings", json={"input": [[5, 6], [7]]})
    assert r.status_code == 200 and len(r.json()["data"]) == 2
    assert emb_server.fake.calls[-1] == [[5, 6], [7]]


def test_generation_routes_on_an_embeddings_model_are_400(emb_server):
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/completions", {"prompt": "hi"})):
        r = httpx.post(emb_server.url + path, json=body)
        assert r.status_code == 400 and "embeddings model" in r.json()["error"]["message"]
    assert httpx.get(emb_server.url + "/health").json() == {"status": "ok"}
    assert httpx.get(emb_server.url + "/v1/models").json()["data"][0]["id"] == "tiny-embed"


def test_build_app_serves_embeddings_for_an_embeddings_task(tiny_model, monkeypatch):
    from max.entrypoints.cli import build_config
    from max.interfaces import PipelineTask
    from max.pipelines.lib import registry
    from max.serve.server import ServerThread, build_app

    fake = FakeEmbeddingsPipeline()
    asked = {}

    def retrieve(cfg, task=PipelineTask.TEXT_GENERATION, override_architecture=None):
        asked["task"] = task
        return object(), fake

    monkeypatch.setattr(registry.PIPELINE_REGISTRY, "retrieve_pipeline_task",
                        lambda cfg: PipelineTask.EMBEDDINGS_GENERATION)
    monkeypatch.setattr(registry.PIPELINE_REGISTRY, "retrieve", retrieve)
    app = build_app(build_config(tiny_model, None, "cpu", 64, 2), served_model_name="emb")
    assert asked["task"] == PipelineTask.EMBEDDINGS_GENERATION
    with ServerThread(app) as srv:
        r = httpx.post(srv.url + "/v1/embeddings", json={"input": "hello"})
        assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == DIM


def test_real_embeddings_pipeline_tiny_bert(tiny_bert):
    """The registry's EmbeddingsPipeline (a tiny random BERT) served end to end."""
    from max.entrypoints.cli import build_config
    from max.serve.server import ServerThread, build_app

    app = build_app(build_config(tiny_bert, None, "cpu", None, 4), served_model_name="bert")
    pipe = app.state.serve.embedder.pipeline
    texts = ["the cat sat on the mat", "a dog", "hello world"]
    want, n_tokens = pipe.encode_texts(texts)
    with ServerThread(app) as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        r = c.embeddings.create(model="bert", input=texts)
        got = np.array([d.embedding for d in r.data], dtype=np.float32)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert r.usage.prompt_tokens == n_tokens
        assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-4)
        r = httpx.post(srv.url + "/v1/embeddings", json={"input": "word " * 200})
        assert r.status_code == 400 and r.json()["error"]["param"] == "input"  # longer than the model's input
        r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_supported"
