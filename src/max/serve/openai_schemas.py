"""Request bodies of the OpenAI-compatible endpoints (pydantic, strict types) and the error shape.

Fields follow the OpenAI API; a few vLLM-style extensions are accepted too
(``top_k``, ``min_p``, ``repetition_penalty``, ``min_tokens``, ``ignore_eos``,
``stop_token_ids``; structured output through ``guided_json`` / ``guided_regex`` /
``guided_choice`` / ``guided_grammar`` or ``structured_outputs``).  Unknown fields are ignored.  Types are strict (``"5"`` is not
an integer); ranges the server knows are checked here, the rest by
``SamplingParams``.  Every failure becomes :class:`APIError`, rendered as
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Literal, Optional, Sequence, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

SEED_MAX = 2**63 - 1  # OpenAI's seed is a signed 64-bit integer


_PATH_RE = re.compile(r"(?<![\w:/.~-])/(?:[^\s/'\"()<>,;]+/)+[^\s/'\"()<>,;]*")


def scrub_paths(message: str, keep: Sequence[str] = ()) -> str:
    """``message`` with every absolute path of this machine's file system (one that exists, or whose
    folder exists) cut to its last component: errors never tell clients where files live -- except the
    strings of ``keep``, already public (the served model's name, which ``/v1/models`` lists: a model served
    from a folder is named by its path)."""
    kept = sorted({k for k in keep if k}, key=len, reverse=True)
    if kept:
        marks = [f"\x00{i}\x00" for i in range(len(kept))]
        for k, m in zip(kept, marks):
            message = message.replace(k, m)
        message = scrub_paths(message)
        for k, m in zip(kept, marks):
            message = message.replace(m, k)
        return message

    def cut(m: "re.Match[str]") -> str:
        path = m.group(0).rstrip(".:")
        tail = m.group(0)[len(path):]
        if os.path.exists(path) or os.path.isdir(os.path.dirname(path)):
            return (os.path.basename(path.rstrip("/")) or "<path>") + tail
        return m.group(0)

    return _PATH_RE.sub(cut, message)


class APIError(Exception):
    """An error answered in OpenAI's shape with HTTP ``status`` (file paths scrubbed from ``message``, but for the
    public names of ``keep``)."""

    def __init__(self, status: int, message: str, *, type: Optional[str] = None, param: Optional[str] = None,
                 code: Optional[str] = None, headers: Optional[dict[str, str]] = None, keep: Sequence[str] = ()
                 ) -> None:
        message = scrub_paths(message, keep)
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _default_type(status)
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict[str, Any]:
        """The error in Anthropic's shape (``/v1/messages``): ``{"type": "error", "error": {type, message}}``."""
        kind = _ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}


_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 415: "invalid_request_error",
                    429: "rate_limit_error", 503: "overloaded_error"}


