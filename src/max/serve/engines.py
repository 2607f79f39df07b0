"""What the app serves: a text-generation engine (tokenizer + scheduler) or an embeddings engine."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Optional

import numpy as np

from max.serve.worker_thread import QueueWorker


class GenerationEngine:
    """What the app needs to generate: a tokenizer (``new_context``, ``decode_sync``, ``max_length``)
    and a :class:`~max.pipelines.lib.scheduler.TokenGenerationScheduler` the app starts and stops;
    ``kv_manager`` feeds the page metrics, ``pipeline`` is the pipeline the scheduler drives."""

    def __init__(self, tokenizer: Any, scheduler: Any, kv_manager: Any = None, max_length: Optional[int] = None,
                 pipeline: Any = None) -> None:
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self.kv_manager = kv_manager
        self.pipeline = pipeline
        self.max_length = max_length if max_length is not None else getattr(tokenizer, "max_length", None)

    @classmethod
    def from_pipeline(cls, tokenizer: Any, pipeline: Any, scheduler: Any) -> "GenerationEngine":
        kv = None
        try:
            kv = pipeline.kv_managers[0]
        except Exception:  # noqa: BLE001 - a pipeline without a paged cache has no page metrics
            pass
        return cls(tokenizer, scheduler, kv, pipeline=pipeline)

    @property
    def lora(self) -> Any:
        """The model's LoRA adapter manager (None when the model was built without LoRA)."""
        return getattr(getattr(self.pipeline, "pipeline_model", None), "lora_manager", None)

    @property
    def echo_enabled(self) -> bool:
        """Whether the pipeline computes prompt log probabilities (``PipelineConfig.enable_echo``)."""
        return bool(getattr(self.pipeline, "echo_enabled", False))

    def start(self) -> None:
        self.scheduler.start()

    def stop(self) -> None:
        self.scheduler.shutdown()

    @property
    def alive(self) -> bool:
        t = getattr(self.scheduler, "_thread", None)
        return t is None or t.is_alive()


class EmbeddingsEngine:
    """Runs ``pipeline.encode_texts(texts) -> (float32 (n, dim), prompt_tokens)`` on one worker thread
    (``texts``: strings and/or token-id lists, as ``EmbeddingsPipeline.encode_texts`` takes them)."""

    def __init__(self, pipeline: Any, max_length: Optional[int] = None) -> None:
        self.pipeline = pipeline
        self.max_length = max_length
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="max-embeddings")

    async def embed(self, texts: list[Any]) -> tuple[np.ndarray, int]:
        loop = asyncio.get_running_loop()
        arr, n_tokens = await loop.run_in_executor(self._pool, self.pipeline.encode_texts, texts)
        return np.asarray(arr, dtype=np.float32), int(n_tokens)

    @property
    def cross_encoder(self) -> bool:
        """Whether the model scores text pairs (a reranker) instead of embedding texts."""
        return bool(getattr(self.pipeline, "cross_encoder", False))

    async def score(self, pairs: list[tuple[str, str]]) -> tuple[np.ndarray, int]:
        """``pipeline.score_pairs(pairs)`` on the worker thread: ``(scores [n], prompt tokens)``."""
        loop = asyncio.get_running_loop()
        scores, n_tokens = await loop.run_in_executor(self._pool, self.pipeline.score_pairs, pairs)
        return np.asarray(scores, dtype=np.float64), int(n_tokens)

    def start(self) -> None:
        pass

    def stop(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def alive(self) -> bool:
        return True


class TranscriptionEngine(QueueWorker):
    """Runs speech recognition (``pipeline.transcribe(requests) -> transcriptions``, a
    :class:`~max.pipelines.architectures.whisper.transcribe.WhisperPipeline`) on one worker thread; requests
    waiting when the worker is free run together as one batch (up to ``max_batch_size``).  Each request is
    checked (``pipeline.check``) before it joins a batch, so a bad one fails alone."""

    def __init__(self, pipeline: Any, max_batch_size: int, max_audio_seconds: float = 1800.0) -> None:
        super().__init__("max-transcribe")
        self.pipeline = pipeline
        self.max_batch_size = max(1, int(max_batch_size))
        self.max_audio_seconds = float(max_audio_seconds)

    async def transcribe(self, request: Any) -> Any:
        self.pipeline.check(request)  # ValueError before it can touch a batch
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        self._queue.put((request, loop, fut))
        return await fut

    def _run(self) -> None:
        import queue

        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < self.max_batch_size:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                batch.append(nxt)
            try:
                outs = self.pipeline.transcribe([r for r, _, _ in batch])
                results: list[Any] = list(outs)
            except Exception as e:  # noqa: BLE001 - every waiter gets the error
                results = [e] * len(batch)
            for (_, loop, fut), res in zip(batch, results):
                loop.call_soon_threadsafe(_settle, fut, res)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


def _settle(fut: "asyncio.Future[Any]", res: Any) -> None:
    if fut.done():
        return
    if isinstance(res, BaseException):
        fut.set_exception(res)
    else:
        fut.set_result(res)
