"""LoRA adapters through ``max serve``: PEFT folders made in the test on a tiny random Llama; requests with
different adapters and none share one batch and each equals ``peft`` within 1e-4 (prompt log
probabilities over every position); adapters load and unload at run time; bad names are 400s."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from lm_support import make_tiny_llama

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

PROMPT = "def forward(self, hidden_states): return self.norm(hidden_states)"
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _adapter(base_dir, out, seed, rank, targets, **kw):
    torch.manual_seed(seed)
    m = peft.get_peft_model(transformers.AutoModelForCausalLM.from_pretrained(base_dir),
                            peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, **kw))
    for n, p in m.named_parameters():
        if "lora_B" in n:  # peft starts B at zero (a no-op adapter): make it count
            torch.nn.init.normal_(p, std=0.2)
    m.save_pretrained(out)
    return m.eval()


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory):
    from max.entrypoints.cli import build_config
    from max.serve.server import ServerThread, build_app

    root = tmp_path_factory.mktemp("lora")
    d = make_tiny_llama(str(root / "base"))
    refs = {None: transformers.AutoModelForCausalLM.from_pretrained(d).eval(),
            "sql": _adapter(d, str(root / "sql"), 1, 4, ["q_proj", "v_proj"]),
            "chat": _adapter(d, str(root / "chat"), 2, 8, ALL, use_rslora=True)}
    _adapter(d, str(root / "late"), 3, 2, ALL)
    cfg = build_config(d, None, "cpu", 256, 8, enable_echo=True, enable_lora=True, max_num_loras=3,
                       max_lora_rank=8, lora_paths=[f"sql={root / 'sql'}", f"chat={root / 'chat'}"])
    app = build_app(cfg, served_model_name="tiny")
    with ServerThread(app) as srv:
        srv.refs, srv.root = refs, root
        srv.tokenizer = app.state.serve.generator.tokenizer
        srv.scheduler = app.state.serve.generator.scheduler
        yield srv


def _post(srv, path, body):
    return httpx.post(srv.url + path, json=body, timeout=60)


def _prompt_lp(srv, model):
    r = _post(srv, "/v1/completions", {"model": model, "prompt": PROMPT, "max_tokens": 1, "prompt_logprobs": 1})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["prompt_logprobs"]


def _check(srv, adapter, plp):
    ids = srv.tokenizer.encode_sync(PROMPT).tolist()
    with torch.no_grad():
        ref = torch.log_softmax(srv.refs[adapter](torch.as_tensor([ids])).logits[0].double(), dim=-1)
    for i in range(1, len(ids)):
        assert abs(plp[i][str(ids[i])]["logprob"] - float(ref[i - 1, ids[i]])) < 1e-4, (adapter, i)


def test_adapters_and_base_in_one_batch_match_peft(lora_server):
    srv = lora_server
    results = {}

    def run(model):
        results[model] = _prompt_lp(srv, model)

    models = ["sql", "chat", "tiny", "sql"]
    threads = [threading.Thread(target=run, args=(m,)) for m in models[:3]]
    with srv.scheduler.exclusive():  # all three wait, then share the first step
        for t in threads:
            t.start()
        t0 = time.monotonic()
        while srv.scheduler.queue_depth < 3:
            assert time.monotonic() - t0 < 20
            time.sleep(0.01)
    for t in threads:
        t.join()
    _check(srv, "sql", results["sql"])
    _check(srv, "chat", results["chat"])
    _check(srv, None, results["tiny"])
    assert results["sql"][1] != results["tiny"][1]  # the adapter changes the model


def test_load_and_unload_at_run_time(lora_server):
    srv = lora_server
    ids = [m["id"] for m in httpx.get(srv.url + "/v1/models").json()["data"]]
    assert ids == ["tiny", "chat", "sql"]
    r = _post(srv, "/v1/load_lora_adapter", {"lora_name": "late", "lora_path": str(srv.root / "late")})
    assert r.status_code == 200, r.text
    late = _prompt_lp(srv, "late")
    assert late[1] != _prompt_lp(srv, "tiny")[1]
    assert _post(srv, "/v1/load_lora_adapter", {"lora_name": "late", "lora_path": str(srv.root / "late")}
                 ).json()["error"]["code"] == "load_name_exists"
    r = _post(srv, "/v1/load_lora_adapter", {"lora_name": "more", "lora_path": str(srv.root / "late")})
    assert r.status_code == 400 and "slots" in r.json()["error"]["message"]  # max_num_loras = 3
    assert _post(srv, "/v1/unload_lora_adapter", {"lora_name": "late"}).status_code == 200
    r = _post(srv, "/v1/completions", {"model": "late", "prompt": "x", "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    _check(srv, "sql", _prompt_lp(srv, "sql"))  # the other slots are untouched


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "x"}]}, "model"),
    ("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/no/such/folder"}, "lora_path"),
    ("/v1/unload_lora_adapter", {"lora_name": "never-loaded"}, "lora_name"),
    ("/v1/load_lora_adapter", {"lora_name": "x"}, "lora_path"),
])
def test_bad_adapter_requests_are_400(lora_server, path, body, param):
    r = _post(lora_server, path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_prefix_cache_pages_are_not_shared_across_adapters(lora_server):
    """A prompt longer than a KV page, served first without and then with an adapter (and back): each
    answer is the one its own model gives (pages computed under one adapter are never reused by another)."""
    srv = lora_server
    prompt = "x = self.norm(hidden_states)\n" * 11
    ids = srv.tokenizer.encode_sync(prompt).tolist()
    assert len(ids) > 128
    for model, ref in (("tiny", None), ("sql", "sql"), ("tiny", None), ("chat", "chat")):
        r = _post(srv, "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0,
                                           "ignore_eos": True})
        assert r.status_code == 200, r.text
        got = r.json()["choices"][0]["text"]
        with torch.no_grad():
            out = srv.refs[ref].generate(torch.as_tensor([ids]), max_new_tokens=4, do_sample=False,
                                         eos_token_id=None, pad_token_id=0)
        want = srv.tokenizer.decode_sync(out[0, len(ids):].tolist(), skip_special_tokens=True)
        assert got == want, model  # the last step flushes even an incomplete UTF-8 character