def _default_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 404:
        return "invalid_request_error"
    if status == 429 or status == 503:
        return "server_overloaded" if status == 503 else "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class _SamplingFields(_Body):
    model: Optional[str] = None
    max_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    top_k: Optional[int] = None
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    seed: Optional[int] = Field(default=None, ge=0, le=SEED_MAX)
    stop: Union[str, list[str], None] = None
    presence_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: Optional[float] = Field(default=None, gt=0.0)
    n: int = Field(default=1, ge=1, le=128)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    min_tokens: int = Field(default=0, ge=0)
    ignore_eos: bool = False
    stop_token_ids: Optional[list[int]] = None
    logit_bias: Optional[dict[str, Union[int, float]]] = None
    prompt_logprobs: Optional[int] = Field(default=None, ge=0, le=20)
    user: Optional[str] = None

    @property
    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class _StructuredFields(_Body):
    """Structured output: OpenAI's ``response_format`` and vLLM's extension fields."""

    response_format: Optional[dict[str, Any]] = None
    guided_json: Union[dict[str, Any], str, None] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None
    structured_outputs: Optional[dict[str, Any]] = None

    def constraint(self) -> tuple[Optional[dict[str, Any]], str]:
        """``(response_format for the pipeline, the body field it came from)``; at most one field may
        constrain the output (400 otherwise)."""
        given = []
        if self.response_format is not None and self.response_format.get("type") not in (None, "text"):
            given.append(("response_format", dict(self.response_format)))
        if self.guided_json is not None:
            schema = self.guided_json
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except json.JSONDecodeError as e:
                    raise APIError(400, f"guided_json is not valid JSON: {e}", param="guided_json") from None
            given.append(("guided_json", {"type": "json_schema", "json_schema": {"name": "guided_json",
                                                                                 "schema": schema}}))
        for field, kind in (("guided_regex", "regex"), ("guided_choice", "choice"), ("guided_grammar", "grammar")):
            v = getattr(self, field)
            if v is not None:
                given.append((field, {"type": kind, kind: v}))
        so = self.structured_outputs
        if so:
            found = [k for k in ("json", "regex", "choice", "grammar", "json_object") if so.get(k) not in (None, False)]
            if len(found) != 1:
                raise APIError(400, "structured_outputs must set exactly one of json, regex, choice, grammar, "
                               f"json_object (got {found or 'none'})", param="structured_outputs")
            k = found[0]
            if k == "json_object":
                rf: dict[str, Any] = {"type": "json_object"}
            elif k == "json":
                v = so["json"]
                if isinstance(v, str):
                    try:
                        v = json.loads(v)
                    except json.JSONDecodeError as e:
                        raise APIError(400, f"structured_outputs.json is not valid JSON: {e}",
                                       param="structured_outputs.json") from None
                rf = {"type": "json_schema", "json_schema": {"name": "structured_outputs", "schema": v}}
            else:
                rf = {"type": k, k: so[k]}
            if so.get("whitespace_flexible") is not None or so.get("disable_any_whitespace") is not None:
                rf["whitespace_flexible"] = bool(so.get("whitespace_flexible", not so.get("disable_any_whitespace")))
            given.append(("structured_outputs", rf))
        if len(given) > 1:
            raise APIError(400, f"give one output constraint, not {len(given)} ({', '.join(f for f, _ in given)})",
                           param=given[1][0])
        return (given[0][1], given[0][0]) if given else (None, "response_format")


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Union[str, list[dict[str, Any]], None] = None
    name: Optional[str] = None

    def check(self, where: str) -> None:
        """OpenAI's rule: ``content`` is required, and may be null (or absent) only in an assistant
        message that carries ``tool_calls`` (or the legacy ``function_call``)."""
        if self.content is not None:
            return
        extra = self.model_extra or {}
        if self.role == "assistant" and (extra.get("tool_calls") or extra.get("function_call")):
            return
        what = "null" if "content" in self.model_fields_set else "missing"
        raise APIError(400, f"'{where}.content' is {what}: only an assistant message with tool_calls may omit "
                       "its content", param=f"{where}.content", code="invalid_value")


class ChatCompletionRequest(_SamplingFields, _StructuredFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=20)
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Any = None
    chat_template_kwargs: Optional[dict[str, Any]] = None

    @property
    def max_new_tokens(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def check(self) -> None:
        for i, m in enumerate(self.messages):
            m.check(f"messages[{i}]")


class CompletionRequest(_SamplingFields, _StructuredFields):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    echo: bool = False
    logprobs: Optional[int] = Field(default=None, ge=0, le=20)
    suffix: Optional[str] = None
    best_of: Optional[int] = None

    @property
    def max_new_tokens(self) -> Optional[int]:
        return 16 if self.max_tokens is None else self.max_tokens  # the OpenAI default for completions

    def prompts(self) -> list[Union[str, list[int]]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise APIError(400, "prompt must not be empty", param="prompt")
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # one prompt of token ids
        return list(p)  # type: ignore[arg-type]


class EmbeddingRequest(_Body):
    input: Union[str, list[str], list[int], list[list[int]]]
    model: Optional[str] = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = Field(default=None, ge=1)
    user: Optional[str] = None


def parse(model: type[BaseModel], body: Any) -> Any:
    """``model`` validated from the decoded JSON ``body``; :class:`APIError` 400 naming the field otherwise."""
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    try:
        req = model.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        # pydantic reports union members as extra loc parts (str, list[str], ...): keep the field path
        param = _param_path(err.get("loc", ()))
        msg = err.get("msg", "invalid value")
        if err.get("type") == "missing":
            msg = f"'{param}' is a required property"
        else:
            msg = f"invalid value for '{param}': {msg} (got {_short(err.get('input'))})"
        raise APIError(400, msg, param=param, code="missing_required_parameter" if err.get("type") == "missing"
                       else "invalid_value") from None
    check = getattr(req, "check", None)
    if check is not None:
        check()
    return req


def _param_path(loc: tuple) -> str:
    out = ""
    for x in loc:
        if isinstance(x, int):
            out += f"[{x}]"
        elif isinstance(x, str) and (x in {"str", "int", "float", "bool", "list", "dict", "none"} or "[" in x):
            break  # a union member's name, not a field
        else:
            out += ("." if out else "") + str(x)
    return out or "body"


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."
