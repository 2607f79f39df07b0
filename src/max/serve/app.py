"""The OpenAI-compatible HTTP app of ``max serve`` (FastAPI).

Routes, one module per family in :mod:`max.serve.routes`: ``POST /v1/chat/completions``
(``chat``), ``POST /v1/completions`` (``completions``), ``POST /v1/embeddings``
(``embeddings``), ``POST /v1/audio/transcriptions`` + ``/v1/audio/translations`` (``audio``),
``GET /v1/models`` + ``/v1/models/{id}`` (``models``), ``GET /health`` and
``GET /metrics`` (``health``).  Model work never runs on the event loop: generation requests
go to the shared scheduler (:mod:`max.serve.jobs`), embeddings to one worker thread.
"""

from __future__ import annotations

import logging
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from max.serve.engines import EmbeddingsEngine, GenerationEngine, TranscriptionEngine
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
               transcriber: Optional[TranscriptionEngine] = None) -> FastAPI:
    """The FastAPI app serving ``generator`` (chat / completions) or ``embedder`` (embeddings).

    The app starts the engines on startup (the generator's scheduler thread) and stops them on
    shutdown; its state is ``app.state.serve`` (:class:`AppState`).  ``tool_parser`` names the
    tool-call parser (``hermes``, ``llama3_json``, ``mistral``; None: chosen from the chat template).
    """
    if generator is None and embedder is None and transcriber is None:
        raise ValueError("create_app: give a generator, an embedder or a transcriber")
    metrics = metrics or ServeMetrics()
    if generator is not None:
        metrics.bind(generator.scheduler, generator.kv_manager)
    if tool_parser is not None:
        from max.serve.tools import make_parser

        make_parser(tool_parser)  # ValueError for an unknown name
    state = AppState(model_name, generator, embedder, api_key, metrics, set(aliases) - {None},
                     tool_parser=tool_parser)
    state.transcriber = transcriber
    engines = [e for e in (generator, embedder, transcriber) if e is not None]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
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
    for router in ROUTERS:
        app.include_router(router)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error leaves in OpenAI's shape (``{"error": {message, type, param, code}}``)."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

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
