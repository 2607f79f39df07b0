"""The OpenAI-compatible HTTP app of ``max serve`` (FastAPI).

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/embeddings``,
``GET /v1/models`` (+ ``/v1/models/{id}``), ``GET /health``, ``GET /metrics``.

Model work never runs on the event loop.  Generation requests become
``TextContext`` objects submitted to the shared :class:`TokenGenerationScheduler`,
whose thread runs the batched model steps; its per-step callbacks hand each
output to the waiting handler with ``loop.call_soon_threadsafe`` into an
``asyncio.Queue``.  Tokenisation / chat templates run in the default executor,
embeddings on a single worker thread.  A client that goes away (streaming or
not) cancels its requests, which frees their KV pages at the next step; a full
waiting queue answers 503 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import dataclasses
import json
import logging
import re
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional, Union

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from max.interfaces import SamplingParams, TextGenerationRequest
from max.serve.metrics import ServeMetrics
from max.serve.openai_schemas import APIError, ChatCompletionRequest, CompletionRequest, EmbeddingRequest, parse
from max.serve.scheduler import QueueFull, StepOutput

logger = logging.getLogger("max.serve")

RETRY_AFTER_SECONDS = 1
_DISCONNECT_POLL_S = 0.25


# ---------------------------------------------------------------------------- engines
class GenerationEngine:
    """What the app needs to generate: a tokenizer (``new_context``, ``decode_sync``, ``max_length``)
    and a started-by-the-app :class:`TokenGenerationScheduler`; ``kv_manager`` feeds the page metrics."""

    def __init__(self, tokenizer: Any, scheduler: Any, kv_manager: Any = None, max_length: Optional[int] = None
                 ) -> None:
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self.kv_manager = kv_manager
        self.max_length = max_length if max_length is not None else getattr(tokenizer, "max_length", None)

    @classmethod
    def from_llm(cls, llm: Any) -> "GenerationEngine":
        kv = None
        try:
            kv = llm.pipeline.kv_managers[0]
        except Exception:  # noqa: BLE001
            pass
        return cls(llm.tokenizer, llm.scheduler, kv)

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

    def start(self) -> None:
        pass

    def stop(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def alive(self) -> bool:
        return True


@dataclass
class AppState:
    model_name: str
    generator: Optional[GenerationEngine] = None
    embedder: Optional[EmbeddingsEngine] = None
    api_key: Optional[str] = None
    metrics: ServeMetrics = field(default_factory=ServeMetrics)
    aliases: set[str] = field(default_factory=set)
    created: int = field(default_factory=lambda: int(time.time()))

    def check_model(self, name: Optional[str]) -> None:
        if name is None or name == self.model_name or name in self.aliases:
            return
        raise APIError(404, f"The model '{name}' does not exist; this server serves '{self.model_name}'",
                       param="model", code="model_not_found")


# ---------------------------------------------------------------------------- app
def create_app(model_name: str, *, generator: Optional[GenerationEngine] = None,
               embedder: Optional[EmbeddingsEngine] = None, api_key: Optional[str] = None,
               metrics: Optional[ServeMetrics] = None, aliases: Any = ()) -> FastAPI:
    """The FastAPI app serving ``generator`` (chat / completions) or ``embedder`` (embeddings).

    The app starts the engine's scheduler thread on startup and stops it on shutdown.
    """
    if generator is None and embedder is None:
        raise ValueError("create_app: give a generator or an embedder")
    metrics = metrics or ServeMetrics()
    if generator is not None:
        metrics.bind(generator.scheduler, generator.kv_manager)
    state = AppState(model_name, generator, embedder, api_key, metrics, set(aliases) - {None})

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for eng in (generator, embedder):
            if eng is not None:
                eng.start()
        try:
            yield
        finally:
            for eng in (generator, embedder):
                if eng is not None:
                    eng.stop()

    app = FastAPI(title="libremax max serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.serve = state

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        e = APIError(exc.status_code, str(exc.detail), code="not_found" if exc.status_code == 404 else None)
        return JSONResponse(e.body(), status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s", request.url.path)
        e = APIError(500, f"internal server error: {type(exc).__name__}: {exc}")
        return JSONResponse(e.body(), status_code=500)

    app.add_middleware(_AuthAndCount, state=state)

    # ------------------------------------------------------------------ simple routes
    @app.get("/health")
    async def health() -> JSONResponse:
        ok = all(e.alive for e in (generator, embedder) if e is not None)
        return JSONResponse({"status": "ok" if ok else "unhealthy"}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        body, ctype = metrics.render()
        return Response(body, media_type=ctype)

    def _model_card() -> dict[str, Any]:
        eng = generator or embedder
        return {"id": model_name, "object": "model", "created": state.created, "owned_by": "libremax",
                "max_model_len": getattr(eng, "max_length", None)}

    @app.get("/v1/models")
    async def list_models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [_model_card()]})

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> JSONResponse:
        state.check_model(model_id)
        return JSONResponse(_model_card())

    # ------------------------------------------------------------------ generation
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        req = parse(ChatCompletionRequest, await _json(request))
        state.check_model(req.model)
        gen = _need_generator(state, "/v1/chat/completions")
        if req.response_format is not None and req.response_format.get("type") not in ("text", None):
            raise APIError(400, f"response_format of type {req.response_format.get('type')!r} is not supported "
                           "(no constrained decoding); use 'text'", param="response_format")
        if req.top_logprobs is not None and req.top_logprobs > 0 and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        n_top = (req.top_logprobs or 0) if req.logprobs else 0
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        for m in messages:
            if m["role"] == "developer":
                m["role"] = "system"
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        job = await _start(state, gen, request, rid, [dict(messages=messages)], req, req.max_new_tokens,
                           logprobs=(max(1, n_top) if req.logprobs else 0), echo=False,
                           chat_extra=dict(tools=req.tools, chat_template_options=req.chat_template_kwargs))
        if req.stream:
            return _sse(_chat_stream(state, gen, job, req, n_top))
        return JSONResponse(await _chat_full(state, gen, job, req, n_top))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req = parse(CompletionRequest, await _json(request))
        state.check_model(req.model)
        gen = _need_generator(state, "/v1/completions")
        if req.suffix:
            raise APIError(400, "suffix is not supported", param="suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise APIError(400, "best_of is not supported (must equal n)", param="best_of")
        rid = f"cmpl-{uuid.uuid4().hex}"
        prompts = req.prompts()
        job = await _start(state, gen, request, rid, [dict(prompt=p) for p in prompts], req, req.max_new_tokens,
                           logprobs=(max(1, req.logprobs) if req.logprobs is not None else 0), echo=req.echo,
                           chat_extra={}, explicit_max=req.max_tokens is not None)
        if req.stream:
            return _sse(_completion_stream(state, gen, job, req))
        return JSONResponse(await _completion_full(state, gen, job, req))

    # ------------------------------------------------------------------ embeddings
    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> JSONResponse:
        req = parse(EmbeddingRequest, await _json(request))
        state.check_model(req.model)
        if embedder is None:
            raise APIError(400, f"the model '{model_name}' is a text generation model and does not serve "
                           "embeddings; use /v1/chat/completions or /v1/completions", param="model",
                           code="model_not_supported")
        inp = req.input
        if isinstance(inp, str):
            texts: list[Any] = [inp]
        elif inp and all(isinstance(t, int) for t in inp):
            texts = [list(inp)]  # one input given as token ids
        else:
            texts = list(inp)
        if not texts:
            raise APIError(400, "input must not be empty", param="input")
        if any(len(t) == 0 for t in texts):
            raise APIError(400, "input strings / token lists must not be empty", param="input")
        try:
            arr, n_tokens = await embedder.embed(texts)
        except (ValueError, TypeError) as e:
            raise APIError(400, str(e), param="input") from None
        if arr.ndim != 2 or arr.shape[0] != len(texts):
            raise APIError(500, f"the embeddings pipeline returned shape {arr.shape} for {len(texts)} inputs")
        if req.dimensions is not None:
            if req.dimensions > arr.shape[1]:
                raise APIError(400, f"dimensions ({req.dimensions}) exceeds the model's {arr.shape[1]}",
                               param="dimensions")
            arr = arr[:, :req.dimensions]
            arr = arr / np.maximum(np.linalg.norm(arr, axis=1, keepdims=True), 1e-12)
        data = []
        for i, row in enumerate(arr):
            row = np.ascontiguousarray(row, dtype="<f4")
            emb: Union[str, list[float]] = (base64.b64encode(row.tobytes()).decode("ascii")
                                            if req.encoding_format == "base64" else row.tolist())
            data.append({"object": "embedding", "index": i, "embedding": emb})
        metrics.prompt_tokens.inc(n_tokens)
        return JSONResponse({"object": "list", "data": data, "model": model_name,
                             "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})

    return app


class _AuthAndCount:
    """Pure ASGI middleware (streaming and disconnects pass through untouched): checks the API key
    on ``/v1/*`` and counts every response by endpoint and status."""

    def __init__(self, app: Any, state: AppState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        endpoint = _endpoint(path)
        key = self.state.api_key
        if key is not None and path.startswith("/v1/"):
            auth = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
            if auth != f"Bearer {key}":
                e = APIError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                             code="invalid_api_key")
                self.state.metrics.request_done(endpoint, 401)
                await JSONResponse(e.body(), status_code=401, headers={"WWW-Authenticate": "Bearer"})(
                    scope, receive, send)
                return
        status = [500]

        async def send_status(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            if endpoint != "/metrics":
                self.state.metrics.request_done(endpoint, status[0])


def _endpoint(path: str) -> str:
    known = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/health", "/metrics")
    for k in known:
        if path == k or path.startswith(k + "/"):
            return k
    return "other"


async def _json(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None


def _need_generator(state: AppState, path: str) -> GenerationEngine:
    if state.generator is None:
        raise APIError(400, f"the model '{state.model_name}' is an embeddings model; {path} is not available "
                       "(use /v1/embeddings)", param="model", code="model_not_supported")
    return state.generator


# ---------------------------------------------------------------------------- jobs
@dataclass
class _Choice:
    index: int
    ctx: Any
    prompt_index: int
    text: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    finish_reason: Optional[str] = None
    error: Optional[str] = None
    completion_tokens: int = 0
    done: bool = False


@dataclass
class _Job:
    id: str
    created: int
    choices: list[_Choice]
    queue: "asyncio.Queue[tuple[int, StepOutput]]"
    request: Request
    scheduler: Any
    prompt_tokens: int = 0
    t0: float = field(default_factory=time.perf_counter)

    def cancel_unfinished(self) -> None:
        for c in self.choices:
            if not c.done:
                self.scheduler.cancel(c.ctx.request_id)
                c.done = True
                c.finish_reason = "cancelled"

    async def next(self) -> tuple[int, StepOutput]:
        """The next output of any choice; cancels everything when the client has gone away."""
        while True:
            try:
                return await asyncio.wait_for(self.queue.get(), _DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await self.request.is_disconnected():
                    self.cancel_unfinished()
                    raise _ClientGone() from None

    @property
    def all_done(self) -> bool:
        return all(c.done for c in self.choices)

    def usage(self) -> dict[str, int]:
        comp = sum(c.completion_tokens for c in self.choices)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": comp,
                "total_tokens": self.prompt_tokens + comp}


class _ClientGone(Exception):
    pass


_PARAM_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}


def _sampling_params(req: Any, max_new: Optional[int], seed: Optional[int]) -> SamplingParams:
    kw: dict[str, Any] = {}
    for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty", "stop_token_ids"):
        v = getattr(req, name, None)
        if v is not None:
            kw[name] = v
    if req.stop_list:
        kw["stop"] = req.stop_list
    kw["min_new_tokens"] = req.min_tokens
    kw["ignore_eos"] = req.ignore_eos
    if max_new is not None:
        kw["max_new_tokens"] = max_new
    if seed is not None:
        kw["seed"] = seed
    try:
        return SamplingParams(**kw)
    except (ValueError, TypeError) as e:
        m = re.match(r"SamplingParams: (\w+)", str(e))
        param = _PARAM_NAMES.get(m.group(1), m.group(1)) if m else None
        raise APIError(400, str(e).replace("SamplingParams: ", ""), param=param, code="invalid_value") from None


def _new_context(tokenizer: Any, treq: TextGenerationRequest) -> Any:
    return asyncio.run(tokenizer.new_context(treq))


async def _start(state: AppState, gen: GenerationEngine, request: Request, rid: str, inputs: list[dict],
                 req: Any, max_new: Optional[int], *, logprobs: int, echo: bool, chat_extra: dict,
                 explicit_max: bool = True) -> _Job:
    """Tokenise every (input, choice) pair, check lengths, and submit them to the scheduler."""
    loop = asyncio.get_running_loop()
    tok = gen.tokenizer
    max_len = gen.max_length
    is_chat = "messages" in inputs[0]
    job = _Job(rid, int(time.time()), [], asyncio.Queue(), request, gen.scheduler)
    for p_i, inp in enumerate(inputs):
        for j in range(req.n):
            seed = None if req.seed is None else req.seed + j
            params = _sampling_params(req, max_new, seed)
            try:
                treq = TextGenerationRequest(request_id=f"{rid}-{p_i}-{j}", model_name=state.model_name,
                                             sampling_params=params, logprobs=logprobs, echo=echo,
                                             **inp, **{k: v for k, v in chat_extra.items() if v is not None})
                ctx = await loop.run_in_executor(None, _new_context, tok, treq)
            except (ValueError, TypeError) as e:
                msg = str(e).replace("TextGenerationRequest: ", "")
                param = "messages" if is_chat else "prompt"
                code = "context_length_exceeded" if "maximum length" in msg else "invalid_value"
                if "leaves no room" in msg or "more than the maximum length" in msg:
                    code = "context_length_exceeded"
                raise APIError(400, msg, param=param, code=code) from None
            n_prompt = int(ctx.prompt_len)
            if max_new is not None and explicit_max and max_len is not None and n_prompt + max_new > max_len:
                raise APIError(400, f"max_tokens ({max_new}) plus the prompt ({n_prompt} tokens) exceeds the "
                               f"model's context length ({max_len} tokens); request at most {max_len - n_prompt} "
                               "new tokens", param="max_completion_tokens" if getattr(
                                   req, "max_completion_tokens", None) is not None else "max_tokens",
                               code="context_length_exceeded")
            if j == 0:
                job.prompt_tokens += n_prompt
            job.choices.append(_Choice(len(job.choices), ctx, p_i))

    def make_cb(i: int) -> Any:
        def cb(out: StepOutput) -> None:
            try:
                loop.call_soon_threadsafe(job.queue.put_nowait, (i, out))
            except RuntimeError:  # the loop is closed (server shutting down)
                pass

        return cb

    stop = req.stop_list
    submitted: list[_Choice] = []
    try:
        for c in job.choices:
            gen.scheduler.submit(c.ctx, make_cb(c.index), stop=stop)
            submitted.append(c)
    except QueueFull as e:
        for c in submitted:
            gen.scheduler.cancel(c.ctx.request_id)
        raise APIError(503, f"the server is overloaded: {e}; retry later", code="queue_full",
                       headers={"Retry-After": str(RETRY_AFTER_SECONDS)}) from None
    state.metrics.prompt_tokens.inc(job.prompt_tokens)
    return job


def _apply(job: _Job, i: int, out: StepOutput) -> _Choice:
    c = job.choices[i]
    c.tokens.extend(out.tokens)
    if out.text:
        c.text.append(out.text)
    if out.log_probabilities:
        c.logprobs.extend(out.log_probabilities)
    c.completion_tokens = out.completion_tokens
    if out.done:
        c.done = True
        c.finish_reason = out.finish_reason
        c.error = out.error
    return c


def _finish(state: AppState, job: _Job) -> None:
    state.metrics.e2e.observe(time.perf_counter() - job.t0)
    for c in job.choices:
        state.metrics.finished.labels(reason=c.finish_reason or "unknown").inc()


def _raise_errors(job: _Job) -> None:
    errs = [c.error or "generation failed" for c in job.choices if c.finish_reason == "error"]
    if errs:
        raise APIError(500, f"generation failed: {errs[0]}", code="generation_error")


async def _collect(state: AppState, job: _Job) -> None:
    try:
        while not job.all_done:
            i, out = await job.next()
            _apply(job, i, out)
    except asyncio.CancelledError:
        job.cancel_unfinished()
        raise
    except _ClientGone:
        _finish(state, job)
        raise APIError(499, "client closed the request") from None
    _finish(state, job)
    _raise_errors(job)


# ---------------------------------------------------------------------------- log probabilities
class _TokenText:
    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, t: int) -> str:
        s = self.cache.get(t)
        if s is None:
            s = self.tok.decode_sync([t])
            self.cache[t] = s
        return s


def _top_sorted(top: dict, n: int) -> list[tuple[int, float]]:
    return sorted(top.items(), key=lambda kv: -kv[1])[:n]


def _chat_logprobs(entries: list[Any], tokens: list[int], n_top: int, text: _TokenText) -> dict[str, Any]:
    content = []
    for k, lp in enumerate(entries):
        for j, chosen in enumerate(lp.token_log_probabilities):
            idx = len(content)
            tid = tokens[idx] if idx < len(tokens) else None
            top = lp.top_log_probabilities[j]
            if tid is None:
                tid = max(top, key=top.get) if top else 0
            s = text(tid)
            content.append({"token": s, "logprob": float(chosen), "bytes": list(s.encode("utf-8")),
                            "top_logprobs": [{"token": text(t), "logprob": float(v),
                                              "bytes": list(text(t).encode("utf-8"))}
                                             for t, v in _top_sorted(top, n_top)]})
        _ = k
    return {"content": content, "refusal": None}


def _completion_logprobs(entries: list[Any], tokens: list[int], n_top: int, text: _TokenText, offset0: int,
                         prompt_tokens: Optional[list[int]] = None) -> dict[str, Any]:
    toks: list[str] = []
    lps: list[Optional[float]] = []
    tops: list[Optional[dict[str, float]]] = []
    offs: list[int] = []
    pos = offset0
    if prompt_tokens is not None:  # echo: prompt tokens are listed, their log probabilities are not computed
        pos = 0
        for t in prompt_tokens:
            s = text(t)
            toks.append(s)
            lps.append(None)
            tops.append(None)
            offs.append(pos)
            pos += len(s)
    k = 0
    for lp in entries:
        for j, chosen in enumerate(lp.token_log_probabilities):
            tid = tokens[k] if k < len(tokens) else 0
            k += 1
            s = text(tid)
            toks.append(s)
            lps.append(float(chosen))
            tops.append({text(t): float(v) for t, v in _top_sorted(lp.top_log_probabilities[j], n_top)})
            offs.append(pos)
            pos += len(s)
    return {"tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs}


# ---------------------------------------------------------------------------- chat
async def _chat_full(state: AppState, gen: GenerationEngine, job: _Job, req: ChatCompletionRequest, n_top: int
                     ) -> dict[str, Any]:
    await _collect(state, job)
    text = _TokenText(gen.tokenizer)
    choices = []
    for c in job.choices:
        choices.append({"index": c.index, "message": {"role": "assistant", "content": "".join(c.text)},
                        "logprobs": _chat_logprobs(c.logprobs, c.tokens, n_top, text) if req.logprobs else None,
                        "finish_reason": c.finish_reason})
    return {"id": job.id, "object": "chat.completion", "created": job.created, "model": state.model_name,
            "choices": choices, "usage": job.usage(), "system_fingerprint": None}


def _sse(gen: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(gen, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _data(obj: Any) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


async def _stream_outputs(state: AppState, job: _Job) -> AsyncIterator[tuple[_Choice, StepOutput]]:
    """Each output as it arrives; cancels the unfinished requests when the consumer stops early
    (the client disconnected: Starlette cancels the streaming task)."""
    try:
        while not job.all_done:
            i, out = await job.next()
            yield _apply(job, i, out), out
    except _ClientGone:
        return
    finally:
        if not job.all_done:
            job.cancel_unfinished()
        _finish(state, job)


def _error_event(msg: str) -> str:
    return _data(APIError(500, msg, code="generation_error").body())


async def _chat_stream(state: AppState, gen: GenerationEngine, job: _Job, req: ChatCompletionRequest, n_top: int
                       ) -> AsyncIterator[str]:
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    text = _TokenText(gen.tokenizer)
    base = {"id": job.id, "object": "chat.completion.chunk", "created": job.created, "model": state.model_name,
            "system_fingerprint": None}

    def chunk(choices: list[dict]) -> str:
        d = dict(base, choices=choices)
        if include_usage:
            d["usage"] = None
        return _data(d)

    for c in job.choices:
        yield chunk([{"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None}])
    async for c, out in _stream_outputs(state, job):
        if out.finish_reason == "error":
            yield _error_event(out.error or "generation failed")
            continue
        lp = None
        if req.logprobs and out.log_probabilities:
            lp = _chat_logprobs(out.log_probabilities, out.tokens, n_top, text)
        if out.text or lp is not None:
            yield chunk([{"index": c.index, "delta": {"content": out.text}, "logprobs": lp, "finish_reason": None}])
        if out.done:
            yield chunk([{"index": c.index, "delta": {}, "logprobs": None, "finish_reason": c.finish_reason}])
    if include_usage:
        yield _data(dict(base, choices=[], usage=job.usage()))
    yield "data: [DONE]\n\n"


# ---------------------------------------------------------------------------- completions
def _prompt_text(gen: GenerationEngine, c: _Choice) -> str:
    return gen.tokenizer.decode_sync(np.asarray(c.ctx.prompt_tokens), skip_special_tokens=True)


def _prompt_strings(req: CompletionRequest) -> list[Optional[str]]:
    return [p if isinstance(p, str) else None for p in req.prompts()]


async def _completion_full(state: AppState, gen: GenerationEngine, job: _Job, req: CompletionRequest
                           ) -> dict[str, Any]:
    await _collect(state, job)
    text = _TokenText(gen.tokenizer)
    raw = _prompt_strings(req)
    choices = []
    for c in job.choices:
        prefix = ""
        if req.echo:
            prefix = raw[c.prompt_index] if raw[c.prompt_index] is not None else _prompt_text(gen, c)
        lp = None
        if req.logprobs is not None:
            lp = _completion_logprobs(c.logprobs, c.tokens, req.logprobs, text, len(prefix),
                                      [int(t) for t in c.ctx.prompt_tokens] if req.echo else None)
        choices.append({"index": c.index, "text": prefix + "".join(c.text), "logprobs": lp,
                        "finish_reason": c.finish_reason})
    return {"id": job.id, "object": "text_completion", "created": job.created, "model": state.model_name,
            "choices": choices, "usage": job.usage(), "system_fingerprint": None}


async def _completion_stream(state: AppState, gen: GenerationEngine, job: _Job, req: CompletionRequest
                             ) -> AsyncIterator[str]:
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    text = _TokenText(gen.tokenizer)
    raw = _prompt_strings(req)
    base = {"id": job.id, "object": "text_completion", "created": job.created, "model": state.model_name,
            "system_fingerprint": None}
    offsets = {c.index: 0 for c in job.choices}

    def chunk(choice: dict) -> str:
        d = dict(base, choices=[choice])
        if include_usage:
            d["usage"] = None
        return _data(d)

    if req.echo:
        for c in job.choices:
            prefix = raw[c.prompt_index] if raw[c.prompt_index] is not None else _prompt_text(gen, c)
            offsets[c.index] = len(prefix)
            yield chunk({"index": c.index, "text": prefix, "logprobs": None, "finish_reason": None})
    async for c, out in _stream_outputs(state, job):
        if out.finish_reason == "error":
            yield _error_event(out.error or "generation failed")
            continue
        lp = None
        if req.logprobs is not None and out.log_probabilities:
            lp = _completion_logprobs(out.log_probabilities, out.tokens, req.logprobs, text, offsets[c.index])
        offsets[c.index] += len(out.text)
        if out.text or lp is not None or out.done:
            yield chunk({"index": c.index, "text": out.text, "logprobs": lp,
                         "finish_reason": c.finish_reason if out.done else None})
    if include_usage:
        yield _data(dict(base, choices=[], usage=job.usage()))
    yield "data: [DONE]\n\n"


_ = dataclasses
