"""The one scheduler behind ``LLM.generate`` and ``max serve``: continuous batching.

Requests arrive as ``TextContext`` objects with a callback.  Every step the
scheduler batches all running requests (decode: one token each) with new
prompts that fit the step's prompt-token budget, runs one
``TextGenerationPipeline.execute`` step, hands each request its new tokens
and text, and releases requests that finished (EOS, max tokens, a stop
string, or cancellation) so their KV pages are free for the next step.  A
failing request is finished with an error instead of failing its batch.

A request is admitted only while the KV cache can hold every running request
at its maximum length (prompt + max new tokens): when the pool is smaller than
``max_batch_size`` full-length sequences, requests wait in order instead of
running out of pages mid-generation.

Log probabilities (and every other per-token result) come from the pipeline's
outputs: the scheduler decides what runs, the pipeline computes.

The ``metrics`` hook object may define any of ``batch_size(n, queue_depth)``,
``step_seconds(s)``, ``first_token(s)``, ``inter_token(s)`` (seconds per token
between consecutive outputs of one request) and ``tokens_generated(n)``.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from max.interfaces import GenerationStatus, StepPlan, TextGenerationInputs
from max.pipelines.lib.config import batch_size_for
from max.pipelines.lib.step_plan import StepPlanner

logger = logging.getLogger("max.pipelines")


@dataclass
class StepOutput:
    """What a request gets after each step."""

    request_id: str
    tokens: list[int]
    text: str  # new text since the previous output
    done: bool
    finish_reason: Optional[str] = None  # "stop" | "length" | "cancelled" | "error"
    error: Optional[str] = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    log_probabilities: Any = None
    cached_tokens: int = 0  # prompt tokens whose K/V the prefix cache supplied (known once the prompt ran)
    stop_sequence: Optional[str] = None  # the stop string that ended the request (finish_reason "stop")


@dataclass
class _Entry:
    ctx: Any
    callback: Callable[[StepOutput], None]
    stop: list[str] = field(default_factory=list)
    text: str = ""
    emitted: int = 0  # chars of text already emitted
    generated: list[int] = field(default_factory=list)
    prefix_off: int = 0  # incremental detokenisation window over ``generated``
    read_off: int = 0
    cancelled: bool = False
    t_submit: float = field(default_factory=time.perf_counter)
    t_first: Optional[float] = None
    t_last: Optional[float] = None
    skip_special_tokens: bool = True
    pages: int = 0  # KV pages reserved for the request's maximum length
    cached_tokens: int = 0  # prompt tokens reused from the prefix cache


class QueueFull(RuntimeError):
    """The scheduler's waiting queue is at its bound."""


def prefill_chunk_size_of(pipeline_config: Any) -> Optional[int]:
    """The prompt tokens a request may run per step under ``pipeline_config`` (None: whole prompts)."""
    if pipeline_config is None or not getattr(pipeline_config, "enable_chunked_prefill", False):
        return None
    return max(1, int(pipeline_config.prefill_chunk_size))


