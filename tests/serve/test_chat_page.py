"""The chat page at ``/`` driven in a real browser: Playwright for Python with Debian's Chromium, headless.

As root the browser is installed with apt-get when it is missing (``chromium``); otherwise, or without
the ``playwright`` package, the module is skipped with the reason.  The page talks to a real ``max
serve`` app (a tiny random Llama); the test types prompts, waits for streamed answers, presses stop on
a long one, checks JSON-schema mode, image attachments, the conversation kept across a reload, and
saves a screenshot (its path is printed)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time

import httpx
import pytest

from lm_support import make_tiny_llama
from support import apt_install

sync_api = pytest.importorskip("playwright.sync_api")

BROWSERS = ("chromium", "chromium-browser")
PNG_1PX = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJ"
                           "RU5ErkJggg==")


def _browser() -> str | None:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def _install_browser() -> str | None:
    """apt-get install Debian's chromium (as root); None on success, else why not."""
    return apt_install("chromium")


@pytest.fixture(scope="module")
def browser():
    path = _browser()
    err = None
    if path is None:
        err = _install_browser()
        path = _browser()
    if path is None:
        pytest.skip(f"no Chromium to drive: {err or 'not installed'}")
    with sync_api.sync_playwright() as p:
        try:
            b = p.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox"])
        except Exception as e:  # noqa: BLE001 - a browser that cannot start here is a skip, not a failure
            pytest.skip(f"Chromium at {path} did not start: {str(e).splitlines()[0]}")
        yield b
        b.close()


@pytest.fixture(scope="module")
def page_server(tmp_path_factory):
    from max.entrypoints.cli import build_config
    from max.serve.server import ServerThread, build_app

    import torch
    from transformers import AutoModelForCausalLM

    d = make_tiny_llama(str(tmp_path_factory.mktemp("tiny_page")), max_position_embeddings=4096)
    model = AutoModelForCausalLM.from_pretrained(d)
    with torch.no_grad():  # greedy answers never end by themselves: a long one is there to be stopped
        model.lm_head.weight[model.config.eos_token_id] = 0.0
    model.save_pretrained(d)
    app = build_app(build_config(d, None, "cpu", 4096, 4), served_model_name="tiny")
    with ServerThread(app) as srv:
        srv.state = app.state.serve
        yield srv


