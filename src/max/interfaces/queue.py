"""Non-blocking queue protocols and helpers.

``MAXPullQueue.get_nowait`` raises :class:`queue.Empty` when nothing is available;
``MAXPushQueue.put_nowait`` never blocks and raises when it cannot enqueue (the
standard library's ``queue.Queue`` raises :class:`queue.Full`).  ``queue.Queue``,
``multiprocessing.Queue`` and ``collections``-backed wrappers all satisfy these protocols.
"""

from __future__ import annotations

import queue
import time
from typing import Protocol, TypeVar, runtime_checkable

ItemType = TypeVar("ItemType")
PullItemType = TypeVar("PullItemType")
PushItemType = TypeVar("PushItemType", contravariant=True)
_PullT = TypeVar("_PullT", covariant=True)


@runtime_checkable
class MAXPullQueue(Protocol[_PullT]):
    """Consumer side of a queue: a non-blocking ``get_nowait``."""

    def get_nowait(self) -> _PullT:
        """Remove and return an item without blocking.

        Raises:
            queue.Empty: If no item is available.
        """
        ...


@runtime_checkable
class MAXPushQueue(Protocol[PushItemType]):
    """Producer side of a queue: a non-blocking ``put_nowait``."""

    def put_nowait(self, item: PushItemType) -> None:
        """Add ``item`` without blocking; raise (e.g. ``queue.Full``) if it cannot be added now."""
        ...


def drain_queue(pull_queue: MAXPullQueue[PullItemType], max_items: int | None = None) -> list[PullItemType]:
    """Remove and return every item available now (``[]`` when the queue is empty).

    ``max_items`` (an extension) bounds how many items are taken.
    """
    out: list[PullItemType] = []
    while max_items is None or len(out) < max_items:
        try:
            out.append(pull_queue.get_nowait())
        except queue.Empty:
            break
    return out


def get_blocking(pull_queue: MAXPullQueue[PullItemType]) -> PullItemType:
    """The next item of ``pull_queue``, spinning (yielding the CPU) until one is available."""
    delay = 0.0
    while True:
        try:
            return pull_queue.get_nowait()
        except queue.Empty:
            time.sleep(delay)
            delay = min(0.001, delay + 0.0001)