class TokenGenerationScheduler:
    """Continuous batching over one ``TextGenerationPipeline``."""

    def __init__(self, pipeline: Any, tokenizer: Any, *, max_batch_size: Optional[int] = None,
                 max_queue_size: Optional[int] = None, prefill_token_budget: Optional[int] = None,
                 metrics: Any = None, prefill_chunk_size: Any = "config") -> None:
        self.pipeline = pipeline
        self.tokenizer = tokenizer
        self.max_batch_size = max(1, batch_size_for(max_batch_size, "text_generation"))  # None: the config's default
        self.max_queue_size = max_queue_size
        self.prefill_token_budget = prefill_token_budget or 4096
        self.prefill_chunk_size: Optional[int] = (
            prefill_chunk_size_of(getattr(pipeline, "pipeline_config", None)) if prefill_chunk_size == "config"
            else prefill_chunk_size)
        """Prompt tokens a request runs per step (None: whole prompts); default: the pipeline's config."""
        self.metrics = metrics
        self._waiting: "queue.Queue[_Entry]" = queue.Queue()
        self._running: dict[str, _Entry] = {}
        self._cancel: set[str] = set()
        self._cancel_waiting: set[str] = set()  # cancelled while still in the waiting queue
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._stop = False
        self._step_lock = threading.Lock()
        self._head: Optional[_Entry] = None  # the oldest waiting request, when its pages did not fit yet
        self.recoveries = 0  # steps that failed as a batch and were retried one request at a time
        # The model, its weights and compiled program are built and live as long as the process: move
        # them out of the cyclic collector's view, so the collections that decoding's short-lived
        # objects trigger do not traverse them every few steps (that was ~9 % of a SmolLM2 decode step).
        gc.collect()
        gc.freeze()

    # ---------------------------------------------------------------- submission
    def submit(self, ctx: Any, callback: Callable[[StepOutput], None], stop: Optional[list[str]] = None, *,
               skip_special_tokens: bool = True) -> None:
        """Queue a request; ``callback`` runs on the scheduler thread after each step.  Its text leaves
        special tokens out unless ``skip_special_tokens`` is False (e.g. to parse tool-call markers)."""
        if self.max_queue_size is not None and self._waiting.qsize() >= self.max_queue_size:
            raise QueueFull(f"the request queue is full ({self.max_queue_size} waiting)")
        self._waiting.put(_Entry(ctx, callback, [s for s in (stop or []) if s],
                                 skip_special_tokens=skip_special_tokens))
        self._wake.set()

    def cancel(self, request_id: str) -> None:
        """Stop generating for ``request_id`` and free its KV pages at the next step."""
        with self._lock:
            self._cancel.add(request_id)
        self._wake.set()

    @property
    def queue_depth(self) -> int:
        return self._waiting.qsize() + (self._head is not None)

    @property
    def running(self) -> int:
        return len(self._running)

    def in_flight(self) -> list[Any]:
        """The contexts of every request waiting or running."""
        with self._waiting.mutex:
            waiting = [e.ctx for e in self._waiting.queue]
        return [e.ctx for e in list(self._running.values())] + waiting

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the scheduler between steps (e.g. to change LoRA adapter slots safely)."""
        with self._step_lock:
            yield

    # ---------------------------------------------------------------- driving
    def start(self) -> None:
        """Run steps on a background thread until :meth:`shutdown`."""
        if self._thread is not None:
            return
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="max-scheduler", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop:
            if not self._running and not self.queue_depth:
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            self.step()

    def run_until_idle(self) -> None:
        """Step on the calling thread until no request is waiting or running."""
        while self._running or self.queue_depth:
            self.step()

    def step(self) -> None:
        with self._step_lock:
            self._step()

    def _admit(self) -> None:
        budget = self.prefill_token_budget
        kv = self._kv_manager()
        while len(self._running) < self.max_batch_size:
            e, self._head = self._head, None
            if e is None:
                try:
                    e = self._waiting.get_nowait()
                except queue.Empty:
                    return
            if e.ctx.request_id in self._cancel_waiting:
                self._cancel_waiting.discard(e.ctx.request_id)
                self._finish(e, "cancelled")
                continue
            if kv is not None:
                e.pages = -(-min(int(e.ctx.max_length or kv.max_seq_len), kv.max_seq_len) // kv.page_size)
                reserved = sum(r.pages for r in self._running.values())
                if self._running and reserved + e.pages > kv.total_num_pages:
                    self._head = e  # waits (first in line) until running requests free their pages
                    return
            n = int(e.ctx.active_length)
            self._running[e.ctx.request_id] = e
            budget -= n
            if budget <= 0:
                return

    def _kv_manager(self) -> Any:
        """The pipeline's paged KV cache (None for pipelines without one)."""
        try:
            kv = self.pipeline.kv_managers[0]
            int(kv.total_num_pages), int(kv.page_size), int(kv.max_seq_len)
        except Exception:  # noqa: BLE001 - e.g. a test double
            return None
        return kv

    def _step(self) -> None:
        with self._lock:
            cancelled, self._cancel = self._cancel, set()
        missing = set()
        for rid in cancelled:
            e = self._running.pop(rid, None)
            if e is not None:
                self._finish(e, "cancelled")
            else:
                missing.add(rid)
        if missing:  # still waiting (remembered until admitted), or already finished (forgotten)
            with self._waiting.mutex:
                waiting = {w.ctx.request_id for w in self._waiting.queue}
            if self._head is not None:
                waiting.add(self._head.ctx.request_id)
            self._cancel_waiting |= missing & waiting
        self._admit()
        if not self._running:
            return
        batch = {rid: e.ctx for rid, e in self._running.items()}
        self._hook("batch_size", len(batch), self._waiting.qsize())
        t0 = time.perf_counter()
        try:
            outputs = self._execute(batch)
        except Exception as err:  # noqa: BLE001 - isolate the failure to the offending request(s)
            self._recover(batch, err)
            return
        now = time.perf_counter()
        for rid, out in outputs.items():
            e = self._running.get(rid)
            if e is None:
                continue
            self._emit(e, out.tokens, out.final_status, now, out.log_probabilities)
        self._hook("step_seconds", now - t0)

    def _hook(self, name: str, *args: Any) -> None:
        fn = getattr(self.metrics, name, None) if self.metrics is not None else None
        if fn is not None:
            try:
                fn(*args)
            except Exception:  # noqa: BLE001 - metrics must never stop generation
                logger.exception("metrics hook %s failed", name)

    def plan(self, batch: dict) -> StepPlan:
        """This step's record (``step_plan.py``): what each request computes (prompt chunks, prefix reuse,
        snapshot points) under the pipeline's declared capabilities, and the pages reserved for each."""
        planner = StepPlanner(self.prefill_chunk_size, self.pipeline.step_capabilities)
        return planner.plan(batch.values(), {rid: self._running[rid].pages for rid in batch if rid in self._running})

    def _execute(self, batch: dict) -> dict:
        """One pipeline step over ``batch`` (``{request_id: context}``), as :meth:`plan` decides."""
        return self.pipeline.execute(TextGenerationInputs([batch], num_steps=1, plan=self.plan(batch)))

    def _recover(self, batch: dict, err: Exception) -> None:
        """A step failed: retry each request alone so one bad request cannot poison the batch."""
        logger.warning("batch step failed (%s); retrying requests one at a time", err)
        self.recoveries += 1
        for rid, ctx in batch.items():
            e = self._running.get(rid)
            if e is None:
                continue
            try:
                outs = self._execute({rid: ctx})
            except Exception as one:  # noqa: BLE001
                self._running.pop(rid, None)
                self._finish(e, "error", f"{type(one).__name__}: {one}")
                continue
            out = outs[rid]
            self._emit(e, out.tokens, out.final_status, time.perf_counter(), out.log_probabilities)

    def _emit(self, e: _Entry, tokens: list[int], status: GenerationStatus, now: float, logprobs: Any) -> None:
        ctx = e.ctx
        if not e.generated:  # still in its prompt: prefix-cache hits are found while the prompt runs
            self._note_cached(e)
        if tokens:
            if e.t_first is None:
                e.t_first = now
                self._hook("first_token", now - e.t_submit)
            elif e.t_last is not None:
                self._hook("inter_token", (now - e.t_last) / len(tokens))
            e.t_last = now
        e.generated.extend(tokens)
        done = status.is_done
        text = e.text + self._detokenize(e, final=done)
        reason = None
        matched = None
        if done:
            reason = "length" if status == GenerationStatus.MAXIMUM_LENGTH else "stop"
        if e.stop:
            hits = [(text.find(s, max(0, e.emitted - len(s))), s) for s in e.stop]
            hits = [(i, s) for i, s in hits if i >= 0]
            if hits:
                i, matched = min(hits)
                text = text[:i]
                done, reason = True, "stop"
        # hold back a possibly partial multi-byte character or stop-string prefix
        safe = len(text)
        if not done:
            if text.endswith("\ufffd"):
                safe = len(text.rstrip("\ufffd"))
            for s in e.stop:
                for k in range(min(len(s) - 1, safe), 0, -1):
                    if text[:safe].endswith(s[:k]):
                        safe -= k
                        break
        new_text = text[e.emitted:safe]
        e.emitted = max(e.emitted, safe)
        e.text = text
        out = StepOutput(ctx.request_id, list(tokens), new_text, done, reason,
                         prompt_tokens=int(getattr(ctx, "prompt_len", 0)), completion_tokens=len(e.generated),
                         log_probabilities=logprobs, cached_tokens=e.cached_tokens, stop_sequence=matched)
        if tokens:
            self._hook("tokens_generated", len(tokens))
        if done:
            self._running.pop(ctx.request_id, None)
            self.pipeline.release(ctx.request_id)
        try:
            e.callback(out)
        except Exception:  # noqa: BLE001 - a broken consumer must not stop the scheduler
            logger.exception("output callback for %s failed", ctx.request_id)

    def _detokenize(self, e: _Entry, final: bool = False) -> str:
        """Text added by the newest tokens: decodes only a short window (``prefix_off..``), so a step
        costs O(new tokens), and waits while the window ends in an incomplete UTF-8 sequence -- except
        on the request's last step (``final``), which flushes whatever is left: a step that brings
        several tokens at once (speculative decoding) must not lose their text when the last of them
        is a partial character."""
        gen = e.generated
        if len(gen) == e.read_off:
            return ""
        dec = self.tokenizer.decode_sync
        skip = e.skip_special_tokens
        before = dec(gen[e.prefix_off:e.read_off], skip_special_tokens=skip) if e.read_off > e.prefix_off else ""
        now = dec(gen[e.prefix_off:], skip_special_tokens=skip)
        if len(now) > len(before) and (final or not now.endswith("\ufffd")):
            e.prefix_off, e.read_off = e.read_off, len(gen)
            return now[len(before):]
        return ""

    def _note_cached(self, e: _Entry) -> None:
        """Record how many of ``e``'s prompt tokens the prefix cache supplied so far (before its release)."""
        cached = getattr(self._kv_manager(), "cached_tokens", None)  # absent: a manager without a prefix cache
        if cached is None:
            return
        n = int(cached(e.ctx.request_id))
        e.cached_tokens = max(e.cached_tokens, min(n, int(getattr(e.ctx, "prompt_len", n))))

    def _finish(self, e: _Entry, reason: str, error: Optional[str] = None) -> None:
        if not e.generated:
            self._note_cached(e)
        try:
            self.pipeline.release(e.ctx.request_id)
        except Exception:  # noqa: BLE001
            logger.exception("release of %s failed", e.ctx.request_id)
        try:
            e.callback(StepOutput(e.ctx.request_id, [], "", True, reason, error,
                                  prompt_tokens=int(getattr(e.ctx, "prompt_len", 0)),
                                  completion_tokens=len(e.generated), cached_tokens=e.cached_tokens))
        except Exception:  # noqa: BLE001
            logger.exception("output callback for %s failed", e.ctx.request_id)

