"""The OpenAI-compatible HTTP app of ``max serve`` (FastAPI).

Routes, one module per family in :mod:`max.serve.routes`: ``POST /v1/chat/completions``
(``chat``), ``POST /v1/completions`` (``completions``), ``POST /v1/embeddings``
(``embeddings``), ``POST /v1/audio/transcriptions`` + ``/v1/audio/translations`` (``audio``),
``GET /v1/models`` + ``/v1/models/{id}`` (``models``), ``GET /health`` and
``GET /metrics`` (``health``), Anthropic's ``POST /v1/messages`` (``anthropic``), llama-server's
``POST /infill`` (``infill``) and ``POST /apply-template`` (``tokenize``).  A server with several models
routes each request to the one its ``model`` names (:meth:`AppState.for_model`).  Model work never runs on
the event loop: generation requests go to the shared scheduler (:mod:`max.serve.jobs`), embeddings to one worker thread.
"""

from __future__ import annotations

import logging
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Optional, Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from max.interfaces.errors import InvalidRequest
from max.serve.engines import EmbeddingsEngine, GenerationEngine, TranscriptionEngine
from max.serve.invalid import answer
from max.serve.metrics import ServeMetrics
from max.serve.middleware import AuthAndCount
from max.serve.openai_schemas import APIError
from max.serve.routes import ROUTERS
from max.serve.state import AppState

logger = logging.getLogger("max.serve")

__all__ = ["AppState", "EmbeddingsEngine", "GenerationEngine", "create_app"]


def create_app(model_name: str, *, generator: Optional[GenerationEngine] = None,
               embedder: Optional[EmbeddingsEngine] = None, api_key: Optional[str] = None,
               metrics: Optional[ServeMetrics] = None, aliases: Any = (), tool_parser: Optional[str] = None,
               reasoning_parser: Optional[str] = None, allowed_origins: Optional[Sequence[str]] = None,
               transcriber: Optional[TranscriptionEngine] = None, speaker: Any = None) -> FastAPI:
    """The FastAPI app serving ``generator`` (chat / completions) or ``embedder`` (embeddings).

    The app starts the engines on startup (the generator's scheduler thread) and stops them on
    shutdown; its state is ``app.state.serve`` (:class:`AppState`).  ``tool_parser`` names the
    tool-call parser (``hermes``, ``llama3_json``, ``mistral``; None: chosen from the chat template).
    ``reasoning_parser`` (``deepseek_r1``, ``qwen3``) splits ``<think>`` text into ``reasoning_content``
    (:mod:`max.serve.reasoning`); ``allowed_origins`` (e.g. ``["*"]`` or ``["http://localhost:3000"]``)
    turns on CORS for those browser origins (none by default: browsers then refuse cross-origin calls).
    """
    if generator is None and embedder is None and transcriber is None and speaker is None:
        raise ValueError("create_app: give a generator, an embedder, a transcriber or a speaker")
    metrics = metrics or ServeMetrics()
    if generator is not None:
        metrics.bind(generator.scheduler, generator.kv_manager)
    if tool_parser is not None:
        from max.serve.tools import make_parser

        make_parser(tool_parser)  # ValueError for an unknown name
    from max.serve.reasoning import check_reasoning_parser

    state = AppState(model_name, generator, embedder, api_key, metrics, set(aliases) - {None},
                     tool_parser=tool_parser)
    state.reasoning_parser = check_reasoning_parser(reasoning_parser)
    state.transcriber = transcriber
    state.speaker = speaker  # a SpeechEngine: /v1/audio/speech

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engines = [e for st in state.all_states() for e in st.engines()]  # every model the server serves
        for eng in engines:
            eng.start()
        try:
            yield
        finally:
            for eng in engines:
                eng.stop()

    app = FastAPI(title="libremax max serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.serve = state
    _add_error_handlers(app)
    app.add_middleware(AuthAndCount, state=state)
    if allowed_origins:
        _add_cors(app, allowed_origins)
    for router in ROUTERS:
        app.include_router(router)
    return app


def parse_origins(value: Any) -> list[str]:
    """``--allowed-origins``: a JSON list (vLLM's form, ``'["http://a:1", "http://b"]'``) or a comma
    separated list (``http://a:1,http://b``; ``*`` for any origin); ValueError for anything else."""
    import json

    if value is None:
        return []
    if not isinstance(value, str):
        origins = list(value)
    elif value.strip().startswith("["):
        try:
            origins = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"allowed origins: not a valid JSON list: {e}") from None
    else:
        origins = [o.strip() for o in value.split(",") if o.strip()]
    if not isinstance(origins, list) or not origins or not all(isinstance(o, str) and o for o in origins):
        raise ValueError(f"allowed origins must be a non-empty list of origins such as http://localhost:3000 or *, "
                         f"got {value!r}")
    for o in origins:
        if o != "*" and not (o.startswith("http://") or o.startswith("https://")):
            raise ValueError(f"allowed origin {o!r} must be * or start with http:// or https://")
    return [o.rstrip("/") for o in origins]


def _add_cors(app: FastAPI, allowed_origins: Sequence[str]) -> None:
    """CORS for ``allowed_origins`` (outermost, so a browser's preflight ``OPTIONS`` never meets the API
    key check); credentials (cookies) are never allowed, the API key goes in the Authorization header."""
    from starlette.middleware.cors import CORSMiddleware

    app.add_middleware(CORSMiddleware, allow_origins=parse_origins(list(allowed_origins)), allow_methods=["*"],
                       allow_headers=["*"], allow_credentials=False, expose_headers=["Retry-After"])


def _add_error_handlers(app: FastAPI) -> None:
    """Every error leaves in OpenAI's shape (``{"error": {message, type, param, code}}``)."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    app.add_exception_handler(InvalidRequest, answer)  # raised where a check is made; one mapping to HTTP

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        e = APIError(exc.status_code, str(exc.detail), code="not_found" if exc.status_code == 404 else None)
        return JSONResponse(e.body(), status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        # the client gets a reference, never the exception's text or traceback (paths, internals)
        ref = uuid.uuid4().hex[:12]
        logger.exception("unhandled error on %s (reference %s)", request.url.path, ref)
        e = APIError(500, f"internal server error (reference {ref}; the details are in the server log)",
                     code="internal_error")
        return JSONResponse(e.body(), status_code=500)
