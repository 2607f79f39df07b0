"""Helpers of the serving tests (a unique module name, so it never clashes with another conftest)."""

from __future__ import annotations

import time

from lm_support import CHAT_TEMPLATE, make_tiny_bert, make_tiny_llama  # noqa: F401 - re-exported for the serve tests

MAX_LENGTH = 256


def kv_pages_in_use(server) -> int:
    mgr = server.engine.kv_manager
    return mgr.total_num_pages - mgr.num_free_pages


def wait_idle(server, timeout: float = 10.0) -> None:
    """Wait until the scheduler has no waiting or running request and no KV page is in use."""
    sched = server.engine.scheduler
    t0 = time.monotonic()
    while sched.running or sched.queue_depth or kv_pages_in_use(server):
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"not idle after {timeout} s: running={sched.running} queued={sched.queue_depth} "
                                 f"pages in use={kv_pages_in_use(server)}")
        time.sleep(0.02)


def make_context(server, prompt: str, params):
    """A ``TextContext`` for ``prompt`` made by the served model's tokenizer."""
    import asyncio
    import uuid

    from max.interfaces import TextGenerationRequest

    req = TextGenerationRequest(request_id=uuid.uuid4().hex, model_name="tiny", prompt=prompt, sampling_params=params)
    return asyncio.run(server.engine.tokenizer.new_context(req))
