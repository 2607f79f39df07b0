"""``GET /v1/models`` and ``GET /v1/models/{id}``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from max.serve.state import AppState, serve_state

router = APIRouter()


def model_card(state: AppState) -> dict[str, Any]:
    eng = state.generator or state.embedder
    return {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "libremax",
            "max_model_len": getattr(eng, "max_length", None)}


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [model_card(serve_state(request))]})


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> JSONResponse:
    state = serve_state(request)
    state.check_model(model_id)
    return JSONResponse(model_card(state))
