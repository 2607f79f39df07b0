"""One HTTP generation request as a job: its choices (prompt x ``n``) submitted to the scheduler,
their outputs collected (or streamed) on the event loop.

Tokenisation and chat templates run in the default executor; the scheduler's per-step callbacks
hand each output to the waiting handler with ``loop.call_soon_threadsafe`` into an
``asyncio.Queue``.  A client that goes away (streaming or not) cancels the job's requests, which
frees their KV pages at the next step; a full waiting queue answers 503 with ``Retry-After``.
When the server's drain times out (:mod:`max.serve.lifecycle`) the job's requests are cancelled:
a stream ends with an error event and ``[DONE]``, a non-streaming request gets 503.  Failures
inside generation reach the client as a short message with a reference; the details (which may
name files) go to the server log only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional

from fastapi import Request
from fastapi.responses import StreamingResponse

from max.interfaces import SamplingParams, TextGenerationRequest
from max.interfaces.sampling import TOP_K_DISABLED
from max.pipelines.lib.scheduler import QueueFull, StepOutput
from max.pipelines.lib.structured_output import GrammarError
from max.serve.engines import GenerationEngine
from max.serve.invalid import FieldMap, expect
from max.serve.lifecycle import Lifecycle
from max.serve.openai_schemas import SEED_MAX, APIError
from max.serve.state import AppState

logger = logging.getLogger("max.serve")

RETRY_AFTER_SECONDS = 1
DISCONNECT_POLL_S = 0.25


@dataclass
class Choice:
    index: int
    ctx: Any
    prompt_index: int
    text: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    finish_reason: Optional[str] = None
    error: Optional[str] = None
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the prefix cache supplied
    stop_sequence: Optional[str] = None  # the stop string that ended the choice
    done: bool = False


class ClientGone(Exception):
    pass


class ServerShutdown(Exception):
    """The server's drain timed out while the job was still running."""


SHUTDOWN_MESSAGE = "the server is shutting down; the request was stopped before it finished"


