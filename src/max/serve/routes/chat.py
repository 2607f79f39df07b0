"""``POST /v1/chat/completions`` (non-streaming and SSE; tools and ``tool_choice``, see :mod:`max.serve.tools`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from max.serve.engines import GenerationEngine
from max.serve.jobs import Choice, Job, collect, error_event, sse, sse_data, start_job, stream_outputs
from max.serve.logprobs import TokenText, chat_logprobs, split_prompt_entries, vllm_prompt_logprobs
from max.serve.openai_schemas import APIError, ChatCompletionRequest
from max.serve.reasoning import ReasoningStream, split_reasoning
from max.serve.state import AppState, parse_body
from max.serve.tools import (
    ToolCall,
    ToolParser,
    ToolStream,
    calls_from_constrained,
    check_tools,
    detect_parser,
    make_parser,
    messages_for_template,
    tool_constraint,
)

router = APIRouter()


@dataclass
class ToolPlan:
    """How a request's tools are handled: ``mode`` (none/auto/required/named), the named function,
    and the parser of ``auto`` answers (None when the model's template implies none)."""

    mode: str
    name: Optional[str]
    parser: Optional[ToolParser]
    special_tokens: tuple[str, ...] = ()

    @property
    def constrained(self) -> bool:
        return self.mode in ("required", "named")

    @property
    def parses(self) -> bool:
        return self.mode == "auto" and self.parser is not None


def _tool_plan(state: AppState, gen: GenerationEngine, req: ChatCompletionRequest) -> ToolPlan:
    mode, name = check_tools(req.tools, req.tool_choice)
    parser = None
    specials: tuple[str, ...] = ()
    if mode == "auto":
        delegate = getattr(gen.tokenizer, "delegate", None)
        pname = state.tool_parser or detect_parser(getattr(delegate, "chat_template", None))
        parser = make_parser(pname) if pname else None
        specials = tuple(getattr(delegate, "all_special_tokens", ()) or ())
    return ToolPlan(mode, name, parser, specials)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    state, req = await parse_body(request, ChatCompletionRequest)
    gen = state.need_generator("/v1/chat/completions")
    if req.top_logprobs is not None and req.top_logprobs > 0 and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
    plan = _tool_plan(state, gen, req)
    constraint = None
    if plan.constrained:
        own, field = req.constraint()
        if own is not None:
            raise APIError(400, f"tool_choice {plan.mode!r} constrains the output already; drop {field}",
                           param=field)
        constraint = (tool_constraint(req.tools, plan.mode, plan.name), "tool_choice")
    n_top = (req.top_logprobs or 0) if req.logprobs else 0
    messages = [m.model_dump(exclude_none=True) for m in req.messages]
    for m in messages:
        if m["role"] == "developer":
            m["role"] = "system"
    if req.tools:
        messages = messages_for_template(messages)
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    job = await start_job(state, gen, request, rid, [dict(messages=messages)], req, req.max_new_tokens,
                          logprobs=(max(1, n_top) if req.logprobs else 0), echo=False,
                          chat_extra=dict(tools=req.tools, chat_template_options=req.chat_template_kwargs),
                          constraint=constraint, raw_text=plan.parses)
    if req.stream:
        return sse(_chat_stream(state, gen, job, req, n_top, plan))
    return JSONResponse(await _chat_full(state, gen, job, req, n_top, plan))


def _reasoning_of(state: AppState, req: ChatCompletionRequest, plan: ToolPlan) -> Optional[tuple[str, bool]]:
    """``(reasoning parser, constrained output)`` when the answer's ``<think>`` part is split off
    (``--reasoning-parser``; never for a tool call forced by ``tool_choice``), else None."""
    if state.reasoning_parser is None or plan.constrained:
        return None
    return state.reasoning_parser, req.constraint()[0] is not None


def _message(c: Choice, plan: ToolPlan, reasoning: Optional[tuple[str, bool]] = None
             ) -> tuple[dict[str, Any], Optional[str]]:
    """The assistant message of a finished choice and its finish reason (with ``reasoning_content``
    when a reasoning parser is on)."""
    text = "".join(c.text)
    think = None
    if reasoning is not None:
        think, rest = split_reasoning(reasoning[0], text, reasoning[1])
        text = rest or ""
    calls: list[ToolCall] = []
    content: Optional[str] = text
    if plan.constrained and c.finish_reason == "stop":
        calls, content = calls_from_constrained(text, plan.mode, plan.name), None
    elif plan.parses:
        stream = ToolStream(plan.parser, plan.special_tokens)
        content, calls = stream.feed(text)
        tail, more = stream.finish()
        content, calls = content + tail, calls + more
        if calls and not content.strip():
            content = None
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        msg["content"] = content or None
        msg["reasoning_content"] = think
    reason = c.finish_reason
    if calls:
        msg["tool_calls"] = [t.openai() for t in calls]
        if reason == "stop":
            reason = "tool_calls"
    return msg, reason


async def _chat_full(state: AppState, gen: GenerationEngine, job: Job, req: ChatCompletionRequest, n_top: int,
                     plan: ToolPlan) -> dict[str, Any]:
    await collect(state, job)
    text = TokenText(gen.tokenizer)
    choices = []
    prompt_lp = None
    reasoning = _reasoning_of(state, req, plan)
    for c in job.choices:
        msg, reason = _message(c, plan, reasoning)
        entries = c.logprobs
        if c.ctx.log_probabilities_echo:  # prompt_logprobs: the first entry starts with the prompt's
            prompt_ids = [int(t) for t in c.ctx.prompt_tokens]
            prompt_entry, entries = split_prompt_entries(c.logprobs, len(prompt_ids))
            if prompt_lp is None:
                prompt_lp = vllm_prompt_logprobs(prompt_ids, prompt_entry, req.prompt_logprobs or 0, text)
        choices.append({"index": c.index, "message": msg,
                        "logprobs": chat_logprobs(entries, c.tokens, n_top, text) if req.logprobs else None,
                        "finish_reason": reason})
    body = {"id": job.id, "object": "chat.completion", "created": job.created, "model": state.model_name,
            "choices": choices, "usage": job.usage(), "system_fingerprint": None}
    if req.prompt_logprobs is not None:
        body["prompt_logprobs"] = prompt_lp
    return body


async def _chat_stream(state: AppState, gen: GenerationEngine, job: Job, req: ChatCompletionRequest, n_top: int,
                       plan: ToolPlan) -> AsyncIterator[str]:
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    text = TokenText(gen.tokenizer)
    base = {"id": job.id, "object": "chat.completion.chunk", "created": job.created, "model": state.model_name,
            "system_fingerprint": None}
    streams = {c.index: ToolStream(plan.parser, plan.special_tokens) for c in job.choices} if plan.parses else {}
    reasoning = _reasoning_of(state, req, plan)
    thinking = {c.index: ReasoningStream(*reasoning) for c in job.choices} if reasoning is not None else {}
    n_calls = {c.index: 0 for c in job.choices}
    split: set[int] = set()

    def chunk(choices: list[dict]) -> str:
        d = dict(base, choices=choices)
        if include_usage:
            d["usage"] = None
        return sse_data(d)

    def call_chunks(c: Choice, calls: list[ToolCall]) -> list[str]:
        out = []
        for call in calls:
            out.append(chunk([{"index": c.index, "delta": {"tool_calls": [call.openai(n_calls[c.index])]},
                               "logprobs": None, "finish_reason": None}]))
            n_calls[c.index] += 1
        return out

    for c in job.choices:
        yield chunk([{"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None}])
    async for c, out in stream_outputs(state, job):
        if out.finish_reason == "error":
            yield error_event(out.error or "generation failed")
            continue
        entries = out.log_probabilities or []
        if entries and c.ctx.log_probabilities_echo and c.index not in split:  # drop the prompt's part
            _, entries = split_prompt_entries(entries, int(c.ctx.prompt_len))
            split.add(c.index)
        lp = None
        if req.logprobs and entries:
            lp = chat_logprobs(entries, out.tokens, n_top, text)
        delta, calls, think = out.text, [], ""
        if plan.constrained:
            delta = ""  # the whole answer is the call(s): sent when it is complete
        else:
            if c.index in thinking:
                think, delta = thinking[c.index].feed(delta)
                if out.done:
                    more_think, more = thinking[c.index].finish()
                    think, delta = think + more_think, delta + more
            if c.index in streams:
                delta, calls = streams[c.index].feed(delta)
        if think:
            yield chunk([{"index": c.index, "delta": {"reasoning_content": think}, "logprobs": None if delta else lp,
                          "finish_reason": None}])
        if delta or (lp is not None and not think):
            yield chunk([{"index": c.index, "delta": {"content": delta}, "logprobs": lp, "finish_reason": None}])
        for s in call_chunks(c, calls):
            yield s
        if out.done:
            if plan.constrained and c.finish_reason == "stop":
                for s in call_chunks(c, calls_from_constrained("".join(c.text), plan.mode, plan.name)):
                    yield s
            elif plan.constrained:
                yield chunk([{"index": c.index, "delta": {"content": "".join(c.text)}, "logprobs": None,
                              "finish_reason": None}])
            elif c.index in streams:
                tail, more = streams[c.index].finish()
                if tail:
                    yield chunk([{"index": c.index, "delta": {"content": tail}, "logprobs": None,
                                  "finish_reason": None}])
                for s in call_chunks(c, more):
                    yield s
            reason = c.finish_reason
            if n_calls[c.index] and reason == "stop":
                reason = "tool_calls"
            yield chunk([{"index": c.index, "delta": {}, "logprobs": None, "finish_reason": reason}])
    if include_usage:
        yield sse_data(dict(base, choices=[], usage=job.usage()))
    yield "data: [DONE]\n\n"

