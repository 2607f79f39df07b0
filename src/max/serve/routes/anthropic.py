"""``POST /v1/messages`` (Anthropic's Messages API) and ``POST /v1/messages/count_tokens``.

A request becomes a chat completion on the same machinery as ``/v1/chat/completions``:

* ``system`` (a string or text blocks) is the system message; ``messages`` alternate user / assistant
  turns whose ``content`` is a string or content blocks: ``text``, ``image`` (``source`` base64 or url;
  a text-only model answers 400), ``tool_use`` (assistant: a tool call) and ``tool_result`` (user: the
  call's result, a tool message for the chat template).  A last assistant turn is continued (prefill).
* ``tools`` (``name``, ``description``, ``input_schema``) and ``tool_choice`` (``auto``, ``any``, ``tool``
  with ``name``, ``none``) map onto :mod:`max.serve.tools` (``any`` is OpenAI's ``required``);
  calls come back as ``tool_use`` blocks with ``stop_reason`` ``tool_use``.
* ``max_tokens`` is required; it caps the answer (a value past the model's context is cut to what fits,
  ``stop_reason`` ``max_tokens``).  ``stop_sequences`` end the answer with ``stop_reason``
  ``stop_sequence`` and ``stop_sequence`` naming the one met; ``temperature`` (0-1), ``top_p``,
  ``top_k``.
* ``usage``: ``input_tokens`` (prompt tokens computed), ``cache_read_input_tokens`` (prompt tokens the
  prefix cache supplied; their sum is the prompt), ``output_tokens``.

Streaming (``stream: true``) sends Anthropic's events: ``message_start``, then per block
``content_block_start`` (a ``ping`` after the first), ``content_block_delta`` (``text_delta``, or one
``input_json_delta`` per tool call), ``content_block_stop``, and ``message_delta`` (``stop_reason``,
``stop_sequence``, ``usage``) and ``message_stop``.  Errors use Anthropic's shape,
``{"type": "error", "error": {"type": "invalid_request_error", "message": ...}}``, with the HTTP status
OpenAI's routes use; a failure inside a stream is an ``error`` event.  The API key may come as
``x-api-key`` (see :mod:`max.serve.middleware`).
"""

from __future__ import annotations

import json
import uuid
from typing import Any, AsyncIterator, Optional, Union

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field

from max.serve.jobs import SHUTDOWN_MESSAGE, Choice, Job, collect, public_error, sse, start_job, stream_outputs
from max.serve.openai_schemas import APIError, ChatCompletionRequest, _Body, parse
from max.serve.routes.chat import ToolPlan, _message, _tool_plan
from max.serve.state import AppState, read_json, serve_state
from max.serve.tools import ToolCall, ToolStream, calls_from_constrained, messages_for_template, tool_constraint

router = APIRouter()


class MessagesRequest(_Body):
    model: Optional[str] = None
    max_tokens: int = Field(ge=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: Union[str, list[dict[str, Any]], None] = None
    stop_sequences: Optional[list[str]] = None
    stream: bool = False
    temperature: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(default=None, ge=1)
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[dict[str, Any]] = None
    metadata: Optional[dict[str, Any]] = None
    # extensions (as vLLM's): reproducible sampling, structured output
    seed: Optional[int] = None
    guided_json: Union[dict[str, Any], str, None] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None


class CountTokensRequest(_Body):
    model: Optional[str] = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: Union[str, list[dict[str, Any]], None] = None
    tools: Optional[list[dict[str, Any]]] = None


# ----------------------------------------------------------------------------- errors
def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.anthropic_body(), status_code=e.status, headers=e.headers)


# ----------------------------------------------------------------------------- request translation
def _bad(where: str, msg: str) -> APIError:
    return APIError(400, f"{where}: {msg}", param=where, code="invalid_value")


def _text_of(blocks: Any, where: str) -> str:
    """The text of a string or a list of ``text`` blocks (``system``, a ``tool_result``'s content)."""
    if blocks is None:
        return ""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise _bad(where, "must be a string or a list of text blocks")
    out = []
    for j, b in enumerate(blocks):
        if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
            raise _bad(f"{where}[{j}]", "must be a text block {'type': 'text', 'text': ...}")
        out.append(b["text"])
    return "\n".join(out)


