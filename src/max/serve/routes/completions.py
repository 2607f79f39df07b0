"""``POST /v1/completions`` (non-streaming and SSE; ``echo``, ``logprobs``)."""

from __future__ import annotations

import uuid
from typing import Any, AsyncIterator, Optional

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from max.serve.engines import GenerationEngine
from max.serve.fim import fim_token_texts, vocab_of
from max.serve.jobs import Choice, Job, collect, error_event, sse, sse_data, start_job, stream_outputs
from max.serve.logprobs import TokenText, completion_logprobs, split_prompt_entries, vllm_prompt_logprobs
from max.serve.openai_schemas import APIError, CompletionRequest
from max.serve.state import AppState, parse_body

router = APIRouter()


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    state, req = await parse_body(request, CompletionRequest)
    gen = state.need_generator("/v1/completions")
    prompts = req.prompts()
    if req.suffix:
        prompts = [_fim_prompt(gen, p, req.suffix) for p in prompts]
    if req.best_of is not None:
        if req.best_of < req.n:
            raise APIError(400, f"best_of ({req.best_of}) must be >= n ({req.n})", param="best_of")
        if req.stream and req.best_of > req.n:
            raise APIError(400, "best_of > n cannot be streamed (the best candidates are known at the end)",
                           param="best_of")
    ranked = (req.best_of or req.n) > req.n
    rid = f"cmpl-{uuid.uuid4().hex}"
    want_lp = max(1, req.logprobs) if req.logprobs is not None else (1 if ranked else 0)
    job = await start_job(state, gen, request, rid, [dict(prompt=p) for p in prompts], req, req.max_new_tokens,
                          logprobs=want_lp, echo=req.echo, chat_extra={}, explicit_max=req.max_tokens is not None)
    if req.stream:
        return sse(_completion_stream(state, gen, job, req))
    return JSONResponse(await _completion_full(state, gen, job, req))


def _fim_prompt(gen: GenerationEngine, prompt: Any, suffix: str) -> str:
    """Fill-in-the-middle: ``prefix-suffix-middle`` with the model's FIM tokens (:mod:`max.serve.fim`); 400
    when it has none."""
    texts = fim_token_texts(vocab_of(gen.tokenizer))
    if texts is not None:
        pre, suf, mid = texts
        if not isinstance(prompt, str):
            raise APIError(400, "suffix needs a text prompt", param="prompt")
        return f"{pre}{prompt}{suf}{suffix}{mid}"
    raise APIError(400, "suffix (fill-in-the-middle) is not supported by this model: its vocabulary has no "
                   "FIM tokens (<fim_prefix>/<fim_suffix>/<fim_middle> or the like)", param="suffix",
                   code="unsupported_parameter")


def _best(job: Job, n: int) -> list[Choice]:
    """best_of: per prompt, the ``n`` candidates with the highest total log probability, re-indexed."""
    by_prompt: dict[int, list[Choice]] = {}
    for c in job.choices:
        by_prompt.setdefault(c.prompt_index, []).append(c)
    out: list[Choice] = []
    for p in sorted(by_prompt):
        cands = sorted(by_prompt[p], key=lambda c: -sum(v for e in c.logprobs for v in e.token_log_probabilities))
        for c in cands[:n]:
            out.append(c)
    return out


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
    picked = _best(job, req.n) if (req.best_of or req.n) > req.n else job.choices
    for index, c in enumerate(picked):
        c.index = index
        prefix = ""
        if req.echo:
            prefix = raw[c.prompt_index] if raw[c.prompt_index] is not None else _prompt_text(gen, c)
        prompt_ids = [int(t) for t in c.ctx.prompt_tokens]
        entries, prompt_entry = c.logprobs, None
        if c.ctx.log_probabilities_echo:
            prompt_entry, entries = split_prompt_entries(c.logprobs, len(prompt_ids))
        lp = None
        if req.logprobs is not None:
            lp = completion_logprobs(entries, c.tokens, req.logprobs, text, len(prefix),
                                     prompt_ids if req.echo else None, prompt_entry)
        choice = {"index": c.index, "text": prefix + "".join(c.text), "logprobs": lp,
                  "finish_reason": c.finish_reason}
        if req.prompt_logprobs is not None:
            choice["prompt_logprobs"] = vllm_prompt_logprobs(prompt_ids, prompt_entry, req.prompt_logprobs, text)
        choices.append(choice)
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
    split = {c.index: not c.ctx.log_probabilities_echo for c in job.choices}  # echo: first entry has the prompt
    async for c, out in stream_outputs(state, job):
        if out.finish_reason == "error":
            yield error_event(out.error or "generation failed")
            continue
        entries = out.log_probabilities or []
        if entries and not split[c.index]:
            prompt_ids = [int(t) for t in c.ctx.prompt_tokens]
            prompt_entry, entries = split_prompt_entries(entries, len(prompt_ids))
            split[c.index] = True
            extra = {}
            if req.logprobs is not None and req.echo:
                extra["logprobs"] = completion_logprobs([], [], req.logprobs, text, 0, prompt_ids, prompt_entry)
            if req.prompt_logprobs is not None:
                extra["prompt_logprobs"] = vllm_prompt_logprobs(prompt_ids, prompt_entry, req.prompt_logprobs,
                                                                text)
            if extra:
                yield chunk({"index": c.index, "text": "", **{"logprobs": None, **extra}, "finish_reason": None})
        lp = None
        if req.logprobs is not None and entries:
            lp = completion_logprobs(entries, out.tokens, req.logprobs, text, offsets[c.index])
        offsets[c.index] += len(out.text)
        if out.text or lp is not None or out.done:
            yield chunk({"index": c.index, "text": out.text, "logprobs": lp,
                         "finish_reason": c.finish_reason if out.done else None})
    if include_usage:
        yield sse_data(dict(base, choices=[], usage=job.usage()))
    yield "data: [DONE]\n\n"
