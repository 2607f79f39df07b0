"""``/v1/rerank`` and ``/v1/score`` through ``max serve``: a tiny random cross-encoder
(``BertForSequenceClassification``) against transformers on the same weights, an embeddings model
(cosine similarity), and Qwen3-Reranker-style causal scoring on a tiny random Llama against
transformers' last-position logits."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
import torch

from lm_support import make_tiny_cross_encoder, make_tiny_llama, make_tokenizer

QUERY = "the cat sat on the mat"
DOCS = ["a dog sat on a mat", "hello world", "good morning sun", "the cat was on the mat with a dog", "it is"]


def _serve(path: str, name: str, max_length=None):
    from max.entrypoints.cli import build_config
    from max.serve.server import ServerThread, build_app

    app = build_app(build_config(path, None, "cpu", max_length, 4), served_model_name=name)
    srv = ServerThread(app)
    srv.app = app
    return srv


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    path = make_tiny_cross_encoder(str(tmp_path_factory.mktemp("tiny_ce")))
    with _serve(path, "ce") as srv:
        srv.path = path
        yield srv


def _ce_reference(path: str, pairs: list[tuple[str, str]]) -> np.ndarray:
    import transformers

    model = transformers.BertForSequenceClassification.from_pretrained(path, torch_dtype=torch.float64).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    enc = tok([a for a, _ in pairs], [b for _, b in pairs], padding=True, return_tensors="pt")
    with torch.no_grad():
        return torch.sigmoid(model(**enc).logits[:, 0]).numpy()


def test_rerank_scores_equal_transformers(cross_encoder):
    ref = _ce_reference(cross_encoder.path, [(QUERY, d) for d in DOCS])
    r = httpx.post(cross_encoder.url + "/v1/rerank", json={"model": "ce", "query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "ce" and body["id"].startswith("rerank-") and body["usage"]["total_tokens"] > 20
    res = body["results"]
    assert sorted(x["index"] for x in res) == list(range(len(DOCS)))
    assert [x["index"] for x in res] == list(np.argsort(-ref, kind="stable"))  # best first
    for x in res:
        assert x["relevance_score"] == pytest.approx(ref[x["index"]], abs=2e-5)
        assert x["document"] == {"text": DOCS[x["index"]]}
    # top_n, return_documents=false and Cohere's {"text": ...} documents
    r = httpx.post(cross_encoder.url + "/v1/rerank", json={"query": QUERY, "top_n": 2, "return_documents": False,
                                                          "documents": [{"text": d} for d in DOCS]})
    top = r.json()["results"]
    assert [x["index"] for x in top] == [x["index"] for x in res[:2]] and all("document" not in x for x in top)


def test_score_pairs_like_vllm(cross_encoder):
    ref = _ce_reference(cross_encoder.path, [(QUERY, d) for d in DOCS[:3]] + [("hello", "world")])
    one_to_many = httpx.post(cross_encoder.url + "/v1/score", json={"text_1": QUERY, "text_2": DOCS[:3]}).json()
    assert one_to_many["object"] == "list" and [d["index"] for d in one_to_many["data"]] == [0, 1, 2]
    np.testing.assert_allclose([d["score"] for d in one_to_many["data"]], ref[:3], atol=2e-5)
    zipped = httpx.post(cross_encoder.url + "/v1/score", json={"text_1": [QUERY, "hello"],
                                                              "text_2": [DOCS[0], "world"]}).json()
    np.testing.assert_allclose([d["score"] for d in zipped["data"]], ref[[0, 3]], atol=2e-5)
    single = httpx.post(cross_encoder.url + "/v1/score", json={"text_1": "hello", "text_2": "world"}).json()
    assert single["data"][0]["score"] == pytest.approx(ref[3], abs=2e-5)


@pytest.mark.parametrize("path,body,param", [
    ("/v1/rerank", {"documents": ["a"]}, "query"),
    ("/v1/rerank", {"query": "q", "documents": []}, "documents"),
    ("/v1/rerank", {"query": "q", "documents": [5]}, "documents[0]"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ("/v1/rerank", {"query": "q", "documents": ["cat " * 80]}, None),  # longer than the model's input
    ("/v1/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_2"),
    ("/v1/score", {"text_1": [], "text_2": ["a"]}, "text_1"),
    ("/v1/score", {"text_1": "a"}, "text_2"),
    ("/v1/embeddings", {"input": "hello"}, "model"),  # a cross-encoder embeds nothing
])
def test_bad_requests_are_400(cross_encoder, path, body, param):
    r = httpx.post(cross_encoder.url + path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]


def test_unknown_model_is_404(cross_encoder):
    r = httpx.post(cross_encoder.url + "/v1/rerank", json={"model": "x", "query": "q", "documents": ["a"]})
    assert r.status_code == 404


def test_embeddings_model_scores_cosine_similarity(tiny_bert):
    with _serve(tiny_bert, "bert") as srv:
        pipe = srv.app.state.serve.embedder.pipeline
        vecs, _ = pipe.encode_texts([QUERY] + DOCS[:2])
        want = [float(np.dot(vecs[0], v) / np.linalg.norm(vecs[0]) / np.linalg.norm(v)) for v in vecs[1:]]
        r = httpx.post(srv.url + "/v1/score", json={"text_1": QUERY, "text_2": DOCS[:2]}).json()
        np.testing.assert_allclose([d["score"] for d in r["data"]], want, atol=1e-5)


def test_causal_reranker_scores_equal_transformers(tmp_path):
    """Qwen3-Reranker-style scoring: softmax over the logits of "no" and "yes" after the reranker prompt."""
    from transformers import AutoModelForCausalLM

    from max.interfaces import SamplingParams, TextGenerationRequest
    from max.serve.routes.scoring import causal_prompt

    path = make_tiny_llama(str(tmp_path), tokenizer=make_tokenizer(extra_special=("yes", "no")),
                           max_position_embeddings=1024)
    docs = DOCS[:3]
    with _serve(path, "rr", 1024) as srv:
        r = httpx.post(srv.url + "/v1/rerank", json={"query": QUERY, "documents": docs}, timeout=60)
        assert r.status_code == 200, r.text
        got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
        s = httpx.post(srv.url + "/v1/score", json={"text_1": QUERY, "text_2": docs[0], "instruction": "Find cats"},
                       timeout=60).json()["data"][0]["score"]
        tok = srv.app.state.serve.generator.tokenizer
        yes, no = tok.delegate.convert_tokens_to_ids("yes"), tok.delegate.convert_tokens_to_ids("no")

        def ids(prompt):
            req = TextGenerationRequest(request_id="x", model_name="rr", prompt=prompt,
                                        sampling_params=SamplingParams(max_new_tokens=1))
            return [int(t) for t in asyncio.run(tok.new_context(req)).prompt_tokens]

        prompts = [causal_prompt(QUERY, d) for d in docs] + [causal_prompt(QUERY, docs[0], "Find cats")]
        rows = [ids(p) for p in prompts]
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float64).eval()
    ref = []
    for row in rows:
        with torch.no_grad():
            last = model(torch.tensor([row])).logits[0, -1]
        ref.append(torch.softmax(last[[no, yes]], 0)[1].item())
    np.testing.assert_allclose([got[i] for i in range(len(docs))] + [s], ref, atol=1e-4)
    assert np.ptp(ref) > 1e-4  # the documents are told apart
