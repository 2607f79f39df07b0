"""LoRA adapters at run time (vLLM's routes): ``POST /v1/load_lora_adapter`` ``{"lora_name", "lora_path"}``
and ``POST /v1/unload_lora_adapter`` ``{"lora_name"}``, as the spec's ``LoRARequest`` operations.
Slots change between scheduler steps; an adapter still used by a waiting or running request is not
unloaded."""

from __future__ import annotations

import asyncio
from typing import Any, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from max.interfaces import LoRAOperation, LoRARequest, LoRAStatus
from max.serve.openai_schemas import APIError, _Body
from max.serve.state import parse_body

router = APIRouter()


class LoadLoRABody(_Body):
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)
    model: Optional[str] = None


class UnloadLoRABody(_Body):
    lora_name: str = Field(min_length=1)
    model: Optional[str] = None


async def _apply(request: Request, body: Any, op: LoRAOperation) -> JSONResponse:
    state, req = await parse_body(request, body)
    gen = state.need_generator(request.url.path)
    lora = gen.lora
    if lora is None:
        raise APIError(400, "this server was started without LoRA support (max serve --enable-lora or "
                       "--lora-paths)", param="lora_name", code="lora_not_enabled")
    if op is LoRAOperation.UNLOAD and any(getattr(c, "model_name", None) == req.lora_name
                                          for c in gen.scheduler.in_flight()):
        raise APIError(400, f"LoRA adapter {req.lora_name!r} is used by requests in flight; unload it when they "
                       "are done", param="lora_name", code="lora_in_use")
    lreq = LoRARequest(op, req.lora_name, getattr(req, "lora_path", None))

    def run() -> Any:
        with gen.scheduler.exclusive():
            return lora.handle(lreq)

    resp = await asyncio.get_running_loop().run_in_executor(None, run)
    if resp.status is not LoRAStatus.SUCCESS:
        param = "lora_path" if resp.status in (LoRAStatus.LOAD_INVALID_PATH,) else "lora_name"
        raise APIError(400, str(resp.message), param=param, code=resp.status.value)
    return JSONResponse({"status": resp.status.value, "message": resp.message})


@router.post("/v1/load_lora_adapter")
async def load_lora_adapter(request: Request) -> JSONResponse:
    return await _apply(request, LoadLoRABody, LoRAOperation.LOAD)


@router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(request: Request) -> JSONResponse:
    return await _apply(request, UnloadLoRABody, LoRAOperation.UNLOAD)
