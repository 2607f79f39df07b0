"""``POST /v1/tokenize`` and ``POST /v1/detokenize`` (also at ``/tokenize`` and ``/detokenize``, where
vLLM serves them), in vLLM's shapes.

Tokenize takes a completion-style ``{"prompt": str, "add_special_tokens": true}`` or a chat-style
``{"messages": [...], "add_generation_prompt": true, "continue_final_message": false,
"add_special_tokens": false, "tools": [...], "chat_template_kwargs": {...}}`` body (the messages go
through the model's chat template as ``/v1/chat/completions`` renders them), plus
``"return_token_strs": true`` for each token's text; it answers ``{"count", "max_model_len",
"tokens", "token_strs"}``.  Detokenize takes ``{"tokens": [ids]}`` and answers ``{"prompt": text}``.
Ids outside the vocabulary are a 400 naming ``tokens``.

``POST /apply-template`` (llama-server's endpoint) takes the chat-style body and answers ``{"prompt": text}``:
the messages rendered through the model's chat template exactly as ``/v1/chat/completions`` would feed them
(with the generation prompt unless ``add_generation_prompt`` is false).
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from max.interfaces.errors import PromptTooLong
from max.serve.invalid import FieldMap, expect
from max.serve.openai_schemas import APIError, ChatMessage, _Body
from max.serve.state import parse_body
from max.serve.tools import check_tools, messages_for_template

router = APIRouter()


class TokenizeRequest(_Body):
    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[list[ChatMessage]] = Field(default=None, min_length=1)
    add_special_tokens: Optional[bool] = None  # default: True for a prompt, False for messages (vLLM)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: Optional[list[dict[str, Any]]] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    return_token_strs: bool = False

    def check(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise APIError(400, "give either 'prompt' (a string) or 'messages' (a chat), not both or neither",
                           param="messages" if self.messages is not None else "prompt")
        if self.add_generation_prompt and self.continue_final_message and "add_generation_prompt" in \
                self.model_fields_set:
            raise APIError(400, "add_generation_prompt and continue_final_message cannot both be true",
                           param="continue_final_message")
        for i, m in enumerate(self.messages or []):
            m.check(f"messages[{i}]")


class DetokenizeRequest(_Body):
    model: Optional[str] = None
    tokens: list[int]


def _chat_text(tok: Any, req: TokenizeRequest) -> str:
    """The chat template's rendering of ``req.messages`` (as /v1/chat/completions renders them)."""
    messages = [m.model_dump(exclude_none=True) for m in req.messages or []]
    for m in messages:
        if m["role"] == "developer":
            m["role"] = "system"
    if req.tools:
        check_tools(req.tools, None)
        messages = messages_for_template(messages)
    opts = dict(req.chat_template_kwargs or {})
    if req.continue_final_message:
        opts.update(add_generation_prompt=False, continue_final_message=True)
    else:
        opts["add_generation_prompt"] = req.add_generation_prompt
    return tok.apply_chat_template(messages, req.tools, opts)  # a template's errors: InvalidRequest


def _fields(req: TokenizeRequest) -> FieldMap:
    """The checks of the prompt (template, content parts, length) are about ``messages`` or ``prompt``."""
    field = "messages" if req.messages is not None else "prompt"
    return FieldMap(known=frozenset(), default=field)


def _tokenize(tok: Any, req: TokenizeRequest) -> list[int]:
    if req.messages is not None:
        text = _chat_text(tok, req)
        special = bool(req.add_special_tokens) if req.add_special_tokens is not None else False
    else:
        text = req.prompt or ""
        special = True if req.add_special_tokens is None else bool(req.add_special_tokens)
    if not text:
        return []
    try:
        return [int(t) for t in tok.encode_sync(text, add_special_tokens=special)]
    except PromptTooLong:  # longer than the model's maximum length: count it anyway
        return [int(t) for t in tok.delegate.encode(text, add_special_tokens=special)]


def _check_ids(tok: Any, ids: list[int]) -> None:
    n_vocab = int(tok.vocab_size)
    bad = [t for t in ids if t < 0 or t >= n_vocab]
    if bad:
        raise APIError(400, f"token id {bad[0]} is outside the vocabulary (0..{n_vocab - 1})", param="tokens",
                       code="invalid_value")


async def tokenize(request: Request) -> JSONResponse:
    state, req = await parse_body(request, TokenizeRequest)
    gen = state.need_generator(request.url.path)
    tok = gen.tokenizer
    expect(request, _fields(req))
    ids = await asyncio.get_running_loop().run_in_executor(None, _tokenize, tok, req)
    body: dict[str, Any] = {"count": len(ids), "max_model_len": gen.max_length, "tokens": ids, "token_strs": None}
    if req.return_token_strs:
        body["token_strs"] = tok.delegate.convert_ids_to_tokens(ids)
    return JSONResponse(body)


async def detokenize(request: Request) -> JSONResponse:
    state, req = await parse_body(request, DetokenizeRequest)
    gen = state.need_generator(request.url.path)
    _check_ids(gen.tokenizer, req.tokens)
    text = await asyncio.get_running_loop().run_in_executor(None, gen.tokenizer.decode_sync, req.tokens)
    return JSONResponse({"prompt": text})


async def apply_template(request: Request) -> JSONResponse:
    state, req = await parse_body(request, TokenizeRequest)
    if req.messages is None:
        raise APIError(400, "'messages' is a required property", param="messages", code="missing_required_parameter")
    gen = state.need_generator(request.url.path)
    expect(request, _fields(req))
    text = await asyncio.get_running_loop().run_in_executor(None, _chat_text, gen.tokenizer, req)
    return JSONResponse({"prompt": text})


router.add_api_route("/apply-template", apply_template, methods=["POST"])
for _prefix in ("/v1", ""):
    router.add_api_route(f"{_prefix}/tokenize", tokenize, methods=["POST"])
    router.add_api_route(f"{_prefix}/detokenize", detokenize, methods=["POST"])
