"""How much memory the paged KV cache gets.

:func:`kv_cache_budget` is the one sizing policy every architecture uses:

* with an explicit ``kv_cache_memory`` (bytes per device; ``--kv-cache-memory``) the
  pool is exactly that (rounded down to whole pages);
* otherwise the pool holds what the model can use, ``max_batch_size`` sequences of
  ``max_seq_len`` tokens (a full batch at full length never runs out of pages), but no
  more than :data:`DEFAULT_KV_CACHE_TOKENS` tokens (and never less than one sequence of
  ``max_seq_len``): a small model with a long context (SmolLM2-135M: 16 x 8192 tokens
  of float32 K/V would be 5.6 GiB) does not reserve gigabytes it rarely fills; and
  no more than ``device_memory_utilization`` of the memory the device has free now
  (``--device-memory-utilization``; a pool capped by free memory is logged as a
  warning).  With a smaller pool the scheduler admits requests only while their
  pages (for their own maximum length, prompt + ``max_tokens``) fit, the others wait.

Either way the pool must hold at least one sequence of ``max_seq_len`` tokens, else a
``ValueError`` says what to change.  :func:`parse_memory_size` reads sizes such as
``"512MiB"``, ``"2G"`` or ``"1.5GB"``; :func:`format_bytes` prints them back.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from typing import Any, Optional, Union

from max.nn.kv_cache.cache_params import KVCacheParams

logger = logging.getLogger("max.nn.kv_cache")

DEFAULT_KV_CACHE_TOKENS = 32768
"""Most tokens a default-sized KV cache holds (all sequences together; ``--kv-cache-memory`` sets any
size): 16 sequences of 2048 tokens, or 4 of 8192."""

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kKmMgGtT]?)(i?)([bB]?)\s*$")


def parse_memory_size(value: Union[int, float, str]) -> int:
    """Bytes of a size given as an int or a string: ``"1073741824"``, ``"512MiB"``, ``"512M"``,
    ``"2GiB"``, ``"2G"`` (binary units) or ``"1.5GB"``, ``"800MB"`` (decimal units).

    Raises ``ValueError`` for anything else, and for sizes below one byte.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a memory size such as 512MiB or 2GiB, got {value!r}")
    if isinstance(value, (int, float)):
        n = float(value)
    else:
        m = _SIZE_RE.match(str(value))
        if m is None:
            raise ValueError(f"expected a memory size such as 512MiB, 2GiB or 1.5GB, got {value!r}")
        num, unit, binary, byte = m.groups()
        unit = unit.lower()
        if unit and byte and not binary:  # "GB": decimal
            scale = 1000 ** list(_UNITS).index(unit)
        else:  # "GiB", "G", "" (bytes)
            scale = _UNITS[unit]
        n = float(num) * scale
    if not math.isfinite(n) or n < 1:
        raise ValueError(f"a memory size must be at least 1 byte, got {value!r}")
    return int(n)


def format_bytes(n: float) -> str:
    """``n`` bytes as a short human-readable string (binary units: ``"3.0 GiB"``)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def available_memory(device: Any) -> Optional[int]:
    """Bytes free on ``device`` now (None when unknown): the accelerator's free memory, or on the
    host ``MemAvailable`` bounded by the process's cgroup memory limit."""
    if not getattr(device, "is_host", True):
        try:
            return int(device.stats["free_memory"])
        except Exception:  # noqa: BLE001 - no accelerator runtime: unknown
            return None
    free: Optional[int] = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
    except OSError:
        return None
    try:  # cgroup v2: the container's limit
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit != "max":
            with open("/sys/fs/cgroup/memory.current") as f:
                used = int(f.read().strip())
            room = max(0, int(limit) - used)
            free = room if free is None else min(free, room)
    except (OSError, ValueError):
        pass
    return free


def kv_cache_budget(
    params: KVCacheParams,
    num_layers: int,
    max_batch_size: int,
    max_seq_len: int,
    devices: Sequence[Any],
    *,
    kv_cache_memory: Optional[int] = None,
    device_memory_utilization: float = 0.9,
    state_bytes: int = 0,
) -> int:
    """Bytes (all devices together) to give the paged KV cache as ``available_cache_memory``.

    See the module docstring for the policy.  ``kv_cache_memory`` is per device.  ``state_bytes``: the
    recurrent-state slots a hybrid model keeps beside the pages (``HybridKVCacheManager``); they come
    out of the same budget first.
    """
    devices = list(devices)
    n_dev = max(1, len(devices))
    page_bytes = params.bytes_per_page(num_layers)
    page = params.effective_page_size
    pages_per_seq = math.ceil(max_seq_len / page)
    one_seq = pages_per_seq * page_bytes
    if state_bytes and kv_cache_memory is not None and state_bytes >= kv_cache_memory:
        raise ValueError(
            f"--kv-cache-memory {format_bytes(kv_cache_memory)} is too small: the recurrent-state slots alone take "
            f"{format_bytes(state_bytes)} ({max_batch_size} requests); raise --kv-cache-memory or lower "
            "--max-batch-size")
    if kv_cache_memory is not None:
        pages = (int(kv_cache_memory) - state_bytes) // page_bytes
        if pages < pages_per_seq:
            raise ValueError(
                f"--kv-cache-memory {format_bytes(kv_cache_memory)} is too small: one sequence of max_length "
                f"{max_seq_len} tokens needs {format_bytes(one_seq)} of KV cache "
                f"({pages_per_seq} pages of {page} tokens, {params.dtype_shorthand}); raise --kv-cache-memory "
                "or lower --max-length")
        return pages * page_bytes * n_dev
    if not 0.0 < device_memory_utilization <= 1.0:
        raise ValueError(f"device_memory_utilization must be in (0, 1], got {device_memory_utilization}")
    pages = min(max_batch_size * pages_per_seq, max(pages_per_seq, math.ceil(DEFAULT_KV_CACHE_TOKENS / page)))
    free = [available_memory(d) for d in devices]
    known = [f for f in free if f is not None]
    if known:
        cap_pages = max(0, int(min(known) * device_memory_utilization) - state_bytes) // page_bytes
        if cap_pages < pages_per_seq:
            raise ValueError(
                f"not enough free memory for the KV cache: one sequence of max_length {max_seq_len} tokens needs "
                f"{format_bytes(one_seq)} ({params.dtype_shorthand}) but {device_memory_utilization:.0%} of the "
                f"{format_bytes(min(known))} free is {format_bytes(cap_pages * page_bytes)}; lower --max-length, "
                "or set --kv-cache-memory / --device-memory-utilization")
        if cap_pages < pages:
            logger.warning(
                "KV cache capped at %s (%.0f%% of the %s free): room for %d tokens, less than the %d of its "
                "default size; requests wait for pages (set --kv-cache-memory, or lower --max-length / "
                "--max-batch-size)", format_bytes(cap_pages * page_bytes), device_memory_utilization * 100,
                format_bytes(min(known)), cap_pages * page, pages * page)
            pages = cap_pages
    return pages * page_bytes * n_dev
