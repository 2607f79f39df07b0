"""Reasoning parsers (``max serve --reasoning-parser``): the ``<think>...</think>`` part of a chat answer
goes to the message's ``reasoning_content``, the rest stays ``content`` (streamed deltas likewise carry
``reasoning_content`` or ``content``), as vLLM's parsers of the same names do.

* ``deepseek_r1``: the answer starts inside the reasoning (DeepSeek-R1's template opens ``<think>`` in
  the prompt), so everything up to ``</think>`` is reasoning; a ``<think>`` the model writes itself at
  the start is dropped.  An answer that never closes it is all reasoning.
* ``qwen3``: reasoning only between ``<think>`` and ``</think>`` written by the model (Qwen3 with
  ``enable_thinking=False`` writes none: then all is content).  An unterminated ``<think>`` (cut off
  by ``max_tokens``) leaves what follows it as reasoning, in the full answer as in the stream.

The whitespace a model writes between ``</think>`` and its answer belongs to neither part: ``content``
starts at the answer's first visible character (in the stream too).

A constrained answer (``response_format`` / ``guided_*``) is parsed the ``qwen3`` way under either
parser: its grammar starts at the first token, so there is reasoning only if the grammar itself writes
the tags.
"""

from __future__ import annotations

from typing import Optional

REASONING_PARSERS = ("deepseek_r1", "qwen3")

THINK_START = "<think>"
THINK_END = "</think>"


def check_reasoning_parser(name: Optional[str]) -> Optional[str]:
    """``name`` when it is a known parser (or None); ValueError naming the choices otherwise."""
    if name is not None and name not in REASONING_PARSERS:
        raise ValueError(f"unknown reasoning parser {name!r}; choose one of {', '.join(REASONING_PARSERS)}")
    return name


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that is a proper beginning of ``tag`` (kept back while
    streaming: the rest of the tag may come in the next delta)."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningStream:
    """Splits an answer, fed delta by delta, into reasoning and content (see the module docstring).

    :meth:`feed` returns the ``(reasoning, content)`` text that is certain so far; text that may be
    the beginning of a tag is held back until the next delta or :meth:`finish`."""

    def __init__(self, parser: str, constrained: bool = False) -> None:
        check_reasoning_parser(parser)
        opens_in_prompt = parser == "deepseek_r1" and not constrained
        self.state = "reasoning" if opens_in_prompt else "before"
        self._drop_open = opens_in_prompt  # a <think> the model repeats at the start
        self.buf = ""
        self._after_end = False

    def feed(self, delta: str) -> tuple[str, str]:
        self.buf += delta
        reasoning, content = [], []
        while self.buf:
            if self.state == "before":
                i = self.buf.find(THINK_START)
                if i >= 0:
                    content.append(self.buf[:i])
                    self.buf, self.state = self.buf[i + len(THINK_START):], "reasoning"
                    continue
                keep = _partial_suffix(self.buf, THINK_START)
                content.append(self.buf[:len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep:]
                break
            if self.state == "reasoning":
                if self._drop_open:
                    lead = self.buf.lstrip()
                    if THINK_START.startswith(lead) and len(lead) < len(THINK_START):
                        break  # maybe the start of <think>: wait
                    self._drop_open = False
                    if lead.startswith(THINK_START):
                        self.buf = lead[len(THINK_START):]
                        continue
                i = self.buf.find(THINK_END)
                if i >= 0:
                    reasoning.append(self.buf[:i])
                    self.buf, self.state = self.buf[i + len(THINK_END):], "after"
                    self._after_end = True
                    continue
                keep = _partial_suffix(self.buf, THINK_END)
                reasoning.append(self.buf[:len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep:]
                break
            if self._after_end:  # the whitespace between </think> and the answer is not content
                self.buf = self.buf.lstrip()
                if not self.buf:
                    break
                self._after_end = False
            content.append(self.buf)
            self.buf = ""
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        """What was held back, as ``(reasoning, content)``, once the answer is complete."""
        rest, self.buf = self.buf, ""
        if self.state == "after" and self._after_end:
            rest = rest.lstrip()
        return (rest, "") if self.state == "reasoning" else ("", rest)


def split_reasoning(parser: str, text: str, constrained: bool = False) -> tuple[Optional[str], Optional[str]]:
    """``(reasoning_content, content)`` of a complete answer; an empty part is None."""
    s = ReasoningStream(parser, constrained)
    r1, c1 = s.feed(text)
    r2, c2 = s.finish()
    return (r1 + r2) or None, (c1 + c2) or None
