"""``PageSpillStore``: the prefix cache's second tier, in host memory or in a disk directory.

When the page pool evicts a cached page (a free page still indexed by its hash chain value, see
``paged_cache``), the manager hands the page's contents -- K and V of every layer, one array per
device -- to this store under the same hash.  A later prompt whose prefix chain reaches that hash
gets the page back (copied into a freshly allocated pool page) instead of recomputing it.

The store is bounded (``capacity_bytes``); beyond it, the least recently stored or used pages are
dropped.  In memory (``directory=None``) pages are kept as host arrays; with a directory each page
is one file ``<hash hex>.kvpage`` (the arrays' bytes back to back), which the store deletes when it
drops the page and when it is cleared or closed.  Only pages this store wrote are ever read back.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

__all__ = ["PageSpillStore"]


class PageSpillStore:
    """A bounded LRU of evicted KV pages keyed by their prefix-hash (see the module docstring).

    Args:
        capacity_bytes: most bytes of pages kept (a page larger than this is never stored).
        directory: keep pages as files in this directory (created if missing) instead of host memory.
    """

    def __init__(self, capacity_bytes: int, directory: Optional[str | os.PathLike] = None) -> None:
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) or capacity_bytes < 1:
            raise ValueError(f"PageSpillStore: capacity_bytes must be a positive int, got {capacity_bytes!r}")
        self.capacity_bytes = capacity_bytes
        self.directory = Path(directory) if directory is not None else None
        if self.directory is not None:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ValueError(f"PageSpillStore: cannot use {str(self.directory)!r} as a spill directory: {e}") \
                    from None
            if not os.access(self.directory, os.W_OK):
                raise ValueError(f"PageSpillStore: spill directory {str(self.directory)!r} is not writable")
        # hash -> (in-memory arrays | None on disk, byte size); LRU first
        self._entries: OrderedDict[bytes, tuple[Optional[list[np.ndarray]], int]] = OrderedDict()
        self._layout: Optional[list[tuple[tuple[int, ...], np.dtype]]] = None
        self.bytes_used = 0
        self.stored_pages = 0
        """Pages written to the store (cumulative)."""
        self.hit_pages = 0
        """Pages read back on a prefix hit (cumulative)."""
        self.dropped_pages = 0
        """Pages dropped to stay within ``capacity_bytes`` (cumulative)."""

    # ---------------------------------------------------------------- queries
    def __contains__(self, h: bytes) -> bool:
        return h in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def kind(self) -> str:
        return "disk" if self.directory is not None else "host"

    def _path(self, h: bytes) -> Path:
        assert self.directory is not None
        return self.directory / f"{h.hex()}.kvpage"

    # ---------------------------------------------------------------- updates
    def put(self, h: bytes, arrays: Sequence[np.ndarray]) -> bool:
        """Store a page's arrays (one per device) under ``h``; False when it cannot fit at all."""
        arrays = [np.ascontiguousarray(a) for a in arrays]
        layout = [(a.shape, a.dtype) for a in arrays]
        if self._layout is None:
            self._layout = layout
        elif layout != self._layout:
            raise ValueError("PageSpillStore: every page must have the same shapes and dtypes")
        size = sum(a.nbytes for a in arrays)
        if size > self.capacity_bytes:
            return False
        if h in self._entries:
            self._entries.move_to_end(h)
            return True
        while self.bytes_used + size > self.capacity_bytes:
            self._drop_lru()
        if self.directory is None:
            self._entries[h] = ([a.copy() for a in arrays], size)
        else:
            tmp = self._path(h).with_suffix(".tmp")
            with open(tmp, "wb") as f:
                for a in arrays:
                    f.write(a.tobytes())
            os.replace(tmp, self._path(h))
            self._entries[h] = (None, size)
        self.bytes_used += size
        self.stored_pages += 1
        return True

    def get(self, h: bytes) -> Optional[list[np.ndarray]]:
        """The arrays stored under ``h`` (it becomes the most recently used), or None."""
        entry = self._entries.get(h)
        if entry is None:
            return None
        self._entries.move_to_end(h)
        arrays, _ = entry
        if arrays is None:
            assert self._layout is not None
            data = bytearray(self._path(h).read_bytes())  # writable: torch copies from it
            arrays, pos = [], 0
            for shape, dt in self._layout:
                n = int(np.prod(shape)) * dt.itemsize
                arrays.append(np.frombuffer(data, dtype=dt, count=n // dt.itemsize, offset=pos).reshape(shape))
                pos += n
        self.hit_pages += 1
        return arrays

    def discard(self, h: bytes) -> None:
        """Forget ``h`` (e.g. once its page is back in the pool)."""
        entry = self._entries.pop(h, None)
        if entry is not None:
            self._forget(h, entry[1])

    def clear(self) -> None:
        for h in list(self._entries):
            self.discard(h)

    def close(self) -> None:
        """Delete every stored page (and its file)."""
        self.clear()

    def _drop_lru(self) -> None:
        h, (_, size) = self._entries.popitem(last=False)
        self._forget(h, size)
        self.dropped_pages += 1

    def _forget(self, h: bytes, size: int) -> None:
        self.bytes_used -= size
        if self.directory is not None:
            try:
                self._path(h).unlink()
            except FileNotFoundError:
                pass
