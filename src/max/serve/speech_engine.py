"""``SpeechEngine``: runs a text-to-speech pipeline (an ``AudioGenerator``: ``next_chunk(batch)``,
``release(request_id)``, e.g. :class:`~max.pipelines.architectures.csm.pipeline.CsmPipeline`) on one worker
thread with continuous batching: requests join the running batch between chunks (up to ``max_batch_size``)
and each chunk of audio goes to its request's stream as soon as it is made.  A request whose client went
away is released at the next chunk; a failing chunk fails the requests of that batch only."""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, AsyncIterator

from max.serve.worker_thread import QueueWorker

__all__ = ["SpeechEngine"]


class SpeechEngine(QueueWorker):
    def __init__(self, pipeline: Any, max_batch_size: int) -> None:
        super().__init__("max-speech")
        self.pipeline = pipeline
        self.max_batch_size = max(1, int(max_batch_size))
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()

    async def speak(self, ctx: Any) -> AsyncIterator[Any]:
        """The ``AudioGeneratorOutput`` chunks of ``ctx`` (a context the pipeline made), the last one final."""
        loop = asyncio.get_running_loop()
        out: "asyncio.Queue[Any]" = asyncio.Queue()
        self._queue.put((ctx, loop, out))
        done = False
        try:
            while not done:
                item = await out.get()
                if isinstance(item, BaseException):
                    raise item
                done = bool(item.is_done)
                yield item
        finally:
            if not done:
                with self._lock:
                    self._cancelled.add(ctx.request_id)

    def _run(self) -> None:
        active: dict[str, tuple] = {}
        while True:
            try:
                item = self._queue.get(block=not active)
            except queue.Empty:
                item = False
            while item is not False:
                if item is None:
                    for rid in active:
                        self.pipeline.release(rid)
                    return
                ctx = item[0]
                active[ctx.request_id] = item
                if len(active) >= self.max_batch_size:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    item = False
            with self._lock:
                gone = self._cancelled & set(active)
                self._cancelled -= gone
            for rid in gone:
                del active[rid]
                self.pipeline.release(rid)
            if not active:
                continue
            try:
                outs = self.pipeline.next_chunk({rid: it[0] for rid, it in active.items()})
            except Exception as e:  # noqa: BLE001 - the batch's waiters get the error; the engine goes on
                for rid, (_, loop, q) in active.items():
                    self.pipeline.release(rid)
                    loop.call_soon_threadsafe(q.put_nowait, e)
                active.clear()
                continue
            for rid, out in outs.items():
                _, loop, q = active[rid]
                loop.call_soon_threadsafe(q.put_nowait, out)
                if out.is_done:
                    del active[rid]

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() or not self._stopped
