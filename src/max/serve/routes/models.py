"""``GET /v1/models`` (every model the server serves, and their LoRA adapters) and ``GET /v1/models/{id}``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from max.pipelines.lib.tokenizer import TextAndVisionTokenizer
from max.serve.state import AppState, serve_state

router = APIRouter()


def model_card(state: AppState) -> dict[str, Any]:
    """The served model's card; ``capabilities.vision``: whether chat messages may carry images (the chat
    page shows its image button only then)."""
    eng = state.generator or state.embedder or state.transcriber
    vision = state.generator is not None and isinstance(state.generator.tokenizer, TextAndVisionTokenizer)
    return {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "libremax",
            "max_model_len": getattr(eng, "max_length", None), "capabilities": {"vision": vision}}


def adapter_cards(state: AppState) -> list[dict[str, Any]]:
    lora = state.generator.lora if state.generator is not None else None
    if lora is None:
        return []
    return [{"id": name, "object": "model", "created": state.created, "owned_by": "libremax",
             "parent": state.model_name, "root": lora.adapters[name].path} for name in sorted(lora.slots)]


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    cards = [c for st in serve_state(request).all_states() for c in (model_card(st), *adapter_cards(st))]
    return JSONResponse({"object": "list", "data": cards})


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> JSONResponse:
    state = serve_state(request).for_model(model_id)
    for card in adapter_cards(state):
        if card["id"] == model_id:
            return JSONResponse(card)
    return JSONResponse(model_card(state))
