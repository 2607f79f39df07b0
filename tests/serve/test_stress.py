"""Stress behaviour: client disconnects cancel and free KV pages, concurrent requests share batches,
and a soak of a few hundred requests against a ``max serve`` subprocess leaves nothing behind."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import threading
import time

import httpx
import pytest

from serve_support import MAX_LENGTH, kv_pages_in_use, make_context, wait_idle

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


# ------------------------------------------------------------------------ soak (real `max serve` process)
SOAK_REQUESTS = 500
SOAK_CONCURRENCY = 16
RSS_GROWTH_BOUND_MIB = 32


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _gauge(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in metrics")


@pytest.fixture(scope="module")
def serve_process(tiny_model):
    from max.serve.server import free_port

    port, mport = free_port(), free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "max")
    cmd = [exe, "serve", "--model-path", tiny_model, "--devices", "cpu", "--port", str(port), "--max-length",
           str(MAX_LENGTH), "--max-batch-size", "16", "--api-key", "soak-key", "--max-queue-size", "512",
           "--metrics-port", str(mport), "--served-model-name", "tiny", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"max serve exited: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() - t0 > 90:
            proc.kill()
            raise TimeoutError("max serve did not come up")
        time.sleep(0.2)
    yield proc, url, f"http://127.0.0.1:{mport}"
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


async def _blast(url: str, n: int, concurrency: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    sem = asyncio.Semaphore(concurrency)
    headers = {"Authorization": "Bearer soak-key"}
    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(timeout=120, limits=limits, headers=headers) as c:
        async def one(i: int) -> int:
            kind = rng.random()
            async with sem:
                if kind < 0.4:
                    r = await c.post(url + "/v1/chat/completions", json={
                        "model": "tiny", "messages": [{"role": "user", "content": f"question {i}"}],
                        "max_tokens": rng.randint(1, 8), "temperature": rng.choice([0, 0.7])})
                    return r.status_code
                if kind < 0.8:
                    r = await c.post(url + "/v1/completions", json={
                        "model": "tiny", "prompt": f"def f{i}(x):", "max_tokens": rng.randint(1, 8)})
                    return r.status_code
                status = 0
                async with c.stream("POST", url + "/v1/chat/completions", json={
                        "model": "tiny", "messages": [{"role": "user", "content": f"s {i}"}],
                        "max_tokens": rng.randint(2, 10), "stream": True}) as r:
                    status = r.status_code
                    async for line in r.aiter_lines():
                        if kind > 0.95 and line.startswith("data: "):
                            break  # some clients hang up mid-stream
                return status

        return await asyncio.gather(*(one(i) for i in range(n)))


def test_soak_against_max_serve_process(serve_process):
    proc, url, metrics_url = serve_process
    assert httpx.get(url + "/v1/models", timeout=5).status_code == 401  # --api-key is enforced
    assert set(asyncio.run(_blast(url, 48, SOAK_CONCURRENCY, seed=1))) == {200}  # warm-up
    rss0 = _rss_mib(proc.pid)
    t0 = time.perf_counter()
    statuses = asyncio.run(_blast(url, SOAK_REQUESTS, SOAK_CONCURRENCY, seed=2))
    dt = time.perf_counter() - t0
    assert statuses.count(200) == SOAK_REQUESTS, {s: statuses.count(s) for s in set(statuses)}
    t_wait = time.monotonic()
    while True:  # hung-up streams are cancelled at the next step
        m = httpx.get(metrics_url + "/metrics", timeout=5).text
        if _gauge(m, "maxserve_running_requests") == 0 or time.monotonic() - t_wait > 10:
            break
        time.sleep(0.05)
    rss1 = _rss_mib(proc.pid)
    assert _gauge(m, "maxserve_kv_cache_pages_used") == 0
    assert _gauge(m, "maxserve_running_requests") == 0 and _gauge(m, "maxserve_queue_depth") == 0
    assert rss1 - rss0 < RSS_GROWTH_BOUND_MIB, f"RSS grew {rss1 - rss0:.1f} MiB ({rss0:.0f} -> {rss1:.0f})"
    print(f"\nsoak: {SOAK_REQUESTS} requests at concurrency {SOAK_CONCURRENCY} in {dt:.1f} s "
          f"({SOAK_REQUESTS / dt:.1f} req/s); RSS {rss0:.0f} -> {rss1:.0f} MiB ({rss1 - rss0:+.1f} MiB)")
    assert proc.poll() is None


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
