"""Graceful shutdown of ``max serve``: admitting -> draining -> aborting -> exit.

On the first SIGTERM/SIGINT the server stops admitting work (new generation and embeddings
requests get 503 ``server_shutting_down``, ``/health`` says ``draining``) and lets the requests
in flight finish for up to the drain timeout.  Requests still running then are ended: a
stream gets an OpenAI error event and ``data: [DONE]``, a non-streaming request a 503.  Then
uvicorn shuts down and the process exits with status 0.  A second signal skips the wait.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any, Optional

logger = logging.getLogger("max.serve")

DEFAULT_DRAIN_TIMEOUT_S = 20.0
ABORT_GRACE_S = 5.0  # how long aborted requests get to send their last bytes


class Lifecycle:
    """The server's shutdown state, shared by the middleware, the routes and the uvicorn server."""

    def __init__(self) -> None:
        self.draining = False  # no new work is admitted
        self.aborting = False  # requests still running must end now
        self.in_flight = 0  # /v1 requests being answered (streams until their last byte)

    async def drain(self, timeout: float, grace: float = ABORT_GRACE_S) -> None:
        """Stop admitting, wait up to ``timeout`` s for the requests in flight, then abort the rest and
        give them ``grace`` s to finish their responses."""
        self.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self.in_flight:
            logger.warning("draining: waiting up to %.0f s for %d request(s) in flight", timeout, self.in_flight)
        while self.in_flight and not self.aborting and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if self.in_flight:
            logger.warning("drain timeout: ending %d request(s) still in flight", self.in_flight)
        self.aborting = True
        end = loop.time() + grace
        while self.in_flight and loop.time() < end:
            await asyncio.sleep(0.05)


def draining_server(config: Any, lifecycle: Lifecycle, drain_timeout: float) -> Any:
    """A ``uvicorn.Server`` whose SIGTERM/SIGINT drain ``lifecycle`` before shutting down, and whose
    process then exits 0 (uvicorn itself re-raises the signal after its shutdown)."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        _exit_requested = False
        _drain_task: Optional["asyncio.Task[None]"] = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            if not self._exit_requested:
                self._exit_requested = True
                lifecycle.draining = True  # from now on new work gets 503
                logger.warning("received %s: no new requests; draining for up to %.0f s (send it again to stop "
                               "now)", signal.Signals(sig).name, drain_timeout)
                return
            lifecycle.aborting = True
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True

        async def on_tick(self, counter: int) -> bool:
            if self._exit_requested and self._drain_task is None:
                self._drain_task = asyncio.create_task(self._drain())
            return await super().on_tick(counter)

        async def _drain(self) -> None:
            try:
                await lifecycle.drain(drain_timeout)
            finally:
                self.should_exit = True

    return DrainingServer(config)
