"""The engine's thread policy: one pool, sized once, for every parallel library in the process.

torch's intra-op pool (OpenMP; MKL and oneDNN inside torch use it) and the
native kernels (linked to the same libgomp) share ``num_threads`` workers.
Other BLAS pools in the process -- numpy's OpenBLAS, say -- are limited to
one thread through ``threadpoolctl``: their workers busy-wait after each call,
and two pools spinning on the same cores slow each other down several-fold
(measured: 320 ms instead of 35 ms per token with torch and OpenBLAS at 2
threads each on 2 cores).  The engine never calls those libraries itself.
"""

from __future__ import annotations

import os
import threading

_lock = threading.Lock()
_applied: int | None = None


def physical_cores() -> int:
    """CPU cores (not SMT siblings) this process may run on; at least 1."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)
    cores = set()
    for c in cpus:
        try:
            with open(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list") as f:
                cores.add(f.read().strip())
        except OSError:
            cores.add(str(c))
    return max(1, len(cores))


def default_num_threads() -> int:
    """``LIBREMAX_NUM_THREADS`` if set, else the physical cores."""
    env = os.environ.get("LIBREMAX_NUM_THREADS")
    if env:
        try:
            n = int(env)
        except ValueError:
            raise ValueError(f"LIBREMAX_NUM_THREADS must be a positive integer, got {env!r}") from None
        if n < 1:
            raise ValueError(f"LIBREMAX_NUM_THREADS must be a positive integer, got {env!r}")
        return n
    return physical_cores()


def apply(num_threads: int) -> int:
    """Size the shared pool to ``num_threads`` and cap the other BLAS pools at one thread."""
    global _applied
    import torch

    with _lock:
        if _applied == num_threads and torch.get_num_threads() == num_threads:
            return num_threads
        torch.set_num_threads(num_threads)
        try:
            from threadpoolctl import threadpool_info, threadpool_limits

            foreign = [p for p in threadpool_info()
                       if p.get("user_api") == "blas" and "torch" not in str(p.get("filepath", ""))]
            if foreign:
                threadpool_limits(limits=1, user_api="blas")
        except ImportError:  # pragma: no cover - threadpoolctl is a dependency
            pass
        _applied = num_threads
    return num_threads


def current() -> int | None:
    """The thread count the engine last applied (None before the first session)."""
    return _applied
