"""``GET /health`` and ``GET /metrics`` (Prometheus text exposition)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from max.serve.state import serve_state

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    state = serve_state(request)
    if state.lifecycle.draining:  # load balancers stop sending work here
        return JSONResponse({"status": "draining"}, status_code=503)
    ok = all(e.alive for st in state.all_states() for e in (st.generator, st.embedder, st.transcriber)
             if e is not None)
    return JSONResponse({"status": "ok" if ok else "unhealthy"}, status_code=200 if ok else 503)


@router.get("/metrics")
async def prometheus_metrics(request: Request) -> Response:
    body, ctype = serve_state(request).metrics.render()
    return Response(body, media_type=ctype)
