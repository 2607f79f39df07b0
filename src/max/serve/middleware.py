"""ASGI middleware of ``max serve``: the API key check on ``/v1/*`` and per-endpoint response counts."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from max.serve.openai_schemas import APIError

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/health", "/metrics")


class AuthAndCount:
    """Pure ASGI middleware (streaming and disconnects pass through untouched): checks the API key
    on ``/v1/*`` and counts every response by endpoint and status."""

    def __init__(self, app: Any, state: Any) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        endpoint = endpoint_of(path)
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


def endpoint_of(path: str) -> str:
    """The metrics label of a request path (one of :data:`ENDPOINTS`, else ``"other"``)."""
    for k in ENDPOINTS:
        if path == k or path.startswith(k + "/"):
            return k
    return "other"
