"""Soak and fault benchmark of ``max serve``: memory stays flat and every request gets the answer it should.

Starts ``max serve`` (a subprocess on 127.0.0.1) on the bundled SmolLM2-135M-Instruct (or
``--model-path``) and sends ``--requests`` requests (bounded by ``--duration`` seconds too) with
``--concurrency`` in flight, drawn at random from a mix of

* valid work: chat and completions (some sharing a long system prompt, so prefix caching is used),
  streaming chat read to ``[DONE]``;
* cancellations: streams the client hangs up on after the first chunk, and non-streaming requests
  it abandons after a few milliseconds;
* invalid requests: bad fields, a token id outside the vocabulary, null content, a non-JSON
  content type, malformed JSON, an unknown model, a seed out of range (4xx each);
* oversized requests: a body over ``--max-request-bytes`` (413) and a prompt over ``--max-length``
  tokens that fits the body limit (400 ``context_length_exceeded``).

Each kind has the statuses it may get; anything else (a 5xx, a stream without ``[DONE]``, a
connection error) is unexpected.  After ``--warmup`` requests the server's RSS is taken as the
baseline; at the end (once idle) the script prints requests by kind and status, p50/p99 latency,
RSS at start / after warm-up / at the end (and the peak), KV pages in use and cached, and exits
non-zero if anything was unexpected, a KV page is still in use, or RSS grew more than
``--max-rss-growth-mib`` after the warm-up.  There is no peer to compare with here: the
figures are absolute (RSS in MiB, latencies in ms).

While it runs it prints a progress line every ``--progress-every`` seconds (to stderr: requests done,
unexpected results so far, requests/s).  ``--port`` picks the server's port (default: a free one).

Run: nice -n 15 .venv/bin/python bench/soak.py [--requests 1000] [--concurrency 12] [--model-path PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import start_max_serve, stop_process, table  # noqa: E402

MODEL = "soak"
SYSTEM = ("You are a careful assistant for a public library. Answer questions about opening hours, "
          "borrowing rules, fines, events, study rooms, printing, accessibility and the catalogue. Keep "
          "answers short, polite and factual; say so when you do not know. Never invent a policy. Refer "
          "people to the front desk for anything about their personal account, payments or lost items, "
          "and to the children's desk for questions about the reading club. The library opens at nine in "
          "the morning and closes at eight in the evening on weekdays; on Saturdays it closes at five and "
          "on Sundays it stays closed. Books may be borrowed for three weeks and renewed twice unless "
          "someone else has reserved them. Study rooms can be booked a week ahead for up to three hours.")
# (long enough to fill one KV page of 128 tokens, so these requests share a prefix-cached page)
WORDS = ("river garden window morning question number system program music market school family city water "
         "story light paper power night country book library table chair apple orange yellow green blue").split()


@dataclass
class Result:
    kind: str
    status: str  # the HTTP status, or "cancelled" / "conn_error"
    latency: float
    ok: bool
    detail: str = ""


@dataclass
class Kind:
    name: str
    weight: float
    expect: set
    results: list = field(default_factory=list)


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


class Soak:
    def __init__(self, url: str, args: argparse.Namespace, vocab_size: int) -> None:
        self.url = url
        self.args = args
        self.vocab_size = vocab_size
        self.max_body = args.max_request_bytes
        self.kinds = {k.name: k for k in [
            Kind("chat", 0.22, {"200"}),
            Kind("chat_shared_prefix", 0.12, {"200"}),
            Kind("completion", 0.16, {"200"}),
            Kind("stream", 0.14, {"200"}),
            Kind("stream_cancelled", 0.06, {"200", "cancelled"}),
            Kind("abandoned", 0.04, {"200", "cancelled"}),
            Kind("invalid", 0.18, {"400", "404", "415"}),
            Kind("oversized_body", 0.04, {"413"}),
            Kind("too_many_tokens", 0.04, {"400"}),
        ]}

    # ------------------------------------------------------------------ requests
    async def one(self, c: Any, rng: random.Random) -> Result:
        names = list(self.kinds)
        kind = rng.choices(names, weights=[self.kinds[n].weight for n in names])[0]
        t0 = time.perf_counter()
        try:
            status, ok, detail = await getattr(self, "_" + kind)(c, rng)
        except Exception as e:  # noqa: BLE001 - a broken connection is a finding, not a crash
            status, ok, detail = "conn_error", False, f"{type(e).__name__}: {e}"
        r = Result(kind, status, time.perf_counter() - t0, ok and status in self.kinds[kind].expect, detail)
        self.kinds[kind].results.append(r)
        return r

    def _max_tokens(self, rng: random.Random) -> int:
        return rng.randint(1, self.args.max_tokens)

    async def _chat(self, c: Any, rng: random.Random, system: Optional[str] = None) -> tuple:
        msgs = [{"role": "user", "content": f"{_text(rng, rng.randint(3, 20))}?"}]
        if system:
            msgs.insert(0, {"role": "system", "content": system})
        r = await c.post("/v1/chat/completions", json={
            "model": MODEL, "messages": msgs, "max_tokens": self._max_tokens(rng),
            "temperature": rng.choice([0.0, 0.7]), "seed": rng.randint(0, 2**63 - 1)})
        ok = r.status_code != 200 or r.json()["choices"][0]["message"]["content"] is not None
        return str(r.status_code), ok, r.text[:200] if r.status_code != 200 else ""

    async def _chat_shared_prefix(self, c: Any, rng: random.Random) -> tuple:
        return await self._chat(c, rng, SYSTEM)

    async def _completion(self, c: Any, rng: random.Random) -> tuple:
        if rng.random() < 0.3:  # token ids
            prompt: Any = [rng.randrange(self.vocab_size) for _ in range(rng.randint(1, 24))]
        else:
            prompt = f"def {rng.choice(WORDS)}_{rng.randint(0, 999)}(x):"
        r = await c.post("/v1/completions", json={"model": MODEL, "prompt": prompt,
                                                  "max_tokens": self._max_tokens(rng)})
        return str(r.status_code), True, r.text[:200] if r.status_code != 200 else ""

    async def _stream(self, c: Any, rng: random.Random, hang_up: bool = False) -> tuple:
        body = {"model": MODEL, "messages": [{"role": "user", "content": _text(rng, rng.randint(3, 12))}],
                "max_tokens": max(2, self._max_tokens(rng)), "stream": True}
        if hang_up:
            body.update(max_tokens=self.args.max_tokens, ignore_eos=True)
        async with c.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                return str(r.status_code), True, (await r.aread()).decode()[:200]
            last = None
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if hang_up:
                    return "cancelled", True, ""  # leaving the block closes the connection mid-stream
                last = line
                if line != "data: [DONE]" and '"error"' in line[:20]:
                    return "200", False, f"error event: {line[:200]}"
            return "200", last == "data: [DONE]", "" if last == "data: [DONE]" else f"stream ended with {last!r}"

    async def _stream_cancelled(self, c: Any, rng: random.Random) -> tuple:
        return await self._stream(c, rng, hang_up=True)

    async def _abandoned(self, c: Any, rng: random.Random) -> tuple:
        import httpx

        try:
            r = await c.post("/v1/completions", timeout=rng.uniform(0.005, 0.05), json={
                "model": MODEL, "prompt": _text(rng, 8), "max_tokens": self.args.max_tokens, "ignore_eos": True})
        except httpx.TimeoutException:
            return "cancelled", True, ""
        return str(r.status_code), True, r.text[:200] if r.status_code != 200 else ""

    async def _invalid(self, c: Any, rng: random.Random) -> tuple:
        msg = [{"role": "user", "content": "hi"}]
        case = rng.randrange(8)
        if case == 0:
            r = await c.post("/v1/chat/completions", json={"model": MODEL, "messages": msg, "temperature": 5})
        elif case == 1:
            r = await c.post("/v1/completions", json={"model": MODEL, "prompt": [1, self.vocab_size + rng.randint(0, 9)],
                                                      "max_tokens": 2})
        elif case == 2:
            r = await c.post("/v1/chat/completions", json={"model": MODEL, "messages": [
                {"role": "user", "content": None}]})
        elif case == 3:
            r = await c.post("/v1/chat/completions", content=json.dumps({"messages": msg}),
                             headers={"content-type": "text/plain"})
        elif case == 4:
            r = await c.post("/v1/chat/completions", content=b'{"messages": [', headers={
                "content-type": "application/json"})
        elif case == 5:
            r = await c.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": msg})
        elif case == 6:
            r = await c.post("/v1/chat/completions", json={"model": MODEL, "messages": msg,
                                                           "seed": rng.choice([-1, 2**64])})
        else:
            r = await c.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 0})
        ok = "error" in r.json() and "Traceback" not in r.text and "/site-packages/" not in r.text
        return str(r.status_code), ok, "" if ok else r.text[:200]

    async def _oversized_body(self, c: Any, rng: random.Random) -> tuple:
        r = await c.post("/v1/completions", json={"model": MODEL, "prompt": "x" * (self.max_body + 1000),
                                                  "max_tokens": 1})
        return str(r.status_code), True, ""

    async def _too_many_tokens(self, c: Any, rng: random.Random) -> tuple:
        n_words = min(self.max_body // 8, max(4 * self.args.server_max_length, 64))
        r = await c.post("/v1/completions", json={"model": MODEL, "prompt": _text(rng, n_words), "max_tokens": 1})
        ok = r.status_code != 400 or r.json()["error"]["code"] == "context_length_exceeded"
        return str(r.status_code), ok, r.text[:200]

    # ------------------------------------------------------------------ driving
    async def run(self, n: int, seed: int, deadline: float, phase: str = "run") -> list:
        import httpx

        rng = random.Random(seed)
        sem = asyncio.Semaphore(self.args.concurrency)
        limits = httpx.Limits(max_connections=self.args.concurrency + 4)
        done: list[Result] = []

        async with httpx.AsyncClient(base_url=self.url, timeout=300, limits=limits) as c:
            async def guarded(r: random.Random) -> Optional[Result]:
                async with sem:
                    if time.monotonic() > deadline:
                        return None
                    res = await self.one(c, r)
                    done.append(res)
                    return res

            reporter = asyncio.ensure_future(progress(phase, n, done, self.args.progress_every))
            t0 = time.monotonic()
            try:
                tasks = [guarded(random.Random(rng.random())) for _ in range(n)]
                return [r for r in await asyncio.gather(*tasks) if r is not None]
            finally:
                reporter.cancel()
                if self.args.progress_every > 0:  # the phase's last line, however short it was
                    progress_line(phase, n, done, time.monotonic() - t0)


async def progress(phase: str, total: int, done: list, every: float) -> None:
    """Every ``every`` seconds, one line on stderr: requests done of ``total``, unexpected so far, rate."""
    if every <= 0:
        return
    t0 = time.monotonic()
    while True:
        await asyncio.sleep(every)
        progress_line(phase, total, done, time.monotonic() - t0)


def progress_line(phase: str, total: int, done: list, dt: float) -> None:
    bad = sum(not r.ok for r in done)
    print(f"[soak {phase}] {len(done)}/{total} requests in {dt:.0f} s ({len(done) / max(dt, 1e-9):.1f}/s), "
          f"{bad} unexpected so far", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- server side
def rss_mib(pid: int, field_name: str = "VmRSS") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field_name} for pid {pid}")


def metrics(url: str) -> dict:
    import httpx

    out = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("maxserve_") and " " in line and "{" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def wait_idle(url: str, timeout: float = 60.0) -> dict:
    t0 = time.monotonic()
    while True:
        m = metrics(url)
        if (m.get("maxserve_running_requests") == 0 and m.get("maxserve_queue_depth") == 0
                and m.get("maxserve_kv_cache_pages_used") == 0) or time.monotonic() - t0 > timeout:
            return m
        time.sleep(0.1)


def pct(vals: list, q: float) -> float:
    if not vals:
        return float("nan")
    s = sorted(vals)
    return s[min(len(s) - 1, int(round((len(s) - 1) * q / 100)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default=None, help="default: the bundled SmolLM2-135M-Instruct")
    ap.add_argument("--devices", default="cpu")
    ap.add_argument("--requests", type=int, default=1000, help="requests after the warm-up")
    ap.add_argument("--warmup", type=int, default=100, help="requests before the RSS baseline")
    ap.add_argument("--duration", type=float, default=1800, help="stop sending after this many seconds")
    ap.add_argument("--concurrency", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=24, help="most tokens a valid request asks for")
    ap.add_argument("--max-length", type=int, default=None, help="max serve --max-length (default: the model's)")
    ap.add_argument("--max-request-bytes", type=int, default=1 << 20, help="max serve --max-request-bytes")
    ap.add_argument("--max-rss-growth-mib", type=float, default=50.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the figures as JSON here")
    ap.add_argument("--port", type=int, default=None, help="port of the max serve it starts (default: a free one)")
    ap.add_argument("--progress-every", type=float, default=30.0,
                    help="seconds between progress lines on stderr (0: none)")
    args = ap.parse_args()
    if args.port is not None and not 1 <= args.port <= 65535:
        ap.error("--port must be in 1..65535")
    if not 8 <= args.concurrency <= 64:
        ap.error("--concurrency must be in 8..64 (the soak is about concurrent load)")

    cmd = ["--devices", args.devices, "--served-model-name", MODEL, "--max-batch-size", "16",
           "--max-request-bytes", str(args.max_request_bytes), "--log-level", "warning", "--drain-timeout", "5"]
    if args.model_path:
        cmd += ["--model-path", args.model_path]
    if args.max_length:
        cmd += ["--max-length", str(args.max_length)]
    print(f"[soak] starting max serve{' on port ' + str(args.port) if args.port else ''} ...", file=sys.stderr,
          flush=True)
    proc, url, t_up = start_max_serve(cmd, port=args.port)
    print(f"[soak] max serve is up on {url} after {t_up:.1f} s; {args.warmup} warm-up requests, then "
          f"{args.requests}", file=sys.stderr, flush=True)
    failures: list[str] = []
    try:
        import httpx

        card = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]
        args.server_max_length = int(card.get("max_model_len") or args.max_length or 2048)
        m0 = metrics(url)
        vocab = _vocab_size(args, url)
        soak = Soak(url, args, vocab)
        rss_start = rss_mib(proc.pid)
        t0 = time.perf_counter()
        deadline = time.monotonic() + args.duration
        warm = asyncio.run(soak.run(args.warmup, args.seed, deadline, "warm-up"))
        wait_idle(url)
        rss_warm = rss_mib(proc.pid)
        for k in soak.kinds.values():
            k.results.clear()  # the figures are for the measured run
        t1 = time.perf_counter()
        results = asyncio.run(soak.run(args.requests, args.seed + 1, deadline))
        t_run = time.perf_counter() - t1
        m_end = wait_idle(url)
        rss_end = rss_mib(proc.pid)
        rss_peak = rss_mib(proc.pid, "VmHWM")
        alive = proc.poll() is None
    finally:
        status = stop_process(proc)
        stderr = proc.stderr.read() if proc.stderr else ""

    rows = []
    for k in soak.kinds.values():
        if not k.results:
            continue
        by = collections.Counter(r.status for r in k.results)
        lat = [r.latency for r in k.results if r.status not in ("cancelled", "conn_error")]
        bad = [r for r in k.results if not r.ok]
        rows.append((k.name, len(k.results), ", ".join(f"{s}: {n}" for s, n in sorted(by.items())),
                     f"{pct(lat, 50) * 1e3:.0f}", f"{pct(lat, 99) * 1e3:.0f}", len(bad)))
        for r in bad[:3]:
            failures.append(f"{k.name}: unexpected {r.status} {r.detail}")
        if len(bad) > 3:
            failures.append(f"{k.name}: ... and {len(bad) - 3} more unexpected")
    statuses = collections.Counter(r.status for r in results)
    lat_all = [r.latency for r in results if r.status == "200"]
    sent = len(warm) + len(results)
    table(f"max serve soak: {len(results)} requests after {len(warm)} warm-up, concurrency {args.concurrency}, "
          f"{t_run:.0f} s ({len(results) / t_run:.1f} req/s); server up in {t_up:.1f} s",
          rows, ("kind", "requests", "statuses", "p50 ms", "p99 ms", "unexpected"))
    growth = rss_end - rss_warm
    kv_used = int(m_end.get("maxserve_kv_cache_pages_used", -1))
    summary = {
        "requests": len(results), "warmup": len(warm), "sent": sent, "concurrency": args.concurrency,
        "seconds": t_run, "statuses": dict(statuses),
        "latency_ms_200": {"p50": pct(lat_all, 50) * 1e3, "p99": pct(lat_all, 99) * 1e3},
        "rss_mib": {"start": rss_start, "after_warmup": rss_warm, "end": rss_end, "peak": rss_peak,
                    "growth_after_warmup": growth},
        "kv_cache": {"pages_total": int(m0.get("maxserve_kv_cache_pages_total", 0)), "pages_in_use_end": kv_used,
                     "capacity_bytes": int(m0.get("maxserve_kv_cache_capacity_bytes", 0))},
        "server_exit_status": status, "unexpected": len(failures),
    }
    print(f"\nall requests by status: {dict(sorted(statuses.items()))}")
    print(f"latency of 200s: p50 {summary['latency_ms_200']['p50']:.0f} ms, p99 "
          f"{summary['latency_ms_200']['p99']:.0f} ms")
    print(f"server RSS: start {rss_start:.0f} MiB, after warm-up {rss_warm:.0f} MiB, end {rss_end:.0f} MiB "
          f"(growth after warm-up {growth:+.1f} MiB), peak {rss_peak:.0f} MiB")
    print(f"KV cache: {summary['kv_cache']['pages_total']} pages "
          f"({summary['kv_cache']['capacity_bytes'] / 2**20:.0f} MiB reserved), {kv_used} in use at the end")
    print(f"server exit status after SIGTERM: {status}")
    if not alive:
        failures.append("the server died during the soak")
    if kv_used != 0:
        failures.append(f"{kv_used} KV pages still in use at the end")
    if growth > args.max_rss_growth_mib:
        failures.append(f"RSS grew {growth:.1f} MiB after the warm-up (bound {args.max_rss_growth_mib} MiB)")
    if status != 0:
        failures.append(f"max serve exited with status {status} on SIGTERM")
    if "Traceback" in stderr:
        failures.append("the server printed a traceback:\n" + stderr[stderr.index("Traceback"):][:2000])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(summary, failures=failures), f, indent=2)
    if failures:
        print("\nUNEXPECTED:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    print("\nno unexpected results")
    return 0


def _vocab_size(args: argparse.Namespace, url: str) -> int:
    """The served model's vocabulary size (for in-range and out-of-range token ids)."""
    from max.entrypoints.cli import build_config
    from max.pipelines.lib.registry import PIPELINE_REGISTRY, register_all_models

    register_all_models()
    return int(PIPELINE_REGISTRY.retrieve_tokenizer(build_config(args.model_path, None, "cpu", None, None)).vocab_size)


if __name__ == "__main__":
    sys.exit(main())
