"""``POST /v1/responses`` (OpenAI's Responses API, text), ``GET`` / ``DELETE /v1/responses/{id}``.

A request becomes a chat completion: ``input`` (a string, or input items: messages with roles and
``input_text`` / ``input_image`` / ``output_text`` parts, ``function_call`` and
``function_call_output`` items) is turned into chat messages, after the conversation of
``previous_response_id`` (from the server's bounded store, :mod:`max.serve.response_store`) and
behind ``instructions`` (a system message, never carried over to a continuation, as OpenAI does).
Function ``tools`` (``{"type": "function", "name", "parameters"}``) and ``tool_choice`` go through
the chat tool-call machinery (:mod:`max.serve.tools`); calls come back as ``function_call`` output
items.  ``text.format`` (``json_schema`` / ``json_object``) constrains the output.

Streaming sends OpenAI's event sequence: ``response.created``, ``response.in_progress``, then per
output item ``response.output_item.added``, (``response.content_part.added``,
``response.output_text.delta``..., ``response.output_text.done``, ``response.content_part.done``) or
(``response.function_call_arguments.delta`` / ``.done``), ``response.output_item.done``, and last
``response.completed`` (``response.incomplete`` when ``max_output_tokens`` cut the answer).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, AsyncIterator, Optional, Union

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field

from max.serve.jobs import SHUTDOWN_MESSAGE, Choice, collect, public_error, sse, start_job, stream_outputs
from max.serve.openai_schemas import APIError, ChatCompletionRequest, _Body, parse
from max.serve.response_store import StoredResponse
from max.serve.routes.chat import ToolPlan, _message, _tool_plan
from max.serve.state import AppState, read_json, serve_state
from max.serve.tools import ToolCall, ToolStream, calls_from_constrained, messages_for_template

router = APIRouter()


class ResponsesRequest(_Body):
    model: Optional[str] = None
    input: Union[str, list[dict[str, Any]]]
    instructions: Optional[str] = None
    max_output_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    stream: bool = False
    previous_response_id: Optional[str] = None
    store: bool = True
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    text: Optional[dict[str, Any]] = None
    metadata: Optional[dict[str, str]] = None
    user: Optional[str] = None
    # vLLM-style extensions, passed on to sampling
    top_k: Optional[int] = None
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    seed: Optional[int] = None
    repetition_penalty: Optional[float] = Field(default=None, gt=0.0)
    guided_json: Union[dict[str, Any], str, None] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None
    structured_outputs: Optional[dict[str, Any]] = None


# ----------------------------------------------------------------------------- request translation
_TEXT_PARTS = ("input_text", "output_text", "text")


def _content(content: Any, where: str) -> Union[str, list[dict[str, Any]]]:
    """A message item's content as chat content (a string or OpenAI chat parts)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, f"'{where}' must be a string or a list of content parts", param=where,
                       code="invalid_type")
    parts: list[dict[str, Any]] = []
    for j, p in enumerate(content):
        w = f"{where}[{j}]"
        kind = p.get("type") if isinstance(p, dict) else None
        if kind in _TEXT_PARTS:
            if not isinstance(p.get("text"), str):
                raise APIError(400, f"'{w}.text' must be a string", param=f"{w}.text", code="invalid_type")
            parts.append({"type": "text", "text": p["text"]})
        elif kind == "input_image":
            url = p.get("image_url")
            if not isinstance(url, str) or not url:
                raise APIError(400, f"'{w}.image_url' must be an image URL or a data URL (file_id is not "
                               "supported)", param=f"{w}.image_url", code="invalid_value")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise APIError(400, f"'{w}.type' must be one of input_text, input_image, output_text (got {kind!r})",
                           param=f"{w}.type", code="invalid_value")
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)  # plain text renders through every chat template
    return parts