def _image_part(block: dict[str, Any], where: str) -> dict[str, Any]:
    src = block.get("source")
    if not isinstance(src, dict):
        raise _bad(f"{where}.source", "must be {'type': 'base64', 'media_type': ..., 'data': ...} or "
                   "{'type': 'url', 'url': ...}")
    if src.get("type") == "base64":
        if not isinstance(src.get("media_type"), str) or not isinstance(src.get("data"), str):
            raise _bad(f"{where}.source", "a base64 image needs media_type and data strings")
        url = f"data:{src['media_type']};base64,{src['data']}"
    elif src.get("type") == "url" and isinstance(src.get("url"), str):
        url = src["url"]
    else:
        raise _bad(f"{where}.source.type", f"must be base64 or url (got {src.get('type')!r})")
    return {"type": "image_url", "image_url": {"url": url}}


def _user_turn(content: Any, where: str) -> list[dict[str, Any]]:
    """A user turn as chat messages: its tool results (tool messages), then its text and images."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list) or not content:
        raise _bad(where, "must be a string or a non-empty list of content blocks")
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, b in enumerate(content):
        w = f"{where}[{j}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            parts.append({"type": "text", "text": b["text"]})
        elif kind == "image":
            parts.append(_image_part(b, w))
        elif kind == "tool_result":
            if not isinstance(b.get("tool_use_id"), str):
                raise _bad(f"{w}.tool_use_id", "must be the id of the tool_use block it answers")
            text = _text_of(b.get("content"), f"{w}.content")
            if b.get("is_error"):
                text = f"Error: {text}"
            tools.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": text})
        else:
            raise _bad(f"{w}.type", f"user content blocks are text, image or tool_result (got {kind!r})")
    out = list(tools)
    if parts:
        text_only = all(p["type"] == "text" for p in parts)
        out.append({"role": "user", "content": "\n".join(p["text"] for p in parts) if text_only else parts})
    return out


def _assistant_turn(content: Any, where: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise _bad(where, "must be a string or a list of content blocks")
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, b in enumerate(content):
        w = f"{where}[{j}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            text.append(b["text"])
        elif kind == "tool_use":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str) or \
                    not isinstance(b.get("input"), dict):
                raise _bad(w, "a tool_use block needs id and name strings and an input object")
            calls.append({"id": b["id"], "type": "function",
                          "function": {"name": b["name"], "arguments": json.dumps(b["input"])}})
        elif kind in ("thinking", "redacted_thinking"):
            continue  # earlier reasoning is not shown to the model again
        else:
            raise _bad(f"{w}.type", f"assistant content blocks are text or tool_use (got {kind!r})")
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text or not calls else None}
    if calls:
        msg["tool_calls"] = calls
    return msg


def chat_messages(system: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages of an Anthropic ``system`` + ``messages`` (400 naming the field when malformed)."""
    out: list[dict[str, Any]] = []
    sys_text = _text_of(system, "system")
    if sys_text:
        out.append({"role": "system", "content": sys_text})
    for i, m in enumerate(messages):
        w = f"messages[{i}]"
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("user", "assistant"):
            raise _bad(f"{w}.role", f"must be user or assistant (got {role!r}; the system prompt goes in 'system')")
        if "content" not in m:
            raise APIError(400, f"'{w}.content' is a required property", param=f"{w}.content",
                           code="missing_required_parameter")
        if role == "user":
            out += _user_turn(m["content"], f"{w}.content")
        else:
            out.append(_assistant_turn(m["content"], f"{w}.content"))
    return out


def chat_tools(tools: Optional[list[dict[str, Any]]]) -> Optional[list[dict[str, Any]]]:
    """Anthropic tools (``name``, ``description``, ``input_schema``) as chat function tools."""
    if tools is None:
        return None
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not isinstance(t.get("input_schema"),
                                                                                          dict):
            raise _bad(f"tools[{i}]", "must be {'name': ..., 'description': ..., 'input_schema': {...}} (server "
                       "tools such as web search are not available)")
        fn = {"name": t["name"], "parameters": t["input_schema"]}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: Optional[dict[str, Any]]) -> Any:
    if choice is None:
        return None
    kind = choice.get("type")
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _bad("tool_choice", "must be {'type': 'auto'}, {'type': 'any'}, {'type': 'none'} or "
               "{'type': 'tool', 'name': ...}")


