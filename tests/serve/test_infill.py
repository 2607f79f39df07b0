"""llama-server's routes: ``POST /infill`` (fill-in-the-middle) on a tiny random Llama whose tokenizer has
Qwen2.5-Coder's FIM tokens, checking the exact prompt token sequence the server builds, and
``POST /apply-template``."""

from __future__ import annotations

import json

import httpx
import pytest

from lm_support import make_tiny_llama, make_tokenizer

FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|file_sep|>", "<|repo_name|>")
PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def fim_server(tmp_path_factory):
    from max.entrypoints.cli import build_config
    from max.serve.server import ServerThread, build_app

    tok = make_tokenizer(extra_special=FIM)
    d = make_tiny_llama(str(tmp_path_factory.mktemp("tiny_fim")), tokenizer=tok, max_position_embeddings=1024)
    app = build_app(build_config(d, None, "cpu", 1024, 4), served_model_name="coder")
    with ServerThread(app) as srv:
        srv.tok = tok
        srv.engine = app.state.serve.generator
        seen: list[list[int]] = []
        submit = srv.engine.scheduler.submit

        def recording_submit(ctx, *a, **kw):  # the prompts the server hands to the scheduler
            seen.append([int(t) for t in ctx.prompt_tokens])
            return submit(ctx, *a, **kw)

        srv.engine.scheduler.submit = recording_submit
        srv.seen = seen
        yield srv


def _expected(tok, prefix, suffix, prompt="", extra=()):
    """The repository-level FIM layout, spelt out with the tokenizer's own ids."""
    sid = tok.convert_tokens_to_ids
    enc = lambda s: tok.encode(s, add_special_tokens=False) if s else []  # noqa: E731
    ids = [sid("<|repo_name|>"), *enc("myproject\n")]
    for name, text in extra:
        ids += [sid("<|file_sep|>"), *enc(name + "\n"), *enc(text)]
    ids += [sid("<|file_sep|>"), *enc("filename\n")]
    ids += [sid("<|fim_prefix|>"), *enc(prefix), *enc(prompt), sid("<|fim_suffix|>"), *enc(suffix),
            sid("<|fim_middle|>")]
    return ids


def test_infill_builds_the_fim_prompt(fim_server):
    tok = fim_server.tok
    extra = [("util.py", "def sub(a, b):\n    return a - b\n"), ("README", "adds numbers")]
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": "return",
            "input_extra": [{"filename": f, "text": t} for f, t in extra], "n_predict": 6, "temperature": 0,
            "return_tokens": True}
    fim_server.seen.clear()
    r = httpx.post(fim_server.url + "/infill", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    want = _expected(tok, PREFIX, SUFFIX, "return", extra)
    assert fim_server.seen == [want]
    assert out["tokens_evaluated"] == len(want) and out["truncated"] is False
    assert out["prompt"] == tok.decode(want)
    assert out["stop"] is True and out["tokens_predicted"] == 6 and out["stop_type"] == "limit"
    assert len(out["tokens"]) == 6 and out["content"] == tok.decode(out["tokens"], skip_special_tokens=True)
    # the same prompt as token ids through /v1/completions gives the same greedy text
    c = httpx.post(fim_server.url + "/v1/completions", json={"prompt": want, "max_tokens": 6, "temperature": 0},
                   timeout=60).json()
    assert c["choices"][0]["text"] == out["content"]
    # streamed: the chunks add up to the same text, the last one carries the totals
    with httpx.stream("POST", fim_server.url + "/infill", json={**body, "stream": True}, timeout=60) as s:
        events = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: ")]
    assert [e["stop"] for e in events][-1] is True and not any(e["stop"] for e in events[:-1])
    assert "".join(e["content"] for e in events) == out["content"]
    assert events[-1]["tokens_predicted"] == 6 and events[-1]["tokens_evaluated"] == len(want)


def test_infill_without_extra_and_with_a_stop_word(fim_server):
    tok = fim_server.tok
    fim_server.seen.clear()
    r = httpx.post(fim_server.url + "/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX,
                                                     "max_tokens": 12, "temperature": 0}, timeout=60).json()
    assert fim_server.seen == [_expected(tok, PREFIX, SUFFIX)]
    text = r["content"]
    stop = next(text[i:i + 2] for i in range(len(text) // 2, len(text) - 1) if text[i:i + 2].strip())
    s = httpx.post(fim_server.url + "/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX,
                                                     "max_tokens": 12, "temperature": 0, "stop": [stop]},
                   timeout=60).json()
    assert s["stop_type"] == "word" and s["stopping_word"] == stop and s["content"] == text[:text.index(stop)]


def test_infill_truncates_to_the_context(fim_server):
    """A prefix longer than the context loses its start; the prompt plus n_predict fit the context."""
    long_prefix = "x = 1\n" * 2000
    fim_server.seen.clear()
    r = httpx.post(fim_server.url + "/infill", json={"input_prefix": long_prefix, "input_suffix": SUFFIX,
                                                     "n_predict": 8, "temperature": 0}, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["truncated"] is True and out["tokens_evaluated"] == 1024 - 8
    ids = fim_server.seen[0]
    sid = fim_server.tok.convert_tokens_to_ids
    assert ids.count(sid("<|fim_prefix|>")) == 1 and ids[-1] == sid("<|fim_middle|>")
    suffix_ids = fim_server.tok.encode(SUFFIX, add_special_tokens=False)
    assert ids[-1 - len(suffix_ids):-1] == suffix_ids  # the short suffix is kept whole


def test_infill_needs_fim_tokens(server):
    r = httpx.post(server.url + "/infill", json={"input_prefix": "a", "input_suffix": "b"}, timeout=60)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "model_not_supported" and "FIM" in err["message"]


def test_apply_template(server):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    r = httpx.post(server.url + "/apply-template", json={"messages": msgs}, timeout=60)
    assert r.status_code == 200
    want = server.engine.tokenizer.delegate.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert r.json() == {"prompt": want}
    assert want.endswith("<|im_start|>assistant\n")
    # the chat route feeds exactly that text
    tok = httpx.post(server.url + "/tokenize", json={"messages": msgs}, timeout=60).json()
    assert tok["tokens"] == server.engine.tokenizer.delegate.encode(want, add_special_tokens=False)
    bad = httpx.post(server.url + "/apply-template", json={"prompt": "x"}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"


def test_fim_families_unit():
    """The token table: Code Llama's SentencePiece-spelt tokens, and the snippet layout without a separator."""
    from max.serve.fim import FimTokens, fim_tokens, infill_tokens

    vocab = {"\u2581<PRE>": 7, "\u2581<SUF>": 8, "\u2581<MID>": 9, "a": 1}
    fim = fim_tokens(vocab)
    assert fim == FimTokens(7, 8, 9, None, None)
    enc = lambda s: [ord(ch) for ch in s]  # noqa: E731 - one id per character
    p = infill_tokens(fim, enc, prefix="ab", suffix="c", extra=[("f", "zz")], bos=1)
    assert p.tokens == [*enc("\n\n--- snippet ---\n\n"), *enc("zz"), 1, 7, *enc("ab"), 8, *enc("c"), 9]
    q = infill_tokens(fim, enc, prefix="abcdefgh", suffix="ijkl", budget=3 + 6)
    assert q.truncated and q.tokens == [7, *enc("defgh"), 8, *enc("i"), 9]
    assert fim_tokens({"<fim_prefix>": 1, "<fim_suffix>": 2}) is None
