"""Graceful shutdown of a real ``max serve`` process: on SIGTERM it refuses new work (503), lets a
short request finish, ends a stream that outlasts the drain timeout with an OpenAI error event and
``[DONE]``, and exits 0."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest

from serve_support import make_tiny_llama, start_max_serve


def test_sigterm_drains_ends_streams_and_exits_0(tmp_path):
    sig = signal.SIGTERM
    model = make_tiny_llama(str(tmp_path / "m"), max_position_embeddings=4096)
    proc, url = start_max_serve(model, "--max-length", "4096", "--drain-timeout", "3", "--served-model-name", "tiny",
                                "--log-level", "warning")
    try:
        short: dict = {}
        body = {"model": "tiny", "messages": [{"role": "user", "content": "go"}], "max_tokens": 4000,
                "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
            it = r.iter_lines()
            assert next(line for line in it if line.startswith("data: "))

            def short_request():  # in flight when the signal comes; it finishes within the drain timeout
                b = {"model": "tiny", "prompt": "x", "max_tokens": 4, "ignore_eos": True, "stream": True}
                with httpx.stream("POST", url + "/v1/completions", json=b, timeout=60) as sr:
                    lines = sr.iter_lines()
                    short["first"] = next(line for line in lines if line.startswith("data: "))
                    started.set()
                    short["rest"] = [line for line in lines if line.startswith("data: ")]

            started = threading.Event()
            th = threading.Thread(target=short_request)
            th.start()
            assert started.wait(30)
            proc.send_signal(sig)
            time.sleep(0.3)
            refused = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "y", "max_tokens": 1},
                                 timeout=10)
            health = httpx.get(url + "/health", timeout=10)
            rest = [line for line in it if line.startswith("data: ")]
            th.join(30)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_shutting_down"
        assert health.status_code == 503 and health.json() == {"status": "draining"}
        assert short["rest"][-1] == "data: [DONE]"
        assert not any("error" in json.loads(x[6:]) for x in short["rest"][:-1])
        assert json.loads(short["rest"][-2][6:])["choices"][0]["finish_reason"] == "length"
        assert rest[-1] == "data: [DONE]"
        err = json.loads(rest[-2][6:])
        assert err["error"]["code"] == "server_shutting_down", rest[-2]
        assert len(rest) > 2  # the stream ran during the drain, then was ended
        assert proc.wait(timeout=30) == 0
        stderr = proc.stderr.read()
        assert "Traceback" not in stderr, stderr[-3000:]
        assert "KV cache: " in stderr and " tokens = " in stderr  # the cache's size is printed at start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_first_signal_drains_second_stops_now(sig):
    """Both signals: the first only starts the drain (the process keeps serving its requests in
    flight), a second one ends them at once; uvicorn never re-raises them (exit status 0)."""
    import uvicorn

    from max.serve.lifecycle import Lifecycle, draining_server

    lc = Lifecycle()
    srv = draining_server(uvicorn.Config(app=None), lc, drain_timeout=30)
    srv.handle_exit(sig, None)
    assert lc.draining and not lc.aborting and not srv.should_exit
    srv.handle_exit(sig, None)
    assert lc.aborting and srv.should_exit
    assert srv._captured_signals == []  # nothing to re-raise after the shutdown


def test_drain_waits_for_requests_then_aborts():
    import asyncio

    from max.serve.lifecycle import Lifecycle

    async def scenario(finish_after: float, timeout: float) -> tuple:
        lc = Lifecycle()
        lc.in_flight = 1

        async def request():
            loop = asyncio.get_running_loop()
            end = loop.time() + finish_after
            while loop.time() < end and not lc.aborting:
                await asyncio.sleep(0.01)
            lc.in_flight -= 1
            return lc.aborting

        t = asyncio.create_task(request())
        await lc.drain(timeout, grace=1.0)
        return await t, lc.in_flight

    assert asyncio.run(scenario(0.05, 5.0)) == (False, 0)  # finished within the timeout: never aborted
    assert asyncio.run(scenario(10.0, 0.1)) == (True, 0)  # outlasted it: aborted, then it ended
