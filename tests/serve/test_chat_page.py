"""The chat page at ``/`` driven in a real browser: Playwright for Python with Debian's Chromium, headless.

As root the browser is installed with apt-get when it is missing (``chromium``); otherwise, or without
the ``playwright`` package, the module is skipped with the reason.

Two servers: a real ``max serve`` app (a tiny random Llama) for the conversation itself (streamed answers,
stop, JSON-schema mode, the API key, the conversation kept across a reload), and a stub app serving the
same page routes with a ``/v1/chat/completions`` whose streamed text the test chooses (Markdown, code
blocks, script and event handlers that must stay inert, a stream held open half-way) and whose
``/v1/models`` can say the model takes images.  Layout checks at 1280 and 400 px wide; screenshots are
saved (paths printed; copied to ``$LIBREMAX_SCREENSHOT_DIR`` when set)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import threading
import time
from importlib import resources

import httpx
import pytest

from lm_support import make_tiny_llama
from support import apt_install

sync_api = pytest.importorskip("playwright.sync_api")
from fastapi import Request  # noqa: E402 - a module-level name: FastAPI reads the stub route's annotations

BROWSERS = ("chromium", "chromium-browser")
PNG_1PX = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJ"
                           "RU5ErkJggg==")
STORE = "libremax-chat-v1"          # localStorage: conversation and settings
KEY_STORE = "libremax-chat-api-key"  # sessionStorage: the API key
WIDTHS = (1280, 400)


def _browser() -> str | None:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def browser():
    path = _browser()
    err = None
    if path is None:
        err = apt_install("chromium")  # as root on Debian; else the reason it could not
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


class Stub:
    """What the stub server answers: ``head`` is streamed at once, ``tail`` after ``gate`` is set."""

    def __init__(self) -> None:
        self.head: list[str] = []
        self.tail: list[str] = []
        self.gate = threading.Event()
        self.vision = False
        self.requests: list[dict] = []


@pytest.fixture(scope="module")
def stub_server():
    """The page's own routes (``max.serve.routes.ui``) plus a stand-in ``/v1/models`` and a streaming
    ``/v1/chat/completions`` that sends the chunks the test chose."""
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    from max.serve.routes import ui
    from max.serve.server import ServerThread

    stub = Stub()
    app = FastAPI()
    app.include_router(ui.router)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": "stub-model", "object": "model",
                                            "capabilities": {"vision": stub.vision}}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> StreamingResponse:
        stub.requests.append(await request.json())

        def event(delta: dict, finish: str | None = None) -> str:
            return "data: " + json.dumps({"object": "chat.completion.chunk", "model": "stub-model", "choices": [
                {"index": 0, "delta": delta, "finish_reason": finish}]}) + "\n\n"

        async def gen():
            for piece in stub.head:
                yield event({"content": piece})
            t0 = time.monotonic()
            while not stub.gate.is_set() and time.monotonic() - t0 < 30:
                await asyncio.sleep(0.02)
            for piece in stub.tail:
                yield event({"content": piece})
            yield event({}, "stop")
            yield "data: [DONE]\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream")

    with ServerThread(app) as srv:
        srv.stub = stub
        yield srv


def _open(browser, url: str, width: int, **ctx):
    """A fresh browser context and page at ``url``, ready; requests to other hosts and 404s are collected."""
    context = browser.new_context(viewport={"width": width, "height": 800}, **ctx)
    page = context.new_page()
    page.external, page.missing = [], []
    page.on("request", lambda r: None if r.url.startswith(url) else page.external.append(r.url))
    page.on("response", lambda r: page.missing.append(r.url) if r.status == 404 else None)
    page.goto(url + "/")
    page.wait_for_selector("body[data-ready='1']")
    return context, page


def _stored(page) -> dict:
    return page.evaluate(f"() => JSON.parse(localStorage.getItem('{STORE}') || 'null')")


def _check_layout(page, width: int) -> None:
    """No horizontal scroll (the document, the message list) and nothing wider than the window."""
    m = page.evaluate("""() => {
        const d = document.documentElement, box = document.getElementById('messages');
        const right = [...document.querySelectorAll('.msg, #composer, #prompt, #send, #stop, #topbar')]
            .filter((e) => e.offsetParent !== null).map((e) => e.getBoundingClientRect().right);
        return {doc: [d.scrollWidth, d.clientWidth], box: [box.scrollWidth, box.clientWidth],
                right: Math.max(0, ...right), inner: window.innerWidth};
    }""")
    assert m["inner"] == width
    assert m["doc"][0] <= m["doc"][1], f"horizontal scroll at {width} px: {m}"
    assert m["box"][0] <= m["box"][1], f"the messages scroll sideways at {width} px: {m}"
    assert m["right"] <= m["doc"][1], f"something sticks out at {width} px: {m}"


def _check_sidebar(page, width: int) -> None:
    """Wide: the settings always shown, no toggle.  Narrow: a drawer, closed until the toggle opens it;
    Escape and a click outside close it."""
    expect = sync_api.expect
    settings = page.locator("#settings")
    if width >= 700:
        expect(settings).to_be_visible()
        expect(page.locator("#toggle-settings")).to_be_hidden()
        assert settings.bounding_box()["x"] == 0
        return
    expect(settings).to_be_hidden()
    box = settings.bounding_box()
    assert box is None or box["x"] + box["width"] <= 0  # collapsed: out of the window
    page.click("#toggle-settings")
    expect(settings).to_be_visible()
    expect(settings).to_be_in_viewport(ratio=1)
    assert page.get_attribute("#toggle-settings", "aria-expanded") == "true"
    assert settings.bounding_box()["width"] <= 0.9 * width
    _check_layout(page, width)
    page.keyboard.press("Escape")
    expect(settings).to_be_hidden()
    page.click("#toggle-settings")
    expect(settings).to_be_visible()
    page.mouse.click(width - 10, 400)  # the dimmed area beside the drawer
    expect(settings).to_be_hidden()
    assert page.get_attribute("#toggle-settings", "aria-expanded") == "false"


def _screenshot(page, tmp_path, name: str) -> None:
    shot = tmp_path / name
    page.screenshot(path=str(shot))
    print(f"chat page screenshot: {shot}")
    assert shot.stat().st_size > 5_000
    dest = os.environ.get("LIBREMAX_SCREENSHOT_DIR")
    if dest:
        os.makedirs(dest, exist_ok=True)
        shutil.copyfile(shot, os.path.join(dest, name))


def test_page_and_files_are_served_offline(page_server):
    r = httpx.get(page_server.url + "/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "connect-src 'self'" in r.headers["content-security-policy"]
    assert "script-src 'self';" in r.headers["content-security-policy"]  # no inline script, no event handlers
    # every file the page names is served, none from elsewhere
    refs = re.findall(r'(?:src|href)="([^"]+)"', r.text)
    assert {"/static/app.js", "/static/style.css", "/static/favicon.svg", "/static/vendor/marked.umd.js",
            "/static/vendor/purify.min.js"} <= set(refs)
    for ref in refs:
        assert ref.startswith("/static/"), ref
        f = httpx.get(page_server.url + ref)
        assert f.status_code == 200 and len(f.content) > 300, ref
    for name, ctype in (("app.js", "text/javascript"), ("style.css", "text/css"),
                        ("vendor/marked.umd.js", "text/javascript"), ("vendor/purify.min.js", "text/javascript"),
                        ("favicon.svg", "image/svg+xml")):
        f = httpx.get(page_server.url + f"/static/{name}")
        assert f.status_code == 200 and f.headers["content-type"].startswith(ctype), name
    assert "http" not in httpx.get(page_server.url + "/static/app.js").text.replace("http.", "")  # no URLs out
    # the vendored libraries are the releases the README names, with their licenses
    readme = httpx.get(page_server.url + "/static/vendor/README.md").text
    marked = httpx.get(page_server.url + "/static/vendor/marked.umd.js").text
    purify = httpx.get(page_server.url + "/static/vendor/purify.min.js").text
    assert "marked v18.2.1" in marked[:200] and "| 18.2.1 |" in readme
    assert "DOMPurify 3.5.0" in purify[:200] and "| 3.5.0 |" in readme
    for lic, words in (("LICENSE.marked", "MIT"), ("LICENSE.dompurify", "Apache License"),
                       ("LICENSE-MPL.dompurify", "Mozilla Public License")):
        assert words in httpx.get(page_server.url + f"/static/vendor/{lic}").text, lic
    # the icon: /favicon.ico (what browsers ask for by default) is a real ICO
    ico = httpx.get(page_server.url + "/favicon.ico")
    assert ico.status_code == 200 and ico.headers["content-type"] == "image/x-icon"
    assert ico.content[:4] == b"\x00\x00\x01\x00" and ico.content[4] >= 2  # ICO header, several sizes
    assert ico.content == resources.files("max.serve").joinpath("static", "favicon.ico").read_bytes()
    for bad in ("../state.py", "..%2Fstate.py", "vendor/..%2F..%2Fstate.py", "secrets.txt", "vendor/marked.esm.js", "vendor"):
        assert httpx.get(page_server.url + f"/static/{bad}").status_code == 404, bad


def _wait_idle(srv, timeout=10.0):
    sched = srv.state.generator.scheduler
    mgr = srv.state.generator.kv_manager
    t0 = time.monotonic()
    while sched.running or sched.queue_depth or mgr.total_num_pages - mgr.num_free_pages:
        assert time.monotonic() - t0 < timeout, "the stopped request was not cancelled"
        time.sleep(0.05)


def test_chat_in_the_browser(browser, page_server, tmp_path):
    sent = []
    context, page = _open(browser, page_server.url, 1280)
    page.on("request", lambda r: sent.append(json.loads(r.post_data)) if r.url.endswith("/v1/chat/completions")
            else None)
    assert page.text_content("#model-name") == "tiny"
    sync_api.expect(page.locator("#attach")).to_be_hidden()  # a text model: no image button
    assert httpx.get(page_server.url + "/v1/models").json()["data"][0]["capabilities"] == {"vision": False}

    # a streamed answer, with its tokens/s and TTFT
    page.fill("#system", "You are terse.")
    page.fill("#temperature", "0")
    page.fill("#max_tokens", "24")
    page.fill("#prompt", "Hello there!")
    page.press("#prompt", "Enter")
    page.wait_for_selector(".msg.assistant[data-finish]", timeout=30000)
    stats = page.inner_text(".msg.assistant .stats")
    assert "tokens" in stats and "tok/s" in stats and "TTFT" in stats, stats
    answer = _stored(page)["messages"][1]["content"]
    assert answer and page.inner_text(".msg.assistant .text").strip()
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
    shown = len(streaming.inner_text())
    time.sleep(0.3)  # the Markdown of the answer so far is re-rendered as it grows
    assert len(streaming.inner_text()) > shown and page.locator(".msg.assistant.streaming").count() == 1
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
    assert json.loads(_stored(page)["messages"][5]["content"])["mood"] in ("calm", "busy")
    assert json.loads(page.inner_text(".msg.assistant[data-index='5'] .text"))["mood"] in ("calm", "busy")
    assert sent[-1]["response_format"]["json_schema"]["schema"] == schema
    page.uncheck("#json_mode")

    # the conversation and settings survive a reload (localStorage)
    page.reload()
    page.wait_for_selector("body[data-ready='1']")
    assert page.locator(".msg").count() == 6 and page.input_value("#system") == "You are terse."
    assert _stored(page)["messages"][1]["content"] == answer
    _check_layout(page, 1280)
    _check_sidebar(page, 1280)
    _screenshot(page, tmp_path, "chat-page-1280.png")

    # the same conversation on a phone-sized screen
    page.set_viewport_size({"width": 400, "height": 800})
    _check_layout(page, 400)
    _check_sidebar(page, 400)
    assert page.inner_text("#topbar-model") == "tiny"
    _screenshot(page, tmp_path, "chat-page-400.png")
    page.click("#toggle-settings")
    sync_api.expect(page.locator("#settings")).to_be_in_viewport(ratio=1)
    _screenshot(page, tmp_path, "chat-page-400-settings.png")
    page.click("#clear")
    assert page.locator(".msg").count() == 0
    assert not page.external  # nothing fetched from outside this server
    assert not page.missing  # every file the page asks for is there (the icon too)
    context.close()


# Markdown the stub streams: a code block cut across chunks, a long URL and a long word, and the kinds of
# markup that would run script if they were put in the page as they are
HEAD = ["# Plan\n\nSome **bold** text, `inline code`, a link https://example.com/", "a" * 300,
        " and a word ", "x" * 200, ".\n\n", "```py", "thon\ndef double(x):\n", "    return x * 2\n"]
TAIL = ["```\n\n",
        "<script>window.__pwned = 'script'</script>\n\n",
        "<img src=x onerror=\"window.__pwned = 'img'\">\n\n",
        "<svg><g onload=\"window.__pwned = 'svg'\"></g></svg><details open ontoggle=\"window.__pwned = 'details'\">"
        "<summary>s</summary></details>\n\n",
        "[click](javascript:window.__pwned='link') <a href=\"javascript:window.__pwned='a'\">a</a>\n\n",
        "<iframe srcdoc=\"<script>parent.__pwned='iframe'</script>\"></iframe>"
        "<object data=\"javascript:window.__pwned='object'\"></object>\n\n",
        "<div id=\"prompt\" class=\"msg user\">shadow</div><style>body { display: none }</style>\n\n",
        "![tracker](https://example.com/pixel.png) ![ok](data:image/png;base64,"
        + base64.b64encode(PNG_1PX).decode() + ")\n\n",
        "| a | b |\n|---|---|\n| 1 | 2 |\n\n- one\n- two\n\nDone."]
CODE = "def double(x):\n    return x * 2\n"
DANGER = ("script, style, iframe, object, embed, form, svg, [onerror], [onload], [ontoggle], [id], [style], "
          "a[href^='javascript'], [data^='javascript'], img[src^='http'], .msg .msg, .user")


@pytest.mark.parametrize("width", WIDTHS)
def test_markdown_answers_stream_and_stay_inert(browser, stub_server, tmp_path, width):
    """Markdown with a code block as ``<pre><code>``, rendered while it streams; script, event handlers and
    javascript: URLs in model output never run.  The page's CSP is bypassed here so that the sanitiser
    alone is what keeps the output inert (the CSP is the second wall; its header is checked above)."""
    stub = stub_server.stub
    stub.head, stub.tail, stub.vision = HEAD, TAIL, False
    stub.gate.clear()
    context, page = _open(browser, stub_server.url, width, bypass_csp=True)
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    assert page.text_content("#model-name") == "stub-model"
    page.fill("#prompt", "Make a plan.")
    page.press("#prompt", "Enter")
    # half-way: the code block is open and already shown as code, the message still streaming
    code = page.locator(".msg.assistant .text pre > code")
    code.wait_for(timeout=10000)
    assert page.locator(".msg.assistant.streaming").count() == 1
    sync_api.expect(code).to_have_text(CODE)
    assert page.inner_text(".msg.assistant .text h1") == "Plan"
    _check_layout(page, width)
    stub.gate.set()
    page.wait_for_selector(".msg.assistant[data-finish='stop']", timeout=10000)

    text = page.locator(".msg.assistant .text")
    assert page.locator(".msg.assistant .text pre > code.language-python").inner_text() == CODE
    assert text.locator("code").first.inner_text() == "inline code"
    assert text.locator("strong").inner_text() == "bold"
    assert text.locator("table td").count() == 2 and text.locator("ul > li").count() == 2
    link = text.locator("a[href^='https://example.com/']")
    assert link.get_attribute("target") == "_blank" and "noopener" in link.get_attribute("rel")
    assert text.locator("img[src^='data:image/png']").count() == 1  # data: images stay, remote ones lose src
    assert text.locator(DANGER).count() == 0, text.inner_html()
    assert page.evaluate("() => window.__pwned") is None
    assert page.locator("#prompt").count() == 1 and page.locator("#prompt").evaluate("e => e.tagName") == "TEXTAREA"
    assert page.is_visible("body") and not errors
    assert _stored(page)["messages"][1]["content"] == "".join(HEAD + TAIL)  # kept as sent, rendered on show
    _check_layout(page, width)
    _check_sidebar(page, width)
    text.scroll_into_view_if_needed()
    _screenshot(page, tmp_path, f"markdown-{width}.png")

    page.reload()  # the stored answer is rendered the same way
    page.wait_for_selector("body[data-ready='1']")
    assert page.locator(".msg.assistant .text pre > code").inner_text() == CODE
    assert page.locator(".msg.assistant .text").locator(DANGER).count() == 0
    assert page.evaluate("() => window.__pwned") is None
    # nothing fetched from elsewhere (the tracker image lost its src; links are not followed)
    assert not page.external, page.external
    context.close()


def test_image_button_only_for_vision_models(browser, stub_server, tmp_path):
    stub = stub_server.stub
    stub.head, stub.tail, stub.vision = ["A dot."], [], True
    stub.gate.set()
    context, page = _open(browser, stub_server.url, 400)
    sync_api.expect(page.locator("#attach")).to_be_visible()
    img = tmp_path / "dot.png"
    img.write_bytes(PNG_1PX)
    page.set_input_files("#image", str(img))
    page.wait_for_selector("#attachments img")
    page.fill("#prompt", "What is in this image?")
    page.click("#send")
    page.wait_for_selector(".msg.assistant[data-finish]", timeout=10000)
    parts = stub.requests[-1]["messages"][-1]["content"]
    assert parts[0] == {"type": "text", "text": "What is in this image?"}
    assert parts[1]["type"] == "image_url" and parts[1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert page.locator(".msg.user img").count() == 1 and page.inner_text(".msg.assistant .text") == "A dot."
    _check_layout(page, 400)

    stub.vision = False  # the same page against a text model: no button
    page.reload()
    page.wait_for_selector("body[data-ready='1']")
    sync_api.expect(page.locator("#attach")).to_be_hidden()
    context.close()


def test_api_key_stays_in_the_tab(browser, page_server):
    """The key lives in sessionStorage (this tab only), a key left in localStorage by an earlier page is
    moved there, and the model label says whether the key works."""
    srv = page_server.state
    srv.api_key = "sekret-key"
    try:
        context, page = _open(browser, page_server.url, 400)
        assert page.text_content("#model-name") == "(set the API key)"
        assert page.inner_text("#topbar-model") == "(set the API key)"
        page.fill("#prompt", "Hello?")
        page.press("#prompt", "Enter")
        page.wait_for_selector("#error:not([hidden])", timeout=10000)
        assert page.inner_text("#error").startswith("401")
        assert page.input_value("#prompt") == "Hello?" and page.locator(".msg").count() == 0  # handed back

        page.click("#toggle-settings")
        page.fill("#api_key", "wrong")
        sync_api.expect(page.locator("#topbar-model")).to_have_text("(API key rejected)")
        page.fill("#api_key", "sekret-key")
        sync_api.expect(page.locator("#topbar-model")).to_have_text("tiny")
        assert page.evaluate(f"() => sessionStorage.getItem('{KEY_STORE}')") == "sekret-key"
        page.fill("#max_tokens", "4")
        page.dispatch_event("#max_tokens", "change")
        page.keyboard.press("Escape")
        page.click("#send")
        page.wait_for_selector(".msg.assistant[data-finish]", timeout=30000)
        assert page.is_hidden("#error")
        stored = page.evaluate(f"() => localStorage.getItem('{STORE}')")
        assert "sekret" not in stored and json.loads(stored)["settings"]["max_tokens"] == "4"

        page.reload()  # same tab: the key is still there
        page.wait_for_selector("body[data-ready='1']")
        assert page.input_value("#api_key") == "sekret-key" and page.text_content("#model-name") == "tiny"

        other = context.new_page()  # another tab of the same browser: conversation yes, key no
        other.goto(page_server.url + "/")
        other.wait_for_selector("body[data-ready='1']")
        assert other.input_value("#api_key") == "" and other.text_content("#model-name") == "(set the API key)"
        assert other.locator(".msg").count() == 2

        # an earlier page's key in localStorage moves to sessionStorage and leaves localStorage
        old = json.loads(stored)
        old["settings"]["api_key"] = "sekret-key"
        other.evaluate("([k, v]) => localStorage.setItem(k, v)", [STORE, json.dumps(old)])
        other.reload()
        other.wait_for_selector("body[data-ready='1']")
        assert other.input_value("#api_key") == "sekret-key" and other.text_content("#model-name") == "tiny"
        assert other.evaluate(f"() => sessionStorage.getItem('{KEY_STORE}')") == "sekret-key"
        assert "api_key" not in _stored(other)["settings"] and _stored(other)["settings"]["max_tokens"] == "4"
        context.close()
    finally:
        srv.api_key = None
