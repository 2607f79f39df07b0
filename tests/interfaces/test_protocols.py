"""Queues (queue.Empty contract, drain/get_blocking), Pipeline ABC, tokenizer/context protocols."""

from __future__ import annotations

import asyncio
import queue
import threading

import pytest

from max.interfaces import (
    BaseContext,
    GenerationStatus,
    InputContext,
    MAXPullQueue,
    MAXPushQueue,
    Pipeline,
    PipelineTokenizer,
    Scheduler,
    TextGenerationOutput,
    drain_queue,
    get_blocking,
)


def test_stdlib_queue_satisfies_protocols():
    q: queue.Queue = queue.Queue(maxsize=2)
    assert isinstance(q, MAXPullQueue) and isinstance(q, MAXPushQueue)
    with pytest.raises(queue.Empty):
        q.get_nowait()
    q.put_nowait(1)
    q.put_nowait(2)
    with pytest.raises(queue.Full):
        q.put_nowait(3)
    assert drain_queue(q) == [1, 2]
    assert drain_queue(q) == []
    q2: queue.Queue = queue.Queue()
    for i in range(5):
        q2.put_nowait(i)
    assert drain_queue(q2, max_items=2) == [0, 1] and drain_queue(q2) == [2, 3, 4]


def test_get_blocking_waits_for_an_item():
    q: queue.Queue = queue.Queue()
    threading.Timer(0.05, lambda: q.put_nowait("x")).start()
    assert get_blocking(q) == "x"


def test_custom_pull_queue():
    class ListQueue:
        def __init__(self, items):
            self.items = list(items)

        def get_nowait(self):
            if not self.items:
                raise queue.Empty
            return self.items.pop(0)

    lq = ListQueue("ab")
    assert isinstance(lq, MAXPullQueue) and not isinstance(lq, MAXPushQueue)
    assert drain_queue(lq) == ["a", "b"]


def test_pipeline_abc():
    with pytest.raises(TypeError):
        Pipeline()  # abstract

    class Echo(Pipeline):
        def __init__(self):
            self.released = []

        def execute(self, inputs):
            return {rid: TextGenerationOutput(rid, [1], GenerationStatus.END_OF_SEQUENCE) for rid in inputs}

        def release(self, request_id):
            self.released.append(request_id)

    p = Echo()
    assert p.execute(["a"])["a"].is_done
    p.release("a")
    assert p.released == ["a"]

    class Lazy(Pipeline):
        def execute(self, inputs):
            return super().execute(inputs)

        def release(self, request_id):
            return super().release(request_id)

    with pytest.raises(NotImplementedError):
        Lazy().execute(None)
    with pytest.raises(NotImplementedError):
        Lazy().release("x")
    with pytest.raises(TypeError):
        Scheduler()


def test_tokenizer_protocol():
    class Tok:
        eos = 0
        expects_content_wrapping = False

        async def new_context(self, request):
            return request

        async def encode(self, prompt, add_special_tokens=True):
            if len(prompt) > 8:
                raise ValueError("prompt exceeds max length")
            return [ord(c) for c in prompt]

        async def decode(self, encoded, **kwargs):
            return "".join(chr(c) for c in encoded)

    t = Tok()
    assert isinstance(t, PipelineTokenizer)
    assert asyncio.run(t.decode(asyncio.run(t.encode("hi", True)))) == "hi"
    assert not isinstance(object(), PipelineTokenizer)


def test_context_protocols():
    class Ctx:
        request_id = "r"
        status = GenerationStatus.ACTIVE
        is_done = False

    assert isinstance(Ctx(), BaseContext)
    assert not isinstance(Ctx(), InputContext)
