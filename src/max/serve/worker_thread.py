"""``QueueWorker``: the part the serving engines that run a pipeline on one worker thread share: a request
queue the thread drains (``None`` tells it to finish), and starting and stopping that thread."""

from __future__ import annotations

import queue
import threading
from typing import Any

__all__ = ["QueueWorker"]


class QueueWorker:
    """Base of an engine whose ``_run`` (the subclass's) serves ``_queue`` on a daemon thread named ``name``."""

    def __init__(self, name: str) -> None:
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._stopped = False

    def _run(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        if not self._thread.is_alive() and not self._stopped:
            self._thread.start()

    def stop(self) -> None:
        self._stopped = True
        self._queue.put(None)
