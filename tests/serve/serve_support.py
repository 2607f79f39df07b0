"""Helpers of the serving tests (a unique module name, so it never clashes with another conftest)."""

from __future__ import annotations

import contextlib
import time

from lm_support import CHAT_TEMPLATE, make_tiny_bert, make_tiny_llama  # noqa: F401 - re-exported for the serve tests

MAX_LENGTH = 256


def kv_pages_in_use(server) -> int:
    mgr = server.engine.kv_manager
    return mgr.total_num_pages - mgr.num_free_pages


def wait_idle(server, timeout: float = 10.0) -> None:
    """Wait until the scheduler has no waiting or running request and no KV page is in use."""
    sched = server.engine.scheduler
    t0 = time.monotonic()
    while sched.running or sched.queue_depth or kv_pages_in_use(server):
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"not idle after {timeout} s: running={sched.running} queued={sched.queue_depth} "
                                 f"pages in use={kv_pages_in_use(server)}")
        time.sleep(0.02)


def make_context(server, prompt: str, params):
    """A ``TextContext`` for ``prompt`` made by the served model's tokenizer."""
    import asyncio
    import uuid

    from max.interfaces import TextGenerationRequest

    req = TextGenerationRequest(request_id=uuid.uuid4().hex, model_name="tiny", prompt=prompt, sampling_params=params)
    return asyncio.run(server.engine.tokenizer.new_context(req))


def start_max_serve(model: str, *args: str, timeout: float = 90.0) -> tuple:
    """``(process, url)``: a real ``max serve`` process for ``model`` on a free port (``args`` are more
    options), once its ``/health`` answers 200; its stderr is a pipe."""
    import os
    import subprocess
    import sys

    import httpx

    from max.serve.server import free_port

    port = free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "max")
    proc = subprocess.Popen([exe, "serve", "--model-path", model, "--devices", "cpu", "--port", str(port), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    while True:
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read()[-2000:])
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if time.monotonic() - t0 > timeout:
            proc.kill()
            raise AssertionError("max serve did not come up")
        time.sleep(0.1)


@contextlib.contextmanager
def served(model: str, *args: str):
    """``(model, url)`` of a :func:`start_max_serve` process for the ``with`` block; stopped after it
    (SIGTERM, then kill after 30 s)."""
    import subprocess

    proc, url = start_max_serve(model, *args)
    try:
        yield model, url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