def chat_request(req: MessagesRequest, messages: list[dict[str, Any]]) -> ChatCompletionRequest:
    body: dict[str, Any] = {"messages": messages, "tools": chat_tools(req.tools),
                            "tool_choice": chat_tool_choice(req.tool_choice), "max_tokens": req.max_tokens,
                            "stop": req.stop_sequences or None}
    for k in ("temperature", "top_p", "top_k", "seed", "guided_json", "guided_regex", "guided_choice",
              "guided_grammar"):
        v = getattr(req, k)
        if v is not None:
            body[k] = v
    if messages[-1]["role"] == "assistant":  # a prefilled answer: the model continues it
        body["chat_template_kwargs"] = {"add_generation_prompt": False, "continue_final_message": True}
    return parse(ChatCompletionRequest, {k: v for k, v in body.items() if v is not None})


# ----------------------------------------------------------------------------- responses
def _usage(job: Job, output_tokens: int) -> dict[str, int]:
    cached = job.cached_tokens
    return {"input_tokens": job.prompt_tokens - cached, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


def _tool_use(call: ToolCall) -> dict[str, Any]:
    cid = call.id[len("call_"):] if call.id.startswith("call_") else call.id
    try:
        args = json.loads(call.arguments)
    except json.JSONDecodeError:
        args = {}
    return {"type": "tool_use", "id": f"toolu_{cid}", "name": call.name, "input": args if isinstance(args, dict)
            else {"value": args}}


def stop_reason(c: Choice, tool_use: bool) -> str:
    if tool_use:
        return "tool_use"
    if c.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if c.stop_sequence is not None else "end_turn"


def _message_body(state: AppState, rid: str, content: list[dict[str, Any]], reason: Optional[str],
                  stop_seq: Optional[str], usage: dict[str, int]) -> dict[str, Any]:
    return {"id": rid, "type": "message", "role": "assistant", "model": state.model_name, "content": content,
            "stop_reason": reason, "stop_sequence": stop_seq, "usage": usage}


@router.post("/v1/messages")
async def create_message(request: Request) -> Response:
    try:
        return await _create(request)
    except APIError as e:
        return error_response(e)


async def _create(request: Request) -> Response:
    req = parse(MessagesRequest, await read_json(request))
    state = serve_state(request).for_model(req.model)
    gen = state.need_generator("/v1/messages")
    messages = chat_messages(req.system, req.messages)
    creq = chat_request(req, messages)
    plan = _tool_plan(state, gen, creq)
    constraint = None
    if plan.constrained:
        own, field = creq.constraint()
        if own is not None:
            raise APIError(400, f"tool_choice {req.tool_choice.get('type')!r} constrains the output already; drop "
                           f"{field}", param=field)
        constraint = (tool_constraint(creq.tools, plan.mode, plan.name), "tool_choice")
    chat_msgs = messages_for_template(messages) if creq.tools else messages
    rid = f"msg_{uuid.uuid4().hex}"
    job = await start_job(state, gen, request, rid, [dict(messages=chat_msgs)], creq, creq.max_new_tokens,
                          logprobs=0, echo=False,
                          chat_extra=dict(tools=creq.tools, chat_template_options=creq.chat_template_kwargs),
                          constraint=constraint, raw_text=plan.parses, explicit_max=False)
    if req.stream:
        return sse(_stream(state, job, plan, rid))
    await collect(state, job)
    c = job.choices[0]
    msg, _ = _message(c, plan)
    content: list[dict[str, Any]] = []
    if msg["content"]:
        content.append({"type": "text", "text": msg["content"]})
    calls = [ToolCall(t["function"]["name"], t["function"]["arguments"], t["id"]) for t in msg.get("tool_calls", [])]
    content += [_tool_use(t) for t in calls]
    body = _message_body(state, rid, content, stop_reason(c, bool(calls)), c.stop_sequence if not calls else None,
                         _usage(job, c.completion_tokens))
    return JSONResponse(body)


def _event(kind: str, **fields: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps(dict(type=kind, **fields), separators=(',', ':'))}\n\n"


async def _stream(state: AppState, job: Job, plan: ToolPlan, rid: str) -> AsyncIterator[str]:
    tools = ToolStream(plan.parser, plan.special_tokens) if plan.parses else None
    n_blocks = 0
    text_open = False
    started = False
    n_calls = 0

    def start() -> list[str]:
        nonlocal started
        if started:
            return []
        started = True
        # sent with the first output: the prompt has run, so the prefix cache's share is known
        return [_event("message_start", message=_message_body(state, rid, [], None, None, _usage(job, 0)))]

    def open_block(block: dict[str, Any]) -> list[str]:
        out = [_event("content_block_start", index=n_blocks, content_block=block)]
        if n_blocks == 0:
            out.append(_event("ping"))
        return out

    def text_events(delta: str) -> list[str]:
        nonlocal text_open
        if not delta:
            return []
        out = []
        if not text_open:
            out += open_block({"type": "text", "text": ""})
            text_open = True
        out.append(_event("content_block_delta", index=n_blocks, delta={"type": "text_delta", "text": delta}))
        return out

    def close_text() -> list[str]:
        nonlocal text_open, n_blocks
        if not text_open:
            return []
        text_open = False
        n_blocks += 1
        return [_event("content_block_stop", index=n_blocks - 1)]

    def call_events(calls: list[ToolCall]) -> list[str]:
        nonlocal n_blocks, n_calls
        out = close_text() if calls else []
        for call in calls:
            block = _tool_use(call)
            out += open_block(dict(block, input={}))
            out.append(_event("content_block_delta", index=n_blocks,
                              delta={"type": "input_json_delta", "partial_json": json.dumps(block["input"])}))
            out.append(_event("content_block_stop", index=n_blocks))
            n_blocks += 1
            n_calls += 1
        return out

    c: Optional[Choice] = None
    async for c, out in stream_outputs(state, job):
        if out.finish_reason == "error":
            shutdown = out.error == SHUTDOWN_MESSAGE
            err = APIError(503 if shutdown else 500, out.error if shutdown else public_error(out.error or "", job.id))
            yield _event("error", error=err.anthropic_body()["error"])
            return
        if not out.tokens and not out.done:
            continue  # a prompt chunk: nothing to say yet
        events = start()
        if plan.constrained:
            delta, calls = "", []  # the whole answer is the call(s): sent when it is complete
        elif tools is not None:
            delta, calls = tools.feed(out.text)
        else:
            delta, calls = out.text, []
        events += text_events(delta) + call_events(calls)
        if out.done:
            if plan.constrained and c.finish_reason == "stop":
                events += call_events(calls_from_constrained("".join(c.text), plan.mode, plan.name))
            elif plan.constrained:
                events += text_events("".join(c.text))
            elif tools is not None:
                tail, more = tools.finish()
                events += text_events(tail) + call_events(more)
        for s in events:
            yield s
    if c is None or c.finish_reason == "cancelled":
        return
    for s in start() + close_text():
        yield s
    usage = _usage(job, c.completion_tokens)
    yield _event("message_delta", delta={"stop_reason": stop_reason(c, n_calls > 0),
                                         "stop_sequence": c.stop_sequence if not n_calls else None}, usage=usage)
    yield _event("message_stop")


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request) -> Response:
    """``{"input_tokens": n}``: the prompt tokens ``/v1/messages`` would feed the model for this body."""
    try:
        import asyncio

        req = parse(CountTokensRequest, await read_json(request))
        state = serve_state(request).for_model(req.model)
        gen = state.need_generator("/v1/messages/count_tokens")
        messages = chat_messages(req.system, req.messages)
        tools = chat_tools(req.tools)
        if tools:
            messages = messages_for_template(messages)
        opts = ({"add_generation_prompt": False, "continue_final_message": True}
                if messages[-1]["role"] == "assistant" else {})
        tok = gen.tokenizer

        def count() -> int:  # the template's errors: InvalidRequest, answered in Anthropic's shape by the app
            text = tok.apply_chat_template(messages, tools, opts)
            return len(tok.delegate.encode(text, add_special_tokens=False))

        n = await asyncio.get_running_loop().run_in_executor(None, count)
        return JSONResponse({"input_tokens": n})
    except APIError as e:
        return error_response(e)
