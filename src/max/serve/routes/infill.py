"""``POST /infill``: llama-server's fill-in-the-middle endpoint (editors' code completion).

The body takes llama-server's fields: ``input_prefix`` and ``input_suffix`` (the code before and after
the cursor), ``input_extra`` (``[{"filename", "text"}]``: other files of the project, as context),
``prompt`` (text just before the cursor, added to the prefix), ``n_predict`` (or ``max_tokens``; -1 or
absent: until the context is full or the model ends), ``stream``, ``stop``, ``temperature``, ``top_k``,
``top_p``, ``min_p``, ``seed``, ``repeat_penalty``, ``presence_penalty``, ``frequency_penalty``,
``ignore_eos``, ``return_tokens``.  The prompt is built from the model's FIM tokens
(:mod:`max.serve.fim`); a model without them gets a 400.

The answer has llama-server's ``/completion`` shape: ``content``, ``stop``, ``model``, ``prompt`` (the
prompt's text, special tokens included), ``tokens_evaluated``, ``tokens_predicted``, ``tokens_cached``
(prefix-cache hits), ``truncated``, ``stop_type`` (``eos`` / ``word`` / ``limit``) and
``stopping_word``; ``tokens`` with ``return_tokens``.  Streamed, each event is ``data: {"content", "stop":
false, ...}`` and the last one carries ``stop: true`` with the totals.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any, AsyncIterator, Optional, Union

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field

from max.serve.fim import fim_tokens, infill_tokens, vocab_of
from max.serve.jobs import Choice, Job, collect, error_event, sse, start_job, stream_outputs
from max.serve.openai_schemas import APIError, CompletionRequest, _Body, parse
from max.serve.state import AppState, read_json, serve_state

router = APIRouter()


class ExtraChunk(_Body):
    filename: str = "tmp"
    text: str = ""


class InfillRequest(_Body):
    model: Optional[str] = None
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[ExtraChunk] = Field(default_factory=list)
    prompt: str = ""
    n_predict: Optional[int] = Field(default=None, ge=-1)
    max_tokens: Optional[int] = Field(default=None, ge=1)
    stream: bool = False
    stop: Union[str, list[str], None] = None
    temperature: Optional[float] = Field(default=None, ge=0.0)
    top_k: Optional[int] = None
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    seed: Optional[int] = None
    repeat_penalty: Optional[float] = Field(default=None, gt=0.0)
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    ignore_eos: bool = False
    return_tokens: bool = False

    def check(self) -> None:
        if self.n_predict == 0:
            raise APIError(400, "n_predict must be -1 (no limit) or at least 1", param="n_predict",
                           code="invalid_value")


def _completion_request(req: InfillRequest, ids: list[int], max_new: int) -> CompletionRequest:
    body: dict[str, Any] = {"prompt": ids, "max_tokens": max_new, "stop": req.stop, "ignore_eos": req.ignore_eos,
                            "repetition_penalty": req.repeat_penalty}
    for k in ("temperature", "top_k", "top_p", "min_p", "seed", "presence_penalty", "frequency_penalty"):
        body[k] = getattr(req, k)
    if req.seed is not None and req.seed < 0:  # llama-server: -1 is a random seed
        body["seed"] = None
    return parse(CompletionRequest, {k: v for k, v in body.items() if v is not None})


def _build_prompt(state: AppState, req: InfillRequest) -> tuple[list[int], bool, int]:
    """``(prompt ids, truncated, new-token limit)`` (400 when the model has no FIM tokens)."""
    gen = state.need_generator("/infill")
    tok = gen.tokenizer
    fim = fim_tokens(vocab_of(tok))
    if fim is None:
        raise APIError(400, f"the model '{state.model_name}' cannot fill in the middle: its tokenizer has no FIM "
                       "tokens (e.g. <|fim_prefix|> <|fim_suffix|> <|fim_middle|>, or <PRE> <SUF> <MID>)",
                       param="input_prefix", code="model_not_supported")
    delegate = tok.delegate
    bos = delegate.bos_token_id
    if bos is not None and delegate.encode("a", add_special_tokens=True)[:1] != [bos]:
        bos = None  # the tokenizer does not start its prompts with BOS

    def encode(text: str) -> list[int]:
        return list(delegate.encode(text, add_special_tokens=False)) if text else []

    max_len = gen.max_length
    n = req.max_tokens if req.n_predict in (None, -1) else req.n_predict
    budget = None if max_len is None else max_len - (n or 1)
    if budget is not None and budget < 4:
        raise APIError(400, f"n_predict ({n}) leaves no room for the prompt in the model's context ({max_len} tokens)",
                       param="n_predict", code="context_length_exceeded")
    try:
        p = infill_tokens(fim, encode, prefix=req.input_prefix, suffix=req.input_suffix, prompt=req.prompt,
                          extra=[(c.filename, c.text) for c in req.input_extra], bos=bos, budget=budget)
    except ValueError as e:
        raise APIError(400, str(e), param="input_prefix", code="context_length_exceeded") from None
    if n is None:
        n = (max_len - len(p.tokens)) if max_len is not None else 16
    return p.tokens, p.truncated, n


def _stop_type(c: Choice) -> str:
    if c.finish_reason == "length":
        return "limit"
    return "word" if c.stop_sequence is not None else "eos"


def _final(state: AppState, job: Job, c: Choice, req: InfillRequest, prompt_text: str, truncated: bool
           ) -> dict[str, Any]:
    kind = _stop_type(c)
    body = {"index": 0, "content": "".join(c.text), "stop": True, "model": state.model_name, "prompt": prompt_text,
            "tokens_evaluated": job.prompt_tokens, "tokens_predicted": c.completion_tokens,
            "tokens_cached": job.cached_tokens, "truncated": truncated, "stop_type": kind,
            "stopping_word": c.stop_sequence or "", "stopped_eos": kind == "eos", "stopped_word": kind == "word",
            "stopped_limit": kind == "limit"}
    if req.return_tokens:
        body["tokens"] = list(c.tokens)
    return body


@router.post("/infill")
async def infill(request: Request) -> Response:
    req = parse(InfillRequest, await read_json(request))
    state = serve_state(request).for_model(req.model)
    gen = state.need_generator("/infill")
    ids, truncated, max_new = await asyncio.get_running_loop().run_in_executor(None, _build_prompt, state, req)
    creq = _completion_request(req, ids, max_new)
    job = await start_job(state, gen, request, f"infill-{uuid.uuid4().hex}", [dict(prompt=ids)], creq, max_new,
                          logprobs=0, echo=False, chat_extra={}, explicit_max=False)
    prompt_text = gen.tokenizer.decode_sync(ids, skip_special_tokens=False)
    if req.stream:
        return sse(_stream(state, job, req, prompt_text, truncated))
    await collect(state, job)
    return JSONResponse(_final(state, job, job.choices[0], req, prompt_text, truncated))


def _data(obj: Any) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


async def _stream(state: AppState, job: Job, req: InfillRequest, prompt_text: str, truncated: bool
                  ) -> AsyncIterator[str]:
    async for c, out in stream_outputs(state, job):
        if out.finish_reason == "error":
            yield error_event(out.error or "generation failed")
            return
        if out.done:
            if c.finish_reason == "cancelled":
                return
            last = _final(state, job, c, req, prompt_text, truncated)
            last["content"] = out.text
            if req.return_tokens:
                last["tokens"] = list(out.tokens)
            yield _data(last)
        elif out.text or out.tokens:
            chunk: dict[str, Any] = {"index": 0, "content": out.text, "stop": False}
            if req.return_tokens:
                chunk["tokens"] = list(out.tokens)
            yield _data(chunk)

