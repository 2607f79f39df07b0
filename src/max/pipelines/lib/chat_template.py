"""Chat templates rendered with jinja2, as Hugging Face tokenizers render them, without transformers.

Model chat templates are Jinja programs written against the environment ``transformers`` gives them;
:func:`render_chat_template` gives the same one, so a template renders to the same text:

* a sandboxed, immutable environment with ``trim_blocks`` and ``lstrip_blocks``, ``break``/``continue``
  (``loopcontrols``) and the ``{% generation %}`` block tag (rendered as its body);
* ``tojson`` that does not escape HTML and takes ``indent``/``separators``/``sort_keys``/``ensure_ascii``
  (``ensure_ascii`` off by default); the globals ``raise_exception(message)``, ``strftime_now(format)``,
  ``dict(...)`` and a ``namespace(...)`` that refuses underscore-prefixed names;
* the template sees ``messages`` (message keys whose value is None dropped; a message's reasoning under
  ``reasoning_content``, ``thinking`` or ``reasoning`` is also given as ``reasoning_content`` and
  ``thinking``), ``tools``, ``documents``, ``add_generation_prompt`` and the caller's variables (the
  tokenizer's special tokens, ``bos_token`` ..., and template options such as ``enable_thinking``), all
  rebuilt from plain JSON-like values;
* ``continue_final_message``: the text ends inside the final message (its ``content``, or the named
  field), for the model to continue it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from contextlib import contextmanager
from datetime import datetime
from functools import lru_cache
from typing import Any, Iterator, Optional, Sequence

from max.interfaces.errors import InvalidRequest

__all__ = ["client_template_errors", "render_chat_template"]

REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")
"""Where a message may carry its reasoning; the first is the name templates read."""

_CONTINUE_MARK = "CONTINUE_FINAL_MESSAGE_TAG "


@contextmanager
def client_template_errors() -> Iterator[None]:
    """Around a tokenizer's chat template rendering a client's messages: what the template (or the library
    running it) rejects in them — a ``raise_exception`` of the template, an undefined field, a wrong type, a
    malformed or empty conversation — becomes :class:`InvalidRequest` about ``messages`` (the client's
    400); other errors pass.  (:func:`render_chat_template` itself raises what transformers raises.)"""
    import jinja2

    try:
        yield
    except InvalidRequest:
        raise
    except jinja2.TemplateError as e:
        raise InvalidRequest(f"the chat template failed on these messages: {type(e).__name__}: {e}",
                             param="messages") from e
    except (TypeError, ValueError) as e:
        raise InvalidRequest(str(e), param="messages") from e


@lru_cache(maxsize=16)
def _compiled(template: str) -> Any:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` (marks the assistant's text for training masks):
        rendered as its body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    class Namespace(jinja2.utils.Namespace):
        """A template ``namespace()`` that keeps templates away from dunder attributes."""

        def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - jinja's own signature trick
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a chat template may not set the attribute {name!r} on a "
                                                      "namespace")

    class DictMaker:
        """``dict(...)`` / ``dict.fromkeys(...)`` for templates, without exposing the ``dict`` type."""

        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, dict=DictMaker(),
                       namespace=Namespace)
    return env.from_string(template)


def _plain(value: Any) -> Any:
    """``value`` rebuilt from plain JSON-like types (a template is untrusted code: it sees no methods of
    the caller's objects); anything else becomes a placeholder naming its type."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if hasattr(value, "item") and type(value).__module__ == "numpy":  # numpy scalars
        return _plain(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):  # pydantic models
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def _messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        if callable(getattr(m, "model_dump", None)):
            m = m.model_dump()
        elif dataclasses.is_dataclass(m) and not isinstance(m, type):
            m = {f.name: getattr(m, f.name) for f in dataclasses.fields(m)}
        if not isinstance(m, Mapping):
            raise TypeError(f"chat messages must be dicts, got {m!r}")
        m = _plain({k: v for k, v in m.items() if v is not None})
        reasoning = next((m[k] for k in REASONING_KEYS if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


def render_chat_template(template: str, messages: Sequence[Any], *, tools: Optional[Sequence[Any]] = None,
                         documents: Optional[Sequence[Any]] = None, add_generation_prompt: bool = False,
                         continue_final_message: bool | str = False, **variables: Any) -> str:
    """The text of ``messages`` through the Jinja chat ``template`` (see the module docstring).

    ``tools`` are JSON schemas (dicts); ``documents`` dicts; ``variables`` are more template variables.
    """
    if not messages:
        raise ValueError("cannot apply a chat template to an empty conversation")
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt are mutually exclusive: the first "
                         "continues the last message, the second starts a new assistant message")
    if tools is not None:
        for t in tools:
            if not isinstance(t, Mapping):
                raise TypeError(f"tools must be JSON schemas (dicts), got {type(t).__name__}")
    if documents is not None:
        for doc in documents:
            if not isinstance(doc, Mapping):
                raise TypeError("documents must be dicts (with 'title' and 'text')")
    chat = _messages(messages)
    final = None
    if continue_final_message:
        key = continue_final_message if isinstance(continue_final_message, str) else "content"
        final = chat[-1].get(key)
        if final is None:
            raise ValueError(f"continue_final_message: the final message has no {key!r} to continue")
        keys = [k for k in REASONING_KEYS if chat[-1].get(k) == final] if key in REASONING_KEYS else [key]
        if not any(k in template for k in keys):
            raise ValueError(f"continue_final_message: the chat template does not use the field {key!r}")
        if isinstance(final, (list, tuple)):
            for block in reversed(final):
                if "text" in block:
                    final, block["text"] = block["text"], block["text"] + _CONTINUE_MARK
                    break
            else:
                raise ValueError("continue_final_message: the final message has no text to continue")
        else:
            for k in keys:
                chat[-1][k] = chat[-1][k] + _CONTINUE_MARK
    text = _compiled(template).render(messages=chat, tools=_plain(list(tools) if tools is not None else None),
                                      documents=_plain(list(documents) if documents is not None else None),
                                      add_generation_prompt=add_generation_prompt, **_plain(variables))
    if final is not None:
        mark = _CONTINUE_MARK.strip()
        if final.strip() not in text or mark not in text:
            raise ValueError("continue_final_message: the chat template dropped part of the final message")
        at = text.rindex(mark)
        text = text[:at] if text[at:at + len(_CONTINUE_MARK)] == _CONTINUE_MARK else text[:at].rstrip()
    return text
