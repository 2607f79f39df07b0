"""``max serve`` options from the vLLM / llama-server world: ``--reasoning-parser`` (``<think>`` text in
``reasoning_content``, full answers and streamed deltas), ``--allowed-origins`` (CORS),
``--chat-template FILE``, and ``--max-queue-size``'s help showing its default."""

from __future__ import annotations

import re

import httpx
import pytest
from click.testing import CliRunner

from serve_support import MAX_LENGTH

MSG = [{"role": "user", "content": "What is two plus two?"}]
# random weights: the output is forced by a regex so it has a think block
THINK_RE = r"<think>[a-z]{3,6} [a-z]{3,6}</think>[A-Z][a-z]{2,6}\."


@pytest.fixture(scope="module")
def opt_server(tiny_model, tmp_path_factory):
    from max.entrypoints.cli import build_config
    from max.serve.server import ServerThread, build_app

    tpl = tmp_path_factory.mktemp("tpl") / "chat.jinja"
    tpl.write_text("{% for m in messages %}<<{{ m['role'] }}>>{{ m['content'] }}\n{% endfor %}"
                   "{% if add_generation_prompt %}<<assistant>>{% endif %}")
    cfg = build_config(tiny_model, None, "cpu", MAX_LENGTH, 4, chat_template=str(tpl))
    app = build_app(cfg, served_model_name="tiny", reasoning_parser="qwen3",
                    allowed_origins=["http://localhost:3000"])
    with ServerThread(app) as srv:
        srv.state = app.state.serve
        yield srv


