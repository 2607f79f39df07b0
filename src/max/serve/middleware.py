"""ASGI middleware of ``max serve``: the API key check on ``/v1/*`` and llama-server's root routes, the request
body limit (413), no new work while shutting down (503), the count of requests in flight and per-endpoint
response counts.  Its errors take Anthropic's shape on ``/v1/messages``, OpenAI's elsewhere."""

from __future__ import annotations

from typing import Any

from max.serve.invalid import shaped
from max.serve.openai_schemas import APIError

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/health", "/metrics")
ENDPOINTS += ("/v1/tokenize", "/v1/detokenize", "/v1/responses", "/v1/rerank", "/v1/score", "/v1/audio")
ENDPOINTS += ("/v1/messages", "/infill", "/apply-template")

V1_AT_ROOT = ("/tokenize", "/detokenize")
"""Routes also served outside ``/v1`` (where vLLM has them): checked and bounded like ``/v1/*``."""


ROOT_API = ("/infill", "/apply-template")
"""llama-server's routes, served at the root: checked and bounded like ``/v1/*``."""


def _is_api(path: str) -> bool:
    return path.startswith("/v1/") or path in ROOT_API


def _key_ok(headers: dict, key: str) -> bool:
    """``Authorization: Bearer KEY`` (OpenAI's clients) or ``x-api-key: KEY`` (Anthropic's)."""
    auth = headers.get(b"authorization", b"").decode("latin-1")
    return auth == f"Bearer {key}" or headers.get(b"x-api-key", b"").decode("latin-1") == key


def _api_path(path: str) -> str:
    """``path``, with a root alias of a ``/v1`` route (:data:`V1_AT_ROOT`) mapped to its ``/v1`` form."""
    return "/v1" + path if path in V1_AT_ROOT else path


class AuthAndCount:
    """Pure ASGI middleware (streaming and disconnects pass through untouched): checks the API key
    on ``/v1/*``, bounds ``POST /v1/*`` bodies to ``state.max_request_bytes`` (413 before the body is
    parsed), answers 503 to new ``POST /v1/*`` work while the server drains, tracks the requests in
    flight (``state.lifecycle.in_flight``) and counts every response by endpoint and status."""

    def __init__(self, app: Any, state: Any) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = _api_path(scope.get("path", ""))
        endpoint = endpoint_of(path)
        key = self.state.api_key
        if key is not None and _is_api(path):
            if not _key_ok(dict(scope.get("headers") or []), key):
                e = APIError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>' (or "
                             "'x-api-key: <key>')", code="invalid_api_key")
                self.state.metrics.request_done(endpoint, 401)
                e.headers = {"WWW-Authenticate": "Bearer"}
                await shaped(path, e)(scope, receive, send)
                return
        work = _is_api(path) and scope.get("method") == "POST"
        if work:
            early = None
            if self.state.lifecycle.draining:
                retry = "retry on another replica" if self.state.replicated else "retry when it is back up"
                early = APIError(503, f"the server is shutting down and accepts no new requests; {retry}",
                                 code="server_shutting_down", headers={"Retry-After": "5", "Connection": "close"})
            else:
                receive, early = await _bounded_body(scope, receive, self.state.max_request_bytes)
            if early is not None:
                if early.status:  # status 0: the client went away while sending
                    self.state.metrics.request_done(endpoint, early.status)
                    await shaped(path, early)(scope, receive, send)
                return
        status = [500]

        async def send_status(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        lifecycle = self.state.lifecycle
        if work:
            lifecycle.in_flight += 1
        try:
            await self.app(scope, receive, send_status)
        finally:
            if work:
                lifecycle.in_flight -= 1
            if endpoint != "/metrics":
                self.state.metrics.request_done(endpoint, status[0])


DRAIN_LIMIT = 64 << 20
"""How much of an oversized body is read (and dropped) before the 413, so the client, still sending,
gets the answer instead of a reset connection; beyond it the connection is closed."""


async def _bounded_body(scope: Any, receive: Any, limit: Any) -> tuple[Any, Any]:
    """``(receive, None)`` replaying the whole body once it is known to be within ``limit`` bytes, or
    ``(receive, APIError 413)`` for a bigger one (known from ``Content-Length`` or while reading; the
    rest of it is read and dropped, never kept or parsed); ``APIError`` with status 0 when the client
    disconnected meanwhile."""
    if not limit:
        return receive, None
    declared = dict(scope.get("headers") or []).get(b"content-length")
    n_declared = int(declared) if declared is not None and declared.isdigit() else None
    over = n_declared is not None and n_declared > limit
    chunks: list[bytes] = []
    size = 0
    more = not (over and n_declared > DRAIN_LIMIT)  # far too big: do not even read it
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return receive, APIError(0, "client disconnected")
        body = message.get("body", b"")
        size += len(body)
        over = over or size > limit
        if not over:
            chunks.append(body)
        more = message.get("more_body", False)
        if over and size > DRAIN_LIMIT:
            break
    if over:
        got = f"has {n_declared} bytes, more than" if n_declared is not None else "is larger than"
        return receive, APIError(413, f"the request body {got} this server's limit of {limit} bytes (max serve "
                                 "--max-request-bytes)", code="request_too_large",
                                 headers={"Connection": "close"} if more else None)
    pending = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

    async def replay() -> Any:
        if pending:
            return pending.pop()
        return await receive()

    return replay, None


def endpoint_of(path: str) -> str:
    """The metrics label of a request path (one of :data:`ENDPOINTS`, else ``"other"``); a root alias
    (``/tokenize``) counts as its ``/v1`` route."""
    path = _api_path(path)
    for k in ENDPOINTS:
        if path == k or path.startswith(k + "/"):
            return k
    return "other"