@dataclass
class Job:
    id: str
    created: int
    choices: list[Choice]
    queue: "asyncio.Queue[tuple[int, StepOutput]]"
    request: Request
    scheduler: Any
    prompt_tokens: int = 0
    t0: float = field(default_factory=time.perf_counter)
    lifecycle: Lifecycle = field(default_factory=Lifecycle)

    def cancel_unfinished(self) -> None:
        for c in self.choices:
            if not c.done:
                self.scheduler.cancel(c.ctx.request_id)
                c.done = True
                c.finish_reason = "cancelled"

    async def next(self) -> tuple[int, StepOutput]:
        """The next output of any choice; cancels everything when the client has gone away
        (``ClientGone``) or the server stops waiting for running requests (``ServerShutdown``)."""
        while True:
            if self.lifecycle.aborting:
                self.cancel_unfinished()
                raise ServerShutdown()
            try:
                return await asyncio.wait_for(self.queue.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await self.request.is_disconnected():
                    self.cancel_unfinished()
                    raise ClientGone() from None

    @property
    def all_done(self) -> bool:
        return all(c.done for c in self.choices)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the prefix cache supplied, counted as ``prompt_tokens`` counts prompts: once per
        prompt (its first choice)."""
        seen: set[int] = set()
        n = 0
        for c in self.choices:
            if c.prompt_index not in seen:
                seen.add(c.prompt_index)
                n += c.cached_tokens
        return n

    def usage(self) -> dict[str, Any]:
        comp = sum(c.completion_tokens for c in self.choices)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": comp,
                "total_tokens": self.prompt_tokens + comp,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


_PARAM_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}
_PROMPT_PARAMS = ("prompt", "messages", "images", None)  # the body's prompt (or chat messages) field


SAMPLING_FIELDS = FieldMap(rename=_PARAM_NAMES)
"""The body's names of ``SamplingParams``' fields."""


def sampling_params(req: Any, max_new: Optional[int], seed: Optional[int]) -> SamplingParams:
    """The request body's sampling fields as ``SamplingParams`` (InvalidRequest naming the field when invalid:
    the route's handler answers it with :data:`SAMPLING_FIELDS`)."""
    kw: dict[str, Any] = {}
    for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty", "stop_token_ids", "logit_bias"):
        v = getattr(req, name, None)
        if v is not None:
            kw[name] = v
    # OpenAI / vLLM semantics: no top_k (or vLLM's -1) means no limit, the whole vocabulary (the Python
    # SamplingParams default -1 is the reference's top 255)
    if kw.get("top_k") in (None, -1):
        kw["top_k"] = TOP_K_DISABLED
    if req.stop_list:
        kw["stop"] = req.stop_list
    kw["min_new_tokens"] = req.min_tokens
    kw["ignore_eos"] = req.ignore_eos
    if max_new is not None:
        kw["max_new_tokens"] = max_new
    if seed is not None:
        kw["seed"] = seed
    return SamplingParams(**kw)


def _new_context(tokenizer: Any, treq: TextGenerationRequest) -> Any:
    return asyncio.run(tokenizer.new_context(treq))


async def start_job(state: AppState, gen: GenerationEngine, request: Request, rid: str, inputs: list[dict],
                    req: Any, max_new: Optional[int], *, logprobs: int, echo: bool, chat_extra: dict,
                    explicit_max: bool = True, constraint: Optional[tuple[Optional[dict], str]] = None,
                    raw_text: bool = False) -> Job:
    """Tokenise every (input, choice) pair, check lengths and output constraints (compiled per
    choice: each gets its own grammar state), and submit them to the scheduler.  ``constraint``
    (``(response_format, field)``) replaces the body's own; ``raw_text`` keeps special tokens in the
    outputs' text (tool-call parsing)."""
    response_format, constraint_field = constraint if constraint is not None else req.constraint()
    prompt_lp = getattr(req, "prompt_logprobs", None)
    if (prompt_lp is not None or (echo and logprobs)) and not gen.echo_enabled:
        raise APIError(400, "prompt log probabilities (echo with logprobs, prompt_logprobs) need the model served "
                       "with --enable-echo", param="prompt_logprobs" if prompt_lp is not None else "echo")
    if prompt_lp is not None:  # the pipeline computes the prompt's entries when the request echoes
        echo, logprobs = True, max(logprobs, prompt_lp, 1)
    loop = asyncio.get_running_loop()
    tok = gen.tokenizer
    max_len = gen.max_length
    prompt_field = "messages" if "messages" in inputs[0] else "prompt"
    job = Job(rid, int(time.time()), [], asyncio.Queue(), request, gen.scheduler, lifecycle=state.lifecycle)
    for p_i, inp in enumerate(inputs):
        for j in range(max(req.n, getattr(req, "best_of", None) or 0)):  # best_of: candidates to rank
            seed = None if req.seed is None else (req.seed + j) % (SEED_MAX + 1)
            expect(request, SAMPLING_FIELDS)
            params = sampling_params(req, max_new, seed)
            expect(request, FieldMap(rename={**_PARAM_NAMES, **{p: prompt_field for p in _PROMPT_PARAMS},
                                             "response_format": constraint_field},
                                     prefix="" if len(inputs) == 1 else f"prompt[{p_i}]: "))
            treq_id = f"{rid}-{p_i}-{j}"
            try:
                treq = TextGenerationRequest(request_id=treq_id,
                                             model_name=state.adapter(req.model) or state.model_name,
                                             sampling_params=params, logprobs=logprobs, echo=echo,
                                             response_format=response_format,
                                             **inp, **{k: v for k, v in chat_extra.items() if v is not None})
                ctx = await loop.run_in_executor(None, _new_context, tok, treq)
            except GrammarError as e:
                param = e.param if constraint_field == "response_format" else constraint_field
                raise APIError(400, str(e), param=param, code="invalid_response_format") from None
            n_prompt = int(ctx.prompt_len)
            if max_new is not None and explicit_max and max_len is not None and n_prompt + max_new > max_len:
                raise APIError(400, f"max_tokens ({max_new}) plus the prompt ({n_prompt} tokens) exceeds the "
                               f"model's context length ({max_len} tokens); request at most {max_len - n_prompt} "
                               "new tokens", param="max_completion_tokens" if getattr(
                                   req, "max_completion_tokens", None) is not None else "max_tokens",
                               code="context_length_exceeded")
            if j == 0:
                job.prompt_tokens += n_prompt
            job.choices.append(Choice(len(job.choices), ctx, p_i))
    expect(request, None)

    def make_cb(i: int) -> Any:
        def cb(out: StepOutput) -> None:
            try:
                loop.call_soon_threadsafe(job.queue.put_nowait, (i, out))
            except RuntimeError:  # the loop is closed (server shutting down)
                pass

        return cb

    stop = req.stop_list
    submitted: list[Choice] = []
    try:
        for c in job.choices:
            gen.scheduler.submit(c.ctx, make_cb(c.index), stop=stop, skip_special_tokens=not raw_text)
            submitted.append(c)
    except QueueFull as e:
        for c in submitted:
            gen.scheduler.cancel(c.ctx.request_id)
        raise APIError(503, f"the server is overloaded: {e}; retry later", code="queue_full",
                       headers={"Retry-After": str(RETRY_AFTER_SECONDS)}) from None
    state.metrics.prompt_tokens.inc(job.prompt_tokens)
    return job


def apply_output(job: Job, i: int, out: StepOutput) -> Choice:
    c = job.choices[i]
    c.tokens.extend(out.tokens)
    if out.text:
        c.text.append(out.text)
    if out.log_probabilities:
        c.logprobs.extend(out.log_probabilities)
    c.completion_tokens = out.completion_tokens
    c.cached_tokens = max(c.cached_tokens, out.cached_tokens)
    if out.done:
        c.done = True
        c.finish_reason = out.finish_reason
        c.error = out.error
        c.stop_sequence = out.stop_sequence
    return c


def finish_job(state: AppState, job: Job) -> None:
    state.metrics.e2e.observe(time.perf_counter() - job.t0)
    for c in job.choices:
        state.metrics.finished.labels(reason=c.finish_reason or "unknown").inc()


def public_error(detail: str, job_id: str = "") -> str:
    """The message a client sees for a generation failure: a reference into the server log, where
    ``detail`` (which may name files or internals) is written."""
    ref = uuid.uuid4().hex[:12]
    logger.error("generation failed%s (reference %s): %s", f" for {job_id}" if job_id else "", ref, detail)
    return f"generation failed (reference {ref}; the details are in the server log)"


def _raise_errors(job: Job) -> None:
    errs = [c.error or "unknown error" for c in job.choices if c.finish_reason == "error"]
    if errs:
        raise APIError(500, public_error(errs[0], job.id), code="generation_error")


async def collect(state: AppState, job: Job) -> None:
    """Wait for every choice to finish (non-streaming responses)."""
    try:
        while not job.all_done:
            i, out = await job.next()
            apply_output(job, i, out)
    except asyncio.CancelledError:
        job.cancel_unfinished()
        raise
    except ClientGone:
        finish_job(state, job)
        raise APIError(499, "client closed the request") from None
    except ServerShutdown:
        finish_job(state, job)
        raise APIError(503, SHUTDOWN_MESSAGE, code="server_shutting_down") from None
    finish_job(state, job)
    _raise_errors(job)


async def stream_outputs(state: AppState, job: Job) -> AsyncIterator[tuple[Choice, StepOutput]]:
    """Each output as it arrives; cancels the unfinished requests when the consumer stops early
    (the client disconnected: Starlette cancels the streaming task)."""
    try:
        while not job.all_done:
            try:
                i, out = await job.next()
            except ServerShutdown:
                # one error event for the stream (the route turns it into an OpenAI error event), then [DONE]
                c = job.choices[0]
                yield c, StepOutput(c.ctx.request_id, [], "", True, "error", SHUTDOWN_MESSAGE)
                return
            yield apply_output(job, i, out), out
    except ClientGone:
        return
    finally:
        if not job.all_done:
            job.cancel_unfinished()
        finish_job(state, job)


def sse(gen: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(gen, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def sse_data(obj: Any) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def error_event(msg: str) -> str:
    """An SSE error event in OpenAI's error shape for a stream's failure ``msg`` (the server's shutdown,
    or a generation failure, which the client sees only as a reference into the server log)."""
    if msg == SHUTDOWN_MESSAGE:
        return sse_data(APIError(503, msg, code="server_shutting_down").body())
    return sse_data(APIError(500, public_error(msg), code="generation_error").body())