@pytest.fixture(scope="module")
def oclient(opt_server):
    import openai

    return openai.OpenAI(base_url=opt_server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _kw(**extra):
    return dict(model="tiny", messages=MSG, max_tokens=40, temperature=0, extra_body={"guided_regex": THINK_RE},
                **extra)


def test_reasoning_content_in_the_full_answer(oclient):
    msg = oclient.chat.completions.create(**_kw()).choices[0].message
    reasoning = msg.model_extra["reasoning_content"]
    assert re.fullmatch(r"[a-z]{3,6} [a-z]{3,6}", reasoning), reasoning
    assert re.fullmatch(r"[A-Z][a-z]{2,6}\.", msg.content), msg.content
    assert "<think>" not in msg.content and "</think>" not in msg.content


def test_reasoning_content_in_streamed_deltas(oclient):
    full = oclient.chat.completions.create(**_kw()).choices[0].message
    reasoning, content, n_reasoning_chunks = "", "", 0
    for ch in oclient.chat.completions.create(**_kw(stream=True)):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        r = (d.model_extra or {}).get("reasoning_content")
        if r:
            reasoning += r
            n_reasoning_chunks += 1
        content += d.content or ""
    assert reasoning == full.model_extra["reasoning_content"] and content == full.content
    assert n_reasoning_chunks >= 2  # streamed as it is written, not at the end


def test_deepseek_r1_parser_counts_unclosed_output_as_reasoning(opt_server, oclient):
    opt_server.state.reasoning_parser = "deepseek_r1"
    try:
        msg = oclient.chat.completions.create(model="tiny", messages=MSG, max_tokens=6, temperature=0,
                                              extra_body={"ignore_eos": True}).choices[0].message
        assert msg.content is None and msg.model_extra["reasoning_content"]
    finally:
        opt_server.state.reasoning_parser = "qwen3"


def test_no_reasoning_parser_keeps_think_in_content(server, client):
    msg = client.chat.completions.create(**_kw()).choices[0].message
    assert msg.content.startswith("<think>") and "reasoning_content" not in (msg.model_extra or {})


def test_chat_template_file_overrides_the_models(opt_server):
    r = httpx.post(opt_server.url + "/v1/tokenize", json={"messages": MSG}, timeout=30)
    text = httpx.post(opt_server.url + "/v1/detokenize", json={"tokens": r.json()["tokens"]}, timeout=30).json()
    assert text["prompt"] == "<<user>>What is two plus two?\n<<assistant>>"


def test_cors_preflight_and_simple_request(opt_server, server):
    origin = {"Origin": "http://localhost:3000"}
    pre = httpx.options(opt_server.url + "/v1/chat/completions", timeout=10, headers={
        **origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert pre.status_code == 200, pre.text
    assert pre.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert "POST" in pre.headers["access-control-allow-methods"]
    r = httpx.get(opt_server.url + "/v1/models", headers=origin, timeout=10)
    assert r.headers["access-control-allow-origin"] == "http://localhost:3000"
    other = httpx.get(opt_server.url + "/v1/models", headers={"Origin": "http://evil.example"}, timeout=10)
    assert "access-control-allow-origin" not in other.headers
    # the preflight carries no Authorization header: it must not meet the API key check
    opt_server.state.api_key = "sekrit"
    try:
        pre = httpx.options(opt_server.url + "/v1/chat/completions", timeout=10, headers={
            **origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://localhost:3000"
        denied = httpx.get(opt_server.url + "/v1/models", headers=origin, timeout=10)
        assert denied.status_code == 401  # the browser can read the 401 too
        assert denied.headers["access-control-allow-origin"] == "http://localhost:3000"
    finally:
        opt_server.state.api_key = None
    # without --allowed-origins there is no CORS
    plain = httpx.get(server.url + "/v1/models", headers=origin, timeout=10)
    assert "access-control-allow-origin" not in plain.headers


def test_parse_origins():
    from max.serve.app import parse_origins

    assert parse_origins('["http://a:1", "https://b/"]') == ["http://a:1", "https://b"]
    assert parse_origins("http://a:1, https://b") == ["http://a:1", "https://b"]
    assert parse_origins("*") == ["*"]
    for bad in ("[1]", "ftp://x", "[", ""):
        with pytest.raises(ValueError):
            parse_origins(bad)


def _help(cmd):
    from max.entrypoints.cli import main

    return CliRunner().invoke(main, [cmd, "--help"], terminal_width=200).output


def test_serve_help_shows_the_new_options_and_queue_default():
    out = " ".join(_help("serve").split())
    assert re.search(r"--max-queue-size [^-]*Retry-After \(default: no bound", out), out
    for opt in ("--allowed-origins", "--reasoning-parser [deepseek_r1|qwen3]", "--chat-template"):
        assert opt in out
    assert "--chat-template" in _help("generate")


@pytest.mark.parametrize("args,needle", [
    (["--allowed-origins", "ftp://x"], "--allowed-origins"),
    (["--reasoning-parser", "granite"], "--reasoning-parser"),
    (["--chat-template", "/nonexistent/t.jinja"], "--chat-template"),
])
def test_serve_option_errors_before_loading(args, needle, tiny_model):
    from max.entrypoints.cli import main

    r = CliRunner().invoke(main, ["serve", "--model-path", tiny_model, *args])
    assert r.exit_code == 2 and needle in r.output, r.output


def test_max_serve_prints_the_kv_cache_line_once(tiny_model, monkeypatch):
    import logging

    import max.serve.server as server_mod
    from max.entrypoints.cli import main

    ran = []
    monkeypatch.setattr(server_mod, "serve", lambda app, *a, **k: ran.append(app))  # start-up only
    monkeypatch.setattr(logging.getLogger("max.nn.kv_cache"), "level", logging.DEBUG)
    handler_out = []

    class Capture(logging.Handler):
        def emit(self, record):
            handler_out.append(record.getMessage())

    h = Capture(level=logging.INFO)  # what `max serve --log-level info` shows
    logging.getLogger().addHandler(h)
    try:
        r = CliRunner().invoke(main, ["serve", "--model-path", tiny_model, "--devices", "cpu", "--max-length", "64",
                                      "--max-batch-size", "2"])
    finally:
        logging.getLogger().removeHandler(h)
    assert r.exit_code == 0 and ran, r.output
    printed = [ln for ln in r.output.splitlines() + handler_out if "KV cache:" in ln]
    assert len(printed) == 1, (r.output, handler_out)
    assert "(2 sequences of 64 tokens)" in printed[0]
