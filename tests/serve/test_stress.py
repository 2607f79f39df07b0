"""Stress behaviour: client disconnects cancel and free KV pages, and concurrent requests share batches.
(The soak against a ``max serve`` subprocess is ``bench/soak.py``, run by ``test_soak_bench.py``.)"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from serve_support import kv_pages_in_use, make_context, wait_idle

MSG = [{"role": "user", "content": "Tell me a long story"}]


def _cancelled(server) -> float:
    return server.state.metrics.finished.labels(reason="cancelled")._value.get()


def test_disconnect_mid_stream_cancels_and_frees_pages(server, monkeypatch):
    before = _cancelled(server)
    body = {"model": "tiny", "messages": MSG, "max_tokens": 200, "stream": True, "ignore_eos": True}
    pipe = server.engine.scheduler.pipeline
    real = pipe.execute

    def slow(inputs):  # the tiny model would finish all 200 tokens before the client has read four
        time.sleep(0.01)
        return real(inputs)

    monkeypatch.setattr(pipe, "execute", slow)
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen += 1
            if seen >= 4:
                break
        assert kv_pages_in_use(server) > 0  # the request holds pages while it runs
        server.engine.scheduler._step_lock.acquire()  # pause the model so the request cannot finish first
    try:
        time.sleep(0.3)  # the client has hung up; the server notices and cancels
    finally:
        server.engine.scheduler._step_lock.release()
    wait_idle(server)  # running 0, queue 0 and every KV page free again
    assert _cancelled(server) == before + 1
    assert server.state.metrics.generation_tokens._value.get() > 0


def test_disconnect_of_a_non_streaming_request_cancels_it(server):
    before = _cancelled(server)
    body = {"model": "tiny", "messages": MSG, "max_tokens": 200, "ignore_eos": True}
    sched = server.engine.scheduler
    sched._step_lock.acquire()  # pause the model: the request waits in the queue when the client gives up
    try:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(server.url + "/v1/chat/completions", json=body, timeout=0.3)
        time.sleep(0.6)  # the handler polls for a disconnect every 0.25 s
    finally:
        sched._step_lock.release()
    wait_idle(server)
    assert _cancelled(server) == before + 1


def test_concurrent_requests_are_batched_continuously(server):
    sched = server.engine.scheduler
    seen = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            seen.append(sched.running)
            time.sleep(0.002)

    async def go():
        async with httpx.AsyncClient(timeout=60) as c:
            async def one(i):
                await asyncio.sleep(0.01 * i)  # staggered arrivals join the running batch
                r = await c.post(server.url + "/v1/completions", json={
                    "model": "tiny", "prompt": f"x = {i}", "max_tokens": 24 + i, "ignore_eos": True})
                return r.json()["usage"]["completion_tokens"]

            return await asyncio.gather(*(one(i) for i in range(8)))

    t = threading.Thread(target=watch)
    t.start()
    try:
        toks = asyncio.run(go())
    finally:
        stop.set()
        t.join()
    assert toks == [24 + i for i in range(8)]
    assert max(seen) >= 4, f"at most {max(seen)} requests ran together"
    wait_idle(server)


def test_cancel_while_waiting_never_runs_the_request(server):
    from max.interfaces import SamplingParams

    sched = server.engine.scheduler
    params = SamplingParams(top_k=1, max_new_tokens=3, ignore_eos=True)
    outs: dict = {}
    done = threading.Event()

    def cb(out):
        outs.setdefault(out.request_id, []).append(out)
        if len([k for k, v in outs.items() if v[-1].done]) == 2:
            done.set()

    a = make_context(server, "x = 1", params)
    b = make_context(server, "y = 2", params)
    with sched._step_lock:  # both wait in the queue when the cancel arrives
        sched.submit(a, cb)
        sched.submit(b, cb)
        sched.cancel(b.request_id)
    assert done.wait(10)
    assert outs[a.request_id][-1].finish_reason == "length" and outs[a.request_id][-1].completion_tokens == 3
    assert [o.finish_reason for o in outs[b.request_id]] == ["cancelled"]
    assert outs[b.request_id][-1].completion_tokens == 0
    wait_idle(server)
