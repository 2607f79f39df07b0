"""``POST /v1/completions`` (non-streaming and SSE; ``echo``, ``logprobs``)."""

from __future__ import annotations

import uuid
from typing import Any, AsyncIterator, Optional

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from max.serve.engines import GenerationEngine
from max.serve.jobs import Choice, Job, collect, error_event, sse, sse_data, start_job, stream_outputs
from max.serve.logprobs import TokenText, completion_logprobs
from max.serve.openai_schemas import APIError, CompletionRequest
from max.serve.state import AppState, parse_body

router = APIRouter()


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    state, req = await parse_body(request, CompletionRequest)
    gen = state.need_generator("/v1/completions")
    if req.suffix:
        raise APIError(400, "suffix is not supported", param="suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise APIError(400, "best_of is not supported (must equal n)", param="best_of")
    rid = f"cmpl-{uuid.uuid4().hex}"
    prompts = req.prompts()
    job = await start_job(state, gen, request, rid, [dict(prompt=p) for p in prompts], req, req.max_new_tokens,
                          logprobs=(max(1, req.logprobs) if req.logprobs is not None else 0), echo=req.echo,
                          chat_extra={}, explicit_max=req.max_tokens is not None)
    if req.stream:
        return sse(_completion_stream(state, gen, job, req))
    return JSONResponse(await _completion_full(state, gen, job, req))


def _prompt_text(gen: GenerationEngine, c: Choice) -> str:
    return gen.tokenizer.decode_sync(np.asarray(c.ctx.prompt_tokens), skip_special_tokens=True)


def _prompt_strings(req: CompletionRequest) -> list[Optional[str]]:
    return [p if isinstance(p, str) else None for p in req.prompts()]


async def _completion_full(state: AppState, gen: GenerationEngine, job: Job, req: CompletionRequest
                           ) -> dict[str, Any]:
    await collect(state, job)
    text = TokenText(gen.tokenizer)
    raw = _prompt_strings(req)
    choices = []
    for c in job.choices:
        prefix = ""
        if req.echo:
            prefix = raw[c.prompt_index] if raw[c.prompt_index] is not None else _prompt_text(gen, c)
        lp = None
        if req.logprobs is not None:
            lp = completion_logprobs(c.logprobs, c.tokens, req.logprobs, text, len(prefix),
                                     [int(t) for t in c.ctx.prompt_tokens] if req.echo else None)
        choices.append({"index": c.index, "text": prefix + "".join(c.text), "logprobs": lp,
                        "finish_reason": c.finish_reason})
    return {"id": job.id, "object": "text_completion", "created": job.created, "model": state.model_name,
            "choices": choices, "usage": job.usage(), "system_fingerprint": None}


async def _completion_stream(state: AppState, gen: GenerationEngine, job: Job, req: CompletionRequest
                             ) -> AsyncIterator[str]:
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    text = TokenText(gen.tokenizer)
    raw = _prompt_strings(req)
    base = {"id": job.id, "object": "text_completion", "created": job.created, "model": state.model_name,
            "system_fingerprint": None}
    offsets = {c.index: 0 for c in job.choices}

    def chunk(choice: dict) -> str:
        d = dict(base, choices=[choice])
        if include_usage:
            d["usage"] = None
        return sse_data(d)

    if req.echo:
        for c in job.choices:
            prefix = raw[c.prompt_index] if raw[c.prompt_index] is not None else _prompt_text(gen, c)
            offsets[c.index] = len(prefix)
            yield chunk({"index": c.index, "text": prefix, "logprobs": None, "finish_reason": None})
    async for c, out in stream_outputs(state, job):
        if out.finish_reason == "error":
            yield error_event(out.error or "generation failed")
            continue
        lp = None
        if req.logprobs is not None and out.log_probabilities:
            lp = completion_logprobs(out.log_probabilities, out.tokens, req.logprobs, text, offsets[c.index])
        offsets[c.index] += len(out.text)
        if out.text or lp is not None or out.done:
            yield chunk({"index": c.index, "text": out.text, "logprobs": lp,
                         "finish_reason": c.finish_reason if out.done else None})
    if include_usage:
        yield sse_data(dict(base, choices=[], usage=job.usage()))
    yield "data: [DONE]\n\n"
