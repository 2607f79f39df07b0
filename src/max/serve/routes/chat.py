"""``POST /v1/chat/completions`` (non-streaming and SSE)."""

from __future__ import annotations

import uuid
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from max.serve.engines import GenerationEngine
from max.serve.jobs import Job, collect, error_event, sse, sse_data, start_job, stream_outputs
from max.serve.logprobs import TokenText, chat_logprobs
from max.serve.openai_schemas import APIError, ChatCompletionRequest
from max.serve.state import AppState, parse_body

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    state, req = await parse_body(request, ChatCompletionRequest)
    gen = state.need_generator("/v1/chat/completions")
    if req.top_logprobs is not None and req.top_logprobs > 0 and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
    n_top = (req.top_logprobs or 0) if req.logprobs else 0
    messages = [m.model_dump(exclude_none=True) for m in req.messages]
    for m in messages:
        if m["role"] == "developer":
            m["role"] = "system"
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    job = await start_job(state, gen, request, rid, [dict(messages=messages)], req, req.max_new_tokens,
                          logprobs=(max(1, n_top) if req.logprobs else 0), echo=False,
                          chat_extra=dict(tools=req.tools, chat_template_options=req.chat_template_kwargs))
    if req.stream:
        return sse(_chat_stream(state, gen, job, req, n_top))
    return JSONResponse(await _chat_full(state, gen, job, req, n_top))


async def _chat_full(state: AppState, gen: GenerationEngine, job: Job, req: ChatCompletionRequest, n_top: int
                     ) -> dict[str, Any]:
    await collect(state, job)
    text = TokenText(gen.tokenizer)
    choices = []
    for c in job.choices:
        choices.append({"index": c.index, "message": {"role": "assistant", "content": "".join(c.text)},
                        "logprobs": chat_logprobs(c.logprobs, c.tokens, n_top, text) if req.logprobs else None,
                        "finish_reason": c.finish_reason})
    return {"id": job.id, "object": "chat.completion", "created": job.created, "model": state.model_name,
            "choices": choices, "usage": job.usage(), "system_fingerprint": None}


async def _chat_stream(state: AppState, gen: GenerationEngine, job: Job, req: ChatCompletionRequest, n_top: int
                       ) -> AsyncIterator[str]:
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    text = TokenText(gen.tokenizer)
    base = {"id": job.id, "object": "chat.completion.chunk", "created": job.created, "model": state.model_name,
            "system_fingerprint": None}

    def chunk(choices: list[dict]) -> str:
        d = dict(base, choices=choices)
        if include_usage:
            d["usage"] = None
        return sse_data(d)

    for c in job.choices:
        yield chunk([{"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None}])
    async for c, out in stream_outputs(state, job):
        if out.finish_reason == "error":
            yield error_event(out.error or "generation failed")
            continue
        lp = None
        if req.logprobs and out.log_probabilities:
            lp = chat_logprobs(out.log_probabilities, out.tokens, n_top, text)
        if out.text or lp is not None:
            yield chunk([{"index": c.index, "delta": {"content": out.text}, "logprobs": lp, "finish_reason": None}])
        if out.done:
            yield chunk([{"index": c.index, "delta": {}, "logprobs": None, "finish_reason": c.finish_reason}])
    if include_usage:
        yield sse_data(dict(base, choices=[], usage=job.usage()))
    yield "data: [DONE]\n\n"
