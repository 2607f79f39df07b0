"""Client-side serving benchmark (``max benchmark``).

Sends ``num_prompts`` streaming requests with at most ``concurrency`` in flight to
a running OpenAI-compatible server and measures, per request, the time to first
token (TTFT), the time per output token after the first (TPOT) and the total
latency; reports request throughput, output tokens/s and p50/p90/p99 of TTFT and
TPOT.  Prompts are synthetic (random common English words, reproducible with
``seed``); ``ignore_eos`` asks the server to generate exactly ``output_len``
tokens so runs compare equal work.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an they "
    "you were her she there all one their we him been has when who will more no if out so said what up its about "
    "into than them can only other new some could time these two may then do first any my now such like our over "
    "man me even most made after also did many before must through back years where much your way well down "
    "should because each just those people how too little state good very make world still own see men work long "
    "get here between both life being under never day same another know while last might us great old year off "
    "come since against go came right used take three house river garden window morning question number system "
    "program music market school family city water story light paper power night country point"
).split()


def synthetic_prompts(n: int, prompt_len: int, seed: int = 0) -> list[str]:
    """``n`` prompts of ``prompt_len`` words each (about one token per word for BPE tokenizers)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(max(1, prompt_len))) for _ in range(n)]


@dataclass
class RequestResult:
    ok: bool
    ttft: float = 0.0
    latency: float = 0.0
    output_tokens: int = 0
    prompt_tokens: int = 0
    error: str = ""
    itl: list[float] = field(default_factory=list)

    @property
    def tpot(self) -> Optional[float]:
        if self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)


def _pct(vals: list[float], q: float) -> float:
    if not vals:
        return float("nan")
    s = sorted(vals)
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _stats_ms(vals: list[float]) -> dict[str, float]:
    return {"mean": (sum(vals) / len(vals) * 1e3) if vals else float("nan"),
            "p50": _pct(vals, 50) * 1e3, "p90": _pct(vals, 90) * 1e3, "p99": _pct(vals, 99) * 1e3}


async def _one(client: Any, url: str, body: dict, headers: dict) -> RequestResult:
    t0 = time.perf_counter()
    res = RequestResult(ok=False)
    last = None
    try:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:200]}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                obj = json.loads(data)
                if "error" in obj:
                    res.error = str(obj["error"].get("message"))
                    return res
                if obj.get("usage"):
                    res.output_tokens = int(obj["usage"].get("completion_tokens", 0))
                    res.prompt_tokens = int(obj["usage"].get("prompt_tokens", 0))
                for ch in obj.get("choices") or []:
                    piece = (ch.get("delta") or {}).get("content") if "delta" in ch else ch.get("text")
                    if piece:
                        now = time.perf_counter()
                        if last is None:
                            res.ttft = now - t0
                        else:
                            res.itl.append(now - last)
                        last = now
        res.latency = time.perf_counter() - t0
        res.ok = last is not None
        if not res.ok:
            res.error = "no tokens received"
    except Exception as e:  # noqa: BLE001 - a failed request is counted, not fatal
        res.error = f"{type(e).__name__}: {e}"
    return res


async def run_benchmark_async(base_url: str, *, num_prompts: int = 64, concurrency: int = 8, prompt_len: int = 32,
                              output_len: int = 64, model: Optional[str] = None, endpoint: str = "chat",
                              api_key: Optional[str] = None, seed: int = 0, timeout: float = 600.0
                              ) -> dict[str, Any]:
    import httpx

    base = base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    prompts = synthetic_prompts(num_prompts, prompt_len, seed)
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        if model is None:
            r = await client.get(f"{base}/v1/models", headers=headers)
            r.raise_for_status()
            model = r.json()["data"][0]["id"]
        if endpoint == "chat":
            url = f"{base}/v1/chat/completions"

            def body(p: str) -> dict:
                return {"model": model, "messages": [{"role": "user", "content": p}], "max_tokens": output_len,
                        "temperature": 0.0, "ignore_eos": True, "stream": True,
                        "stream_options": {"include_usage": True}}
        elif endpoint == "completions":
            url = f"{base}/v1/completions"

            def body(p: str) -> dict:
                return {"model": model, "prompt": p, "max_tokens": output_len, "temperature": 0.0,
                        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        else:
            raise ValueError(f"endpoint must be 'chat' or 'completions', got {endpoint!r}")
        sem = asyncio.Semaphore(concurrency)

        async def limited(p: str) -> RequestResult:
            async with sem:
                return await _one(client, url, body(p), headers)

        t0 = time.perf_counter()
        results = await asyncio.gather(*(limited(p) for p in prompts))
        duration = time.perf_counter() - t0
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    return {
        "base_url": base, "model": model, "endpoint": endpoint, "num_prompts": num_prompts,
        "concurrency": concurrency, "prompt_len": prompt_len, "output_len": output_len,
        "completed": len(ok), "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration,
        "request_throughput": len(ok) / duration if duration > 0 else 0.0,
        "output_throughput": out_tokens / duration if duration > 0 else 0.0,
        "total_prompt_tokens": sum(r.prompt_tokens for r in ok), "total_output_tokens": out_tokens,
        "ttft_ms": _stats_ms([r.ttft for r in ok]),
        "tpot_ms": _stats_ms([t for t in (r.tpot for r in ok) if t is not None]),
        "itl_ms": _stats_ms([x for r in ok for x in r.itl]),
        "e2e_latency_ms": _stats_ms([r.latency for r in ok]),
    }


def run_benchmark(base_url: str, **kw: Any) -> dict[str, Any]:
    """Synchronous :func:`run_benchmark_async`."""
    return asyncio.run(run_benchmark_async(base_url, **kw))


def format_table(res: dict[str, Any]) -> str:
    rows = [
        ("Model", str(res["model"])),
        ("Endpoint", res["endpoint"]),
        ("Prompts / concurrency", f"{res['num_prompts']} / {res['concurrency']}"),
        ("Prompt / output length", f"{res['prompt_len']} words / {res['output_len']} tokens"),
        ("Completed / failed", f"{res['completed']} / {res['failed']}"),
        ("Duration", f"{res['duration_s']:.2f} s"),
        ("Request throughput", f"{res['request_throughput']:.2f} req/s"),
        ("Output token throughput", f"{res['output_throughput']:.1f} tok/s"),
        ("Prompt tokens (total)", str(res["total_prompt_tokens"])),
        ("Output tokens (total)", str(res["total_output_tokens"])),
    ]
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_latency_ms", "E2E")):
        s = res[key]
        rows.append((f"{label} mean / p50 / p90 / p99",
                     f"{s['mean']:.1f} / {s['p50']:.1f} / {s['p90']:.1f} / {s['p99']:.1f} ms"))
    w = max(len(k) for k, _ in rows)
    lines = ["=" * (w + 32), "Serving benchmark".center(w + 32), "=" * (w + 32)]
    lines += [f"{k:<{w}}  {v}" for k, v in rows]
    if res["errors"]:
        lines.append(f"{'Errors':<{w}}  {'; '.join(res['errors'])}")
    lines.append("=" * (w + 32))
    return "\n".join(lines)


def write_json(res: dict[str, Any], path: str) -> None:
    with open(path, "w") as f:
        json.dump(res, f, indent=2)


_ = asdict
