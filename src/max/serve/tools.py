"""Tool calling for ``/v1/chat/completions``: ``tools`` / ``tool_choice`` checks, the output constraint
of ``required`` and named choices, and per-family parsers of the model's tool-call text.

* ``tool_choice="auto"`` (the default with tools): the model writes whatever it wants; its output is
  parsed by the family's parser into OpenAI ``tool_calls`` (text outside the calls stays ``content``).
* ``"none"``: tools are still shown to the model (as OpenAI does) but the output is never parsed.
* ``"required"`` and ``{"type": "function", "function": {"name": ...}}``: the output is constrained
  (structured-output masks) to a JSON array of ``{"name", "parameters"}`` calls of the given tools,
  or to the named function's arguments object, so it always is a valid call.

Parsers (chosen from the chat template unless the server names one): ``hermes`` (Hermes, Qwen2/2.5/3:
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``), ``llama3_json`` (Llama 3.1+:
``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``, several separated by
``;``) and ``mistral`` (``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` or the newer
``[TOOL_CALLS]name[ARGS]{...}``).  Each parser also works incrementally (:class:`ToolStream`): text
before a call streams as content, each call is emitted once complete.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from max.pipelines.lib.structured_output import GrammarError, check_json_schema
from max.serve.openai_schemas import APIError

PARSERS = ("hermes", "llama3_json", "mistral")


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON text, as OpenAI sends it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def openai(self, index: Optional[int] = None) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "type": "function",
                             "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            d["index"] = index
        return d


# ----------------------------------------------------------------------------- request checks
def tool_names(tools: list[dict[str, Any]]) -> list[str]:
    return [t["function"]["name"] for t in tools]


def check_tools(tools: Optional[list[dict[str, Any]]], tool_choice: Any) -> tuple[str, Optional[str]]:
    """``(mode, function name)`` for the request: mode is ``"none"``, ``"auto"``, ``"required"`` or
    ``"named"``; 400 naming the field for malformed tools, an unknown tool or a choice without tools."""
    if tools is not None:
        if not isinstance(tools, list) or not tools:
            raise APIError(400, "tools must be a non-empty list of {'type': 'function', 'function': {...}}",
                           param="tools")
        for i, t in enumerate(tools):
            fn = t.get("function") if isinstance(t, dict) else None
            if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict) or \
                    not isinstance(fn.get("name"), str) or not fn["name"]:
                raise APIError(400, f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., "
                               "'parameters': {...}}}}", param=f"tools[{i}]")
            params = fn.get("parameters")
            if params is not None:
                where = f"tools[{i}].function.parameters"
                try:
                    check_json_schema(params, where)
                except GrammarError as e:
                    raise APIError(400, str(e), param=where, code="invalid_value") from None
    if tool_choice is None:
        return ("auto" if tools else "none"), None
    if isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise APIError(400, f"tool_choice must be 'none', 'auto', 'required' or a named function, got "
                           f"{tool_choice!r}", param="tool_choice")
        if tool_choice != "none" and not tools:
            raise APIError(400, f"tool_choice {tool_choice!r} needs tools", param="tool_choice")
        return tool_choice, None
    fn = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise APIError(400, "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', "
                       "'function': {'name': ...}}", param="tool_choice")
    if not tools:
        raise APIError(400, "a named tool_choice needs tools", param="tool_choice")
    if fn["name"] not in tool_names(tools):
        raise APIError(400, f"tool_choice names the function {fn['name']!r}, which is not among the tools "
                       f"({', '.join(tool_names(tools))})", param="tool_choice")
    return "named", fn["name"]


def _params_schema(tool: dict[str, Any]) -> dict[str, Any]:
    return tool["function"].get("parameters") or {"type": "object"}


def tool_constraint(tools: list[dict[str, Any]], mode: str, name: Optional[str]) -> Optional[dict[str, Any]]:
    """The ``response_format`` enforcing a ``required`` / named choice (None for auto / none)."""
    if mode == "named":
        tool = next(t for t in tools if t["function"]["name"] == name)
        return {"type": "json_schema", "json_schema": {"name": name, "schema": _params_schema(tool)}}
    if mode == "required":
        calls = [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                                   "parameters": _params_schema(t)},
                  "required": ["name", "parameters"], "additionalProperties": False} for t in tools]
        return {"type": "json_schema", "json_schema": {"name": "tool_calls", "schema": {
            "type": "array", "minItems": 1, "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}}}
    return None


def calls_from_constrained(text: str, mode: str, name: Optional[str]) -> list[ToolCall]:
    """The calls of a ``required`` / named answer (the JSON its constraint produced)."""
    data = json.loads(text)
    if mode == "named":
        return [ToolCall(name or "", json.dumps(data))]
    return [ToolCall(c["name"], json.dumps(c.get("parameters", {}))) for c in data]


def messages_for_template(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant ``tool_calls`` arguments as objects (chat templates render them with ``tojson``)."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            m = dict(m)
            new = []
            for c in calls:
                c = dict(c)
                fn = dict(c.get("function") or {})
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except json.JSONDecodeError:
                        pass
                c["function"] = fn
                new.append(c)
            m["tool_calls"] = new
        out.append(m)
    return out


def detect_parser(chat_template: Optional[str]) -> Optional[str]:
    """The tool-call parser a chat template implies (None when it renders no tools)."""
    t = chat_template or ""
    if "<tool_call>" in t:
        return "hermes"
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "<|python_tag|>" in t or ("ipython" in t and "tools" in t):
        return "llama3_json"
    return None


# ----------------------------------------------------------------------------- parsers
def _json_prefix(s: str) -> tuple[Any, int]:
    """The JSON value at the start of ``s`` (after whitespace) and where it ends; ValueError if none."""
    i = len(s) - len(s.lstrip())
    obj, end = json.JSONDecoder().raw_decode(s, i)
    return obj, end


def _call(obj: Any, args_key: str) -> Optional[ToolCall]:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    return ToolCall(obj["name"], args if isinstance(args, str) else json.dumps(args))


class ToolParser:
    """Finds tool calls in raw model text (special tokens kept).  ``start_markers`` begin the call
    region; :meth:`take_calls` returns the complete calls at the start of ``buf`` and the rest."""

    name = ""
    start_markers: tuple[str, ...] = ()

    def marker_at(self, text: str, at_start: bool) -> int:
        """Index of the first call marker in ``text`` (-1 if none)."""
        found = [i for i in (text.find(m) for m in self.start_markers) if i >= 0]
        return min(found) if found else -1

    def take_calls(self, buf: str, final: bool) -> tuple[list[ToolCall], str, bool]:
        """``(complete calls, unconsumed rest, ok)`` of the call region ``buf``; ``ok`` False when ``final``
        and the region is not well formed (the caller then treats it as plain content)."""
        raise NotImplementedError

    def parse(self, text: str) -> tuple[Optional[str], list[ToolCall]]:
        """``(content, calls)`` of a whole output."""
        i = self.marker_at(text, True)
        if i < 0:
            return text, []
        calls, rest, ok = self.take_calls(text[i:], True)
        if not ok or not calls:
            return text, []
        content = text[:i]
        return (content if content.strip() else None), calls


class HermesParser(ToolParser):
    name = "hermes"
    start_markers = ("<tool_call>",)
    _block = re.compile(r"\s*<tool_call>\s*(.*?)\s*</tool_call>", re.S)

    def take_calls(self, buf: str, final: bool) -> tuple[list[ToolCall], str, bool]:
        calls = []
        while True:
            m = self._block.match(buf)
            if m is None:
                break
            try:
                c = _call(json.loads(m.group(1)), "arguments")
            except json.JSONDecodeError:
                c = None
            if c is None:
                return calls, buf, False
            calls.append(c)
            buf = buf[m.end():]
        if final:
            rest = buf.strip()
            if rest.startswith("<tool_call>"):  # unclosed last call: accept it when its JSON is whole
                try:
                    obj, _ = _json_prefix(rest[len("<tool_call>"):])
                except ValueError:
                    return calls, buf, False
                c = _call(obj, "arguments")
                if c is None:
                    return calls, buf, False
                calls.append(c)
                buf = ""
        return calls, buf, True


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    start_markers = ("<|python_tag|>",)

    def marker_at(self, text: str, at_start: bool) -> int:
        i = super().marker_at(text, at_start)
        if i >= 0:
            return i
        stripped = text.lstrip()
        if at_start and stripped.startswith("{"):
            return len(text) - len(stripped)
        return -1

    def take_calls(self, buf: str, final: bool) -> tuple[list[ToolCall], str, bool]:
        if not final:
            return [], buf, True  # one JSON text: parsed when the output ends
        body = buf.replace("<|python_tag|>", "").strip()
        calls = []
        while body:
            try:
                obj, end = _json_prefix(body)
            except ValueError:
                return [], buf, False
            c = _call(obj, "parameters")
            if c is None:
                return [], buf, False
            calls.append(c)
            body = body[end:].lstrip().lstrip(";").lstrip()
        return calls, "", bool(calls)


class MistralParser(ToolParser):
    name = "mistral"
    start_markers = ("[TOOL_CALLS]",)

    def take_calls(self, buf: str, final: bool) -> tuple[list[ToolCall], str, bool]:
        if not final:
            return [], buf, True
        calls = []
        for part in buf.split("[TOOL_CALLS]")[1:]:
            part = part.strip()
            if "[ARGS]" in part:  # name[ARGS]{...}
                name, _, args = part.partition("[ARGS]")
                try:
                    obj, _ = _json_prefix(args)
                except ValueError:
                    return [], buf, False
                calls.append(ToolCall(name.strip(), json.dumps(obj)))
                continue
            try:
                obj, _ = _json_prefix(part)
            except ValueError:
                return [], buf, False
            for o in obj if isinstance(obj, list) else [obj]:
                c = _call(o, "arguments")
                if c is None:
                    return [], buf, False
                calls.append(c)
        return calls, "", bool(calls)


def make_parser(name: str) -> ToolParser:
    try:
        return {"hermes": HermesParser, "llama3_json": Llama3JsonParser, "mistral": MistralParser}[name]()
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r}; choose one of {', '.join(PARSERS)}") from None


class ToolStream:
    """Incremental parsing of streamed raw text: :meth:`feed` returns ``(content delta, new calls)``;
    content before the first call marker streams at once (a possible marker prefix is held back),
    the call region is buffered and emitted call by call; :meth:`finish` flushes."""

    def __init__(self, parser: ToolParser, special_tokens: tuple[str, ...] = ()) -> None:
        self.parser = parser
        self.special = tuple(s for s in special_tokens if s and s not in parser.start_markers)
        self.pending = ""  # content not yet emitted (may end in a marker prefix)
        self.region: Optional[str] = None  # the call region once a marker was seen
        self.emitted_any = False
        self.calls: list[ToolCall] = []

    def _clean(self, s: str) -> str:
        for t in self.special:
            s = s.replace(t, "")
        return s

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        if self.region is not None:
            self.region = self._clean(self.region + text)
            calls, self.region, _ = self.parser.take_calls(self.region, False)
            self.calls += calls
            return "", calls
        self.pending += text
        i = self.parser.marker_at(self.pending, not self.emitted_any)
        if i >= 0:
            out, self.region = self.pending[:i], self._clean(self.pending[i:])
            self.pending = ""
            calls, self.region, _ = self.parser.take_calls(self.region, False)
            self.calls += calls
            return self._emit(out), calls
        hold = 0
        for m in self.parser.start_markers + (("{",) if isinstance(self.parser, Llama3JsonParser) else ()):
            for k in range(min(len(m) - 1, len(self.pending)), 0, -1):
                if self.pending.endswith(m[:k]):
                    hold = max(hold, k)
                    break
        if isinstance(self.parser, Llama3JsonParser) and not self.emitted_any and not self.pending.strip():
            hold = len(self.pending)  # only whitespace so far: the output may still open with '{'
        out = self.pending[:len(self.pending) - hold]
        self.pending = self.pending[len(out):]
        return self._emit(out), []

    def _emit(self, s: str) -> str:
        s = self._clean(s)
        if s:
            self.emitted_any = True
        return s

    def finish(self) -> tuple[str, list[ToolCall]]:
        if self.region is None:
            out, self.pending = self.pending, ""
            return self._emit(out), []
        calls, rest, ok = self.parser.take_calls(self.region, True)
        self.region = None
        if not ok and not self.calls:
            return self._emit(rest), []  # not a call after all: plain text
        self.calls += calls
        return "", calls
