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
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    print(f"\n{title}")
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