def test_page_and_files_are_served_offline(page_server):
    r = httpx.get(page_server.url + "/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "connect-src 'self'" in r.headers["content-security-policy"]
    for name, ctype in (("app.js", "text/javascript"), ("style.css", "text/css")):
        f = httpx.get(page_server.url + f"/static/{name}")
        assert f.status_code == 200 and f.headers["content-type"].startswith(ctype) and len(f.text) > 500
    assert "http" not in httpx.get(page_server.url + "/static/app.js").text.replace("http.", "")  # no URLs out
    assert httpx.get(page_server.url + "/static/../state.py").status_code == 404
    assert httpx.get(page_server.url + "/static/secrets.txt").status_code == 404


def _wait_idle(srv, timeout=10.0):
    sched = srv.state.generator.scheduler
    mgr = srv.state.generator.kv_manager
    t0 = time.monotonic()
    while sched.running or sched.queue_depth or mgr.total_num_pages - mgr.num_free_pages:
        assert time.monotonic() - t0 < timeout, "the stopped request was not cancelled"
        time.sleep(0.05)


def test_chat_in_the_browser(browser, page_server, tmp_path):
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    external = []
    page.on("request", lambda r: None if r.url.startswith(page_server.url) else external.append(r.url))
    sent = []
    page.on("request", lambda r: sent.append(json.loads(r.post_data)) if r.url.endswith("/v1/chat/completions")
            else None)
    page.goto(page_server.url + "/")
    page.wait_for_selector("body[data-ready='1']")
    assert page.inner_text("#model-name") == "tiny"

    # a streamed answer, with its tokens/s and TTFT
    page.fill("#system", "You are terse.")
    page.fill("#temperature", "0")
    page.fill("#max_tokens", "24")
    page.fill("#prompt", "Hello there!")
    page.press("#prompt", "Enter")
    page.wait_for_selector(".msg.assistant[data-finish]", timeout=30000)
    answer = page.inner_text(".msg.assistant .text")
    stats = page.inner_text(".msg.assistant .stats")
    assert answer and "tokens" in stats and "tok/s" in stats and "TTFT" in stats, stats
    body = sent[-1]
    assert body["stream"] is True and body["max_tokens"] == 24 and body["temperature"] == 0
    assert body["messages"][0] == {"role": "system", "content": "You are terse."}
    assert body["messages"][1] == {"role": "user", "content": "Hello there!"}
    same = httpx.post(page_server.url + "/v1/chat/completions", json={k: body[k] for k in (
        "messages", "max_tokens", "temperature", "top_p")}).json()
    assert answer == same["choices"][0]["message"]["content"]  # what the API answers for the same request

    # a long answer, stopped while it streams: the page keeps the partial text, the server cancels the request
    page.fill("#max_tokens", "3500")
    page.fill("#prompt", "Tell me a very long story.")
    page.click("#send")
    streaming = page.locator(".msg.assistant[data-index='3'] .text")
    t0 = time.monotonic()
    while len(streaming.inner_text()) < 60:  # polled from here: the page's CSP forbids evaluating strings
        assert time.monotonic() - t0 < 30, "no streamed text"
        time.sleep(0.02)
    assert page.is_enabled("#stop") and not page.is_enabled("#send")
    page.click("#stop")
    page.wait_for_selector(".msg.assistant[data-index='3'][data-finish='stopped']", timeout=10000)
    assert "stopped" in page.inner_text(".msg.assistant[data-index='3'] .stats")
    n = int(page.inner_text(".msg.assistant[data-index='3'] .stats").split()[0])
    assert 0 < n < 3500
    _wait_idle(page_server)
    assert page.is_enabled("#send") and not page.is_enabled("#stop")

    # JSON-schema mode: the answer follows the schema
    schema = {"type": "object", "properties": {"mood": {"enum": ["calm", "busy"]}}, "required": ["mood"],
              "additionalProperties": False}
    page.check("#json_mode")
    page.fill("#json_schema", json.dumps(schema))
    page.fill("#max_tokens", "64")
    page.fill("#prompt", "How are you? Answer in JSON.")
    page.click("#send")
    page.wait_for_selector(".msg.assistant[data-index='5'][data-finish]", timeout=30000)
    assert json.loads(page.inner_text(".msg.assistant[data-index='5'] .text"))["mood"] in ("calm", "busy")
    assert sent[-1]["response_format"]["json_schema"]["schema"] == schema
    page.uncheck("#json_mode")

    # an image attachment goes out as a data URL image_url part; this text model answers 400, shown on the page
    img = tmp_path / "dot.png"
    img.write_bytes(PNG_1PX)
    page.set_input_files("#image", str(img))
    page.wait_for_selector("#attachments img")
    page.fill("#prompt", "What is in this image?")
    page.click("#send")
    page.wait_for_selector("#error:not([hidden])", timeout=30000)
    parts = sent[-1]["messages"][-1]["content"]
    assert parts[0] == {"type": "text", "text": "What is in this image?"}
    assert parts[1]["type"] == "image_url" and parts[1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert page.inner_text("#error").startswith("400")
    assert page.input_value("#prompt") == "What is in this image?"  # handed back for a retry
    assert page.locator(".msg").count() == 6

    # the conversation and settings survive a reload (localStorage)
    page.reload()
    page.wait_for_selector("body[data-ready='1']")
    assert page.locator(".msg").count() == 6 and page.input_value("#system") == "You are terse."
    assert page.inner_text(".msg.assistant .text") == answer
    shot = tmp_path / "chat-page.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"chat page screenshot: {shot}")
    assert shot.stat().st_size > 10_000
    dest = os.environ.get("LIBREMAX_SCREENSHOT")
    if dest:
        shutil.copyfile(shot, dest)
    page.click("#clear")
    assert page.locator(".msg").count() == 0
    assert not external  # nothing fetched from outside this server
    page.close()
