"""Several models in one ``max serve`` process (``--model-path`` repeated): requests are routed by their
``model``, ``/v1/models`` lists every model, an unknown one is a 404 ``model_not_found``, and
``--kv-cache-memory`` is the server's whole KV budget, split evenly.  Each model's greedy answer is
checked against transformers' ``generate`` on that model's own checkpoint."""

from __future__ import annotations

import httpx
import pytest

from lm_support import make_tiny_llama
from serve_support import served

MSG = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def second_model(tmp_path_factory):
    return make_tiny_llama(str(tmp_path_factory.mktemp("tiny_second")), seed=1)


def _reference(path: str, n: int) -> str:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    text = tok.apply_chat_template(MSG, add_generation_prompt=True, tokenize=False)
    ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def _metric(text: str, name: str) -> float:
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def test_two_models_in_one_server(tiny_model, second_model):
    kv = 512 * 1024  # 8 pages of this model's K/V (2 layers x K, V x 2 heads x 16 x 128 tokens x 4 bytes = 64 KiB)
    with served(tiny_model, "--served-model-name", "alpha", "--model-path", second_model, "--served-model-name",
                "beta", "--max-length", "256", "--max-batch-size", "2", "--kv-cache-memory", str(kv)) as (_, url):
        models = httpx.get(url + "/v1/models").json()["data"]
        assert [m["id"] for m in models] == ["alpha", "beta"]
        answers = {}
        for name in ("alpha", "beta"):
            r = httpx.post(url + "/v1/chat/completions", timeout=60, json={
                "model": name, "messages": MSG, "max_tokens": 8, "temperature": 0}).json()
            assert r["model"] == name
            answers[name] = r["choices"][0]["message"]["content"]
        assert answers["alpha"] == _reference(tiny_model, 8)
        assert answers["beta"] == _reference(second_model, 8)
        assert answers["alpha"] != answers["beta"]
        # no model: the first one; the other routes route too
        r = httpx.post(url + "/v1/chat/completions", timeout=60,
                       json={"messages": MSG, "max_tokens": 8, "temperature": 0}).json()
        assert r["model"] == "alpha" and r["choices"][0]["message"]["content"] == answers["alpha"]
        resp = httpx.post(url + "/v1/responses", timeout=60, json={"model": "beta", "input": MSG[0]["content"],
                                                                   "max_output_tokens": 8, "temperature": 0}).json()
        assert resp["model"] == "beta" and resp["output"][0]["content"][0]["text"] == answers["beta"]
        msg = httpx.post(url + "/v1/messages", timeout=60, json={"model": "beta", "messages": MSG, "max_tokens": 8,
                                                                 "temperature": 0}).json()
        assert msg["model"] == "beta" and msg["content"][0]["text"] == answers["beta"]
        assert httpx.get(url + "/v1/models/beta").json()["id"] == "beta"
        # an unknown model: OpenAI's 404 naming both
        bad = httpx.post(url + "/v1/chat/completions", timeout=60, json={"model": "gamma", "messages": MSG})
        assert bad.status_code == 404
        err = bad.json()["error"]
        assert err["code"] == "model_not_found" and "'alpha'" in err["message"] and "'beta'" in err["message"]
        assert httpx.get(url + "/v1/models/gamma").status_code == 404
        # the KV budget is split evenly: 4 pages each (one model alone would take all 8), 8 in all
        metrics = httpx.get(url + "/metrics").text
        assert _metric(metrics, "maxserve_kv_cache_pages_total") == 8
        assert _metric(metrics, "maxserve_kv_cache_capacity_bytes") == kv
        assert _metric(metrics, "maxserve_prefix_cache_queried_tokens") > 0


def test_kv_share_and_name_checks(tiny_model):
    from max.entrypoints.cli import build_config
    from max.serve.server import build_multi_app, kv_share

    assert kv_share(1000, None, 1) == (1000, None)
    assert kv_share(1000, None, 2) == (500, 0.45)
    assert kv_share(None, 0.6, 3) == (None, pytest.approx(0.2))
    cfgs = [build_config(tiny_model, None, "cpu", 256, 2) for _ in range(2)]
    with pytest.raises(ValueError, match="its own --served-model-name"):
        build_multi_app(cfgs, ["same", "same"])
    with pytest.raises(ValueError, match="one served name"):
        build_multi_app(cfgs, ["a"])
