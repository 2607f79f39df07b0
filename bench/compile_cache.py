"""Time to first ready of ``max serve`` with and without the compile cache (``LIBREMAX_COMPILE_CACHE``).

Starts ``max serve`` on the bundled SmolLM2-135M-Instruct (or ``--model-path``) and measures the
seconds from launch to the first 200 from ``/health``, in rounds of three starts: no cache, a cold
cache (an empty folder: compiles and writes the MEF and the folded weights) and a warm cache (the
folder the cold start filled: reads them, no graph pass, no weight repacking).  Prints each start and
the median ratios to the start without a cache (the peer).

Run: .venv/bin/python bench/compile_cache.py [--model-path PATH] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import start_max_serve, stop_process, table  # noqa: E402


def ready_seconds(args: argparse.Namespace, cache: str | None) -> float:
    os.environ.pop("LIBREMAX_COMPILE_CACHE", None)
    if cache is not None:
        os.environ["LIBREMAX_COMPILE_CACHE"] = cache
    extra = ["--devices", "cpu", "--log-level", "warning"]
    if args.model_path:
        extra += ["--model-path", args.model_path]
    proc, _, secs = start_max_serve(extra)
    stop_process(proc)
    return secs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    times: dict[str, list[float]] = {"no cache": [], "cold cache": [], "warm cache": []}
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as d:
            times["no cache"].append(ready_seconds(args, None))
            times["cold cache"].append(ready_seconds(args, d))
            times["warm cache"].append(ready_seconds(args, d))
    base = statistics.median(times["no cache"])
    rows = [(k, " ".join(f"{t:.2f}" for t in v), f"{statistics.median(v):.2f}", f"{statistics.median(v) / base:.2f}x")
            for k, v in times.items()]
    table("max serve: seconds from launch to /health", rows, ("start", "each (s)", "median (s)", "vs no cache"))


if __name__ == "__main__":
    main()
