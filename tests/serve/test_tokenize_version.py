"""``/v1/tokenize`` and ``/v1/detokenize`` (vLLM's shapes, also at ``/tokenize`` / ``/detokenize``) and
``/version``: ids equal the Hugging Face tokenizer's, chat messages go through the chat template as
``/v1/chat/completions`` renders them, and tokenize round-trips with detokenize."""

from __future__ import annotations

import httpx
import pytest

MSG = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "What is the capital of France?"}]


def post(server, path, body):
    return httpx.post(server.url + path, json=body, timeout=30)


@pytest.fixture(scope="module")
def hf_tok(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.mark.parametrize("prefix", ["/v1", ""])
def test_tokenize_prompt_matches_the_tokenizer_and_round_trips(server, hf_tok, prefix):
    text = "The quick brown fox jumps over 13 lazy dogs. Ünïcödé ✓"
    r = post(server, f"{prefix}/tokenize", {"model": "tiny", "prompt": text, "return_token_strs": True})
    assert r.status_code == 200, r.text
    body = r.json()
    want = hf_tok(text)["input_ids"]
    assert body["tokens"] == want and body["count"] == len(want) and body["max_model_len"] == 256
    assert body["token_strs"] == hf_tok.convert_ids_to_tokens(want)
    back = post(server, f"{prefix}/detokenize", {"model": "tiny", "tokens": body["tokens"]})
    assert back.status_code == 200, back.text
    assert back.json() == {"prompt": hf_tok.decode(want)}
    assert back.json()["prompt"].endswith(text)
    plain = post(server, f"{prefix}/tokenize", {"prompt": text}).json()
    assert plain["token_strs"] is None and plain["tokens"] == want


def test_tokenize_chat_messages_use_the_chat_template(server, client, hf_tok):
    r = post(server, "/v1/tokenize", {"model": "tiny", "messages": MSG})
    assert r.status_code == 200, r.text
    rendered = hf_tok.apply_chat_template(MSG, add_generation_prompt=True, tokenize=False)
    assert rendered.endswith("<|im_start|>assistant\n")
    assert r.json()["tokens"] == hf_tok(rendered, add_special_tokens=False)["input_ids"]
    # the same count the chat endpoint bills as prompt tokens
    usage = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=1).usage
    assert usage.prompt_tokens == r.json()["count"]
    no_gen = post(server, "/v1/tokenize", {"messages": MSG, "add_generation_prompt": False}).json()
    assert no_gen["count"] < r.json()["count"]
    assert r.json()["tokens"][:no_gen["count"]] == no_gen["tokens"]
    text = post(server, "/v1/detokenize", {"tokens": r.json()["tokens"]}).json()["prompt"]
    assert text == hf_tok.apply_chat_template(MSG, add_generation_prompt=True, tokenize=False)


@pytest.mark.parametrize("path,body,param", [
    ("/v1/tokenize", {}, "prompt"),
    ("/v1/tokenize", {"prompt": "a", "messages": MSG}, "messages"),
    ("/v1/tokenize", {"messages": []}, "messages"),
    ("/v1/tokenize", {"prompt": 5}, "prompt"),
    ("/v1/tokenize", {"messages": [{"role": "user"}]}, "messages[0].content"),
    ("/v1/detokenize", {"tokens": [1, 10**9]}, "tokens"),
    ("/v1/detokenize", {"tokens": [-1]}, "tokens"),
    ("/v1/detokenize", {"tokens": "abc"}, "tokens"),
    ("/detokenize", {}, "tokens"),
])
def test_tokenize_errors_are_openai_shaped_400s(server, path, body, param):
    r = post(server, path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_tokenize_unknown_model_is_404(server):
    assert post(server, "/v1/tokenize", {"model": "nope", "prompt": "a"}).status_code == 404


def test_version(server):
    from max.serve.routes.version import server_version

    for path in ("/version", "/v1/version"):
        r = httpx.get(server.url + path, timeout=10)
        assert r.status_code == 200 and r.json() == {"version": server_version()}
    assert server_version()[0].isdigit()


def test_tokenize_needs_the_api_key_at_both_paths(server):
    server.state.api_key = "sekrit"
    try:
        for path in ("/v1/tokenize", "/tokenize"):
            assert post(server, path, {"prompt": "a"}).status_code == 401
            ok = httpx.post(server.url + path, json={"prompt": "a"}, headers={"Authorization": "Bearer sekrit"})
            assert ok.status_code == 200
        assert httpx.get(server.url + "/version").status_code == 200  # like /health: no key
    finally:
        server.state.api_key = None


def test_root_aliases_count_as_their_v1_endpoint_in_metrics(server):
    from max.serve.middleware import endpoint_of

    assert endpoint_of("/tokenize") == "/v1/tokenize" and endpoint_of("/detokenize") == "/v1/detokenize"
    assert endpoint_of("/nope") == "other"

    def count(label: str) -> float:
        text = httpx.get(server.url + "/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith("maxserve_requests_total{") and f'endpoint="{label}"' in line \
                    and 'status="200"' in line:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    before, other = count("/v1/tokenize"), count("other")
    assert post(server, "/tokenize", {"prompt": "a"}).status_code == 200
    assert count("/v1/tokenize") == before + 1 and count("other") == other