def input_messages(inp: Union[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The chat messages of a Responses ``input`` (400 naming the item for a malformed one)."""
    if isinstance(inp, str):
        return [{"role": "user", "content": inp}]
    if not inp:
        raise APIError(400, "'input' must not be empty", param="input", code="invalid_value")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(inp):
        w = f"input[{i}]"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise APIError(400, f"'{w}.role' must be user, system, developer or assistant (got {role!r})",
                               param=f"{w}.role", code="invalid_value")
            if "content" not in item:
                raise APIError(400, f"'{w}.content' is a required property", param=f"{w}.content",
                               code="missing_required_parameter")
            out.append({"role": "system" if role == "developer" else role,
                        "content": _content(item["content"], f"{w}.content")})
        elif kind == "function_call":
            for k in ("call_id", "name", "arguments"):
                if not isinstance(item.get(k), str):
                    raise APIError(400, f"'{w}.{k}' must be a string", param=f"{w}.{k}", code="invalid_type")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") is not None:
                out[-1]["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise APIError(400, f"'{w}.call_id' must be a string", param=f"{w}.call_id", code="invalid_type")
            output = item.get("output")
            if not isinstance(output, str):
                output = json.dumps(output)
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        else:
            raise APIError(400, f"'{w}.type' must be message, function_call or function_call_output (got {kind!r})",
                           param=f"{w}.type", code="invalid_value")
    return out


def chat_tools(tools: Optional[list[dict[str, Any]]]) -> Optional[list[dict[str, Any]]]:
    """Responses function tools (flat ``{"type": "function", "name", "parameters"}``) as chat tools."""
    if tools is None:
        return None
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("name"), str):
            kind = t.get("type") if isinstance(t, dict) else None
            raise APIError(400, f"tools[{i}] must be {{'type': 'function', 'name': ..., 'parameters': {{...}}}} "
                           f"(only function tools are served; got type {kind!r})", param=f"tools[{i}]",
                           code="invalid_value")
        fn = {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def response_format(text: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """``text.format`` as a chat ``response_format`` (None for plain text)."""
    fmt = (text or {}).get("format")
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("json_schema", "json_object"):
        raise APIError(400, "'text.format.type' must be text, json_schema or json_object", param="text.format",
                       code="invalid_value")
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    if not isinstance(fmt.get("schema"), dict):
        raise APIError(400, "'text.format.schema' must be a JSON schema object", param="text.format.schema",
                       code="invalid_value")
    return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}}


def chat_request(req: ResponsesRequest, messages: list[dict[str, Any]]) -> ChatCompletionRequest:
    body: dict[str, Any] = {"messages": messages, "tools": chat_tools(req.tools),
                            "tool_choice": chat_tool_choice(req.tool_choice),
                            "response_format": response_format(req.text),
                            "max_completion_tokens": req.max_output_tokens}
    for k in ("temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty", "guided_json", "guided_regex",
              "guided_choice", "guided_grammar", "structured_outputs"):
        v = getattr(req, k)
        if v is not None:
            body[k] = v
    return parse(ChatCompletionRequest, {k: v for k, v in body.items() if v is not None})


# ----------------------------------------------------------------------------- response objects
def _msg_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _call_item(call: ToolCall, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": status}


class _Builder:
    """The response object of one request, built up as its output arrives."""

    def __init__(self, state: AppState, req: ResponsesRequest, rid: str) -> None:
        self.state, self.req, self.id = state, req, rid
        self.created = int(time.time())
        self.output: list[dict[str, Any]] = []

    def body(self, status: str, usage: Optional[dict[str, int]] = None, reason: Optional[str] = None
             ) -> dict[str, Any]:
        req = self.req
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "model": self.state.model_name, "output": list(self.output), "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": req.previous_response_id, "reasoning": {"effort": None, "summary": None},
            "store": req.store, "temperature": req.temperature if req.temperature is not None else 1.0,
            "text": req.text or {"format": {"type": "text"}},
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
            "tools": req.tools or [], "top_p": req.top_p if req.top_p is not None else 1.0, "truncation": "disabled",
            "usage": None if usage is None else {
                "input_tokens": usage["prompt_tokens"], "input_tokens_details": {
                    "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]},
                "output_tokens": usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage["total_tokens"]},
            "user": req.user, "metadata": req.metadata or {},
        }


def _status(c: Choice) -> str:
    return "incomplete" if c.finish_reason == "length" else "completed"


def _remember(state: AppState, req: ResponsesRequest, history: list[dict[str, Any]], text: Optional[str],
              calls: list[ToolCall], body: dict[str, Any]) -> None:
    if not req.store:
        return
    turn: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        turn["tool_calls"] = [c.openai() for c in calls]
    state.responses.put(body["id"], StoredResponse(history + [turn], body))


# ----------------------------------------------------------------------------- routes
@router.post("/v1/responses")
async def create_response(request: Request) -> Response:
    req = parse(ResponsesRequest, await read_json(request))
    state = serve_state(request).for_model(req.model)
    gen = state.need_generator("/v1/responses")
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        prev = state.responses.get(req.previous_response_id)
        if prev is None:
            raise APIError(400, f"Previous response with id '{req.previous_response_id}' not found (this server keeps "
                           f"the last {state.responses.max_entries} stored responses in memory)",
                           param="previous_response_id", code="previous_response_not_found")
        history = [dict(m) for m in prev.messages]
    history += input_messages(req.input)
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + history
    creq = chat_request(req, messages)
    plan = _tool_plan(state, gen, creq)
    constraint = None
    if plan.constrained:
        from max.serve.tools import tool_constraint

        own, field = creq.constraint()
        if own is not None:
            field = "text.format" if field == "response_format" else field
            raise APIError(400, f"tool_choice {plan.mode!r} constrains the output already; drop {field}", param=field)
        constraint = (tool_constraint(creq.tools, plan.mode, plan.name), "tool_choice")
    chat_msgs = messages_for_template(messages) if creq.tools else messages
    rid = f"resp_{uuid.uuid4().hex}"
    job = await start_job(state, gen, request, rid, [dict(messages=chat_msgs)], creq, creq.max_new_tokens,
                          logprobs=0, echo=False, chat_extra=dict(tools=creq.tools), constraint=constraint,
                          raw_text=plan.parses)
    b = _Builder(state, req, rid)
    if req.stream:
        return sse(_stream(state, b, job, plan, history))
    await collect(state, job)
    c = job.choices[0]
    msg, _ = _message(c, plan)
    calls = [ToolCall(t["function"]["name"], t["function"]["arguments"], t["id"]) for t in msg.get("tool_calls", [])]
    if msg["content"] is not None:
        b.output.append(_msg_item(f"msg_{uuid.uuid4().hex}", msg["content"], _status(c)))
    b.output += [_call_item(t) for t in calls]
    body = b.body(_status(c), job.usage())
    _remember(state, req, history, msg["content"], calls, body)
    return JSONResponse(body)


def _event(kind: str, seq: int, **fields: Any) -> str:
    data = json.dumps(dict(type=kind, sequence_number=seq, **fields), separators=(",", ":"))
    return f"event: {kind}\ndata: {data}\n\n"


async def _stream(state: AppState, b: _Builder, job: Any, plan: ToolPlan, history: list[dict[str, Any]]
                  ) -> AsyncIterator[str]:
    seq = iter(range(1 << 62))
    yield _event("response.created", next(seq), response=b.body("in_progress"))
    yield _event("response.in_progress", next(seq), response=b.body("in_progress"))
    tools = ToolStream(plan.parser, plan.special_tokens) if plan.parses else None
    msg_id: Optional[str] = None
    msg_index = -1
    text: list[str] = []
    calls: list[ToolCall] = []
    c: Optional[Choice] = None

    def open_message() -> list[str]:
        nonlocal msg_id, msg_index
        msg_id, msg_index = f"msg_{uuid.uuid4().hex}", len(b.output)
        item = _msg_item(msg_id, "", "in_progress")
        item["content"] = []
        b.output.append(item)
        return [_event("response.output_item.added", next(seq), output_index=msg_index, item=item),
                _event("response.content_part.added", next(seq), item_id=msg_id, output_index=msg_index,
                       content_index=0, part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})]

    def text_events(delta: str) -> list[str]:
        if not delta:
            return []
        out = open_message() if msg_id is None else []
        text.append(delta)
        out.append(_event("response.output_text.delta", next(seq), item_id=msg_id, output_index=msg_index,
                          content_index=0, delta=delta, logprobs=[]))
        return out

    def close_message(status: str) -> list[str]:
        if msg_id is None:
            return []
        full = "".join(text)
        part = {"type": "output_text", "text": full, "annotations": [], "logprobs": []}
        item = _msg_item(msg_id, full, status)
        b.output[msg_index] = item
        return [_event("response.output_text.done", next(seq), item_id=msg_id, output_index=msg_index, content_index=0,
                       text=full, logprobs=[]),
                _event("response.content_part.done", next(seq), item_id=msg_id, output_index=msg_index,
                       content_index=0, part=part),
                _event("response.output_item.done", next(seq), output_index=msg_index, item=item)]

    def call_events(new: list[ToolCall]) -> list[str]:
        out = []
        for call in new:
            calls.append(call)
            item = _call_item(call)
            idx = len(b.output)
            b.output.append(item)
            out += [_event("response.output_item.added", next(seq), output_index=idx,
                           item=dict(item, arguments="", status="in_progress")),
                    _event("response.function_call_arguments.delta", next(seq), item_id=item["id"], output_index=idx,
                           delta=call.arguments),
                    _event("response.function_call_arguments.done", next(seq), item_id=item["id"], output_index=idx,
                           name=call.name, arguments=call.arguments),
                    _event("response.output_item.done", next(seq), output_index=idx, item=item)]
        return out

    async for c, out in stream_outputs(state, job):
        if out.finish_reason == "error":
            shutdown = out.error == SHUTDOWN_MESSAGE
            err = APIError(503 if shutdown else 500, out.error if shutdown else public_error(out.error or "", job.id),
                           code="server_shutting_down" if shutdown else "generation_error")
            failed = b.body("failed", job.usage())
            failed["error"] = {"code": err.code, "message": err.message}
            yield _event("response.failed", next(seq), response=failed)
            return
        if plan.constrained:
            delta, new = "", []  # the whole answer is the call(s): sent when it is complete
        elif tools is not None:
            delta, new = tools.feed(out.text)
        else:
            delta, new = out.text, []
        for s in text_events(delta) + call_events(new):
            yield s
        if out.done:
            if plan.constrained and c.finish_reason == "stop":
                events = call_events(calls_from_constrained("".join(c.text), plan.mode, plan.name))
            elif plan.constrained:
                events = text_events("".join(c.text))
            elif tools is not None:
                tail, more = tools.finish()
                events = text_events(tail) + call_events(more)
            else:
                events = []
            for s in events:
                yield s
    status = _status(c) if c is not None else "completed"
    for s in close_message(status):
        yield s
    body = b.body(status, job.usage())
    _remember(state, b.req, history, "".join(text) if msg_id is not None else None, calls, body)
    yield _event("response.completed" if status == "completed" else "response.incomplete", next(seq), response=body)


@router.get("/v1/responses/{response_id}")
async def get_response(request: Request, response_id: str) -> JSONResponse:
    entry = serve_state(request).responses.get(response_id)
    if entry is None:
        raise APIError(404, f"No response with id '{response_id}' found", param="response_id", code="not_found")
    return JSONResponse(entry.body)


@router.delete("/v1/responses/{response_id}")
async def delete_response(request: Request, response_id: str) -> JSONResponse:
    if not serve_state(request).responses.delete(response_id):
        raise APIError(404, f"No response with id '{response_id}' found", param="response_id", code="not_found")
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})
