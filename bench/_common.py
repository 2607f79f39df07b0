"""Timing helpers shared by the benchmarks (median of repeats, printed tables)."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def timeit(fn: Callable[[], object], *, repeat: int = 7, number: int = 1, warmup: int = 1) -> float:
    """Median seconds per call of ``fn``."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t0) / number)
    return statistics.median(samples)


def table(title: str, rows: list[tuple], headers: tuple) -> None:
    widths = [max([len(str(h))] + [len(str(r[i])) for r in rows]) for i, h in enumerate(headers)]
    print(f"\n{title}")
    if not rows:
        print("(no rows: nothing in the selection could be measured)")
        return
    print("  ".join(str(h).ljust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))


def fmt_s(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def start_max_serve(extra_args: list, timeout: float = 300.0, stderr_file: str | None = None,
                    port: int | None = None) -> tuple:
    """Start ``max serve`` (this environment's console script) on ``port`` (default: a free one) of 127.0.0.1 with
    ``extra_args``; wait for ``/health``.  Returns ``(process, base_url, seconds_to_ready)``; exits with
    the server's stderr when it dies or does not come up in ``timeout`` s.  ``stderr_file``: the
    server's stderr goes there instead of a pipe (a chatty server, e.g. Ray's logs, never blocks on it)."""
    import os
    import subprocess
    import sys

    import httpx

    from max.serve.server import free_port

    port = port or free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "max")
    t0 = time.perf_counter()
    err = open(stderr_file, "w") if stderr_file else subprocess.PIPE
    proc = subprocess.Popen([exe, "serve", "--port", str(port), *map(str, extra_args)], stdout=subprocess.DEVNULL,
                            stderr=err, text=True)
    url = f"http://127.0.0.1:{port}"
    while True:
        if proc.poll() is not None:
            tail = open(stderr_file).read() if stderr_file else proc.stderr.read()
            raise SystemExit(f"max serve exited:\n{tail[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url, time.perf_counter() - t0
        except httpx.HTTPError:
            pass
        if time.perf_counter() - t0 > timeout:
            proc.kill()
            raise SystemExit(f"max serve did not come up in {timeout:.0f} s")
        time.sleep(0.25)


def stop_process(proc, timeout: float = 30.0) -> int:
    """SIGTERM ``proc``, wait up to ``timeout`` s (then kill); its exit status."""
    import subprocess

    proc.terminate()
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def peak_rss_mib() -> float:
    """This process's peak resident set (MiB): ``VmHWM``, which starts afresh at ``exec`` -- unlike
    ``ru_maxrss``, which a worker started with ``subprocess`` inherits from its parent (a bench parent that
    built a checkpoint would otherwise set every worker's floor)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def time_scheduled(llm, ctxs: list) -> dict:
    """Run ``ctxs`` on ``llm``'s scheduler to completion and time it from the outputs' arrival:
    ``ttft`` (mean time to each request's first token), ``tpot`` (mean time per later token; None when
    no request got two), ``tok_s`` (all tokens / wall time) and ``tokens`` (how many came)."""
    stamps: dict[str, list[float]] = {c.request_id: [] for c in ctxs}

    def cb(out) -> None:  # noqa: ANN001
        stamps[out.request_id].extend([time.perf_counter()] * len(out.tokens))

    t = time.perf_counter()
    for c in ctxs:
        llm.scheduler.submit(c, cb)
    llm.scheduler.run_until_idle()
    end = time.perf_counter()
    firsts = [s[0] - t for s in stamps.values()]
    tpots = [(s[-1] - s[0]) / (len(s) - 1) for s in stamps.values() if len(s) > 1]
    total = sum(len(s) for s in stamps.values())
    return {"ttft": sum(firsts) / len(firsts), "tpot": sum(tpots) / len(tpots) if tpots else None,
            "tok_s": total / (end - t), "tokens": total}
