"""The per-family tool-call parsers of ``max.serve.tools`` on whole outputs and streamed in pieces."""

from __future__ import annotations

import json
import random

import pytest

from max.serve.tools import ToolStream, make_parser

CASES = [
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call><|im_end|>',
     "Let me check.\n", [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]),
    ("hermes", '<tool_call>{"name": "f", "arguments": {}}', None, [("f", {})]),  # unclosed last call
    ("llama3_json", '<|python_tag|>{"name": "search", "parameters": {"q": "llamas"}}; '
                    '{"name": "calc", "parameters": {"x": 2}}<|eot_id|>',
     None, [("search", {"q": "llamas"}), ("calc", {"x": 2})]),
    ("llama3_json", ' {"name": "search", "parameters": {"q": "a;b"}}', None, [("search", {"q": "a;b"})]),
    ("mistral", 'Sure.[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}, '
                '{"name": "neg", "arguments": {"a": 3}}]</s>',
     "Sure.", [("add", {"a": 1, "b": 2}), ("neg", {"a": 3})]),
    ("mistral", '[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}[TOOL_CALLS]neg[ARGS]{"a": 3}', None,
     [("add", {"a": 1, "b": 2}), ("neg", {"a": 3})]),
]
SPECIALS = ("<|im_end|>", "<|eot_id|>", "</s>", "<|python_tag|>", "[TOOL_CALLS]")


def _calls(calls):
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize("family,text,content,calls", CASES)
def test_whole_output(family, text, content, calls):
    stream = ToolStream(make_parser(family), SPECIALS)
    a, ca = stream.feed(text)
    b, cb = stream.finish()
    got = a + b
    assert (got if got.strip() else None) == content
    assert _calls(ca + cb) == calls
    assert len({c.id for c in ca + cb}) == len(calls)


@pytest.mark.parametrize("family,text,content,calls", CASES)
def test_streamed_in_random_pieces_gives_the_same(family, text, content, calls):
    rng = random.Random(0)
    for _ in range(20):
        stream = ToolStream(make_parser(family), SPECIALS)
        out, got = "", []
        i = 0
        while i < len(text):
            k = rng.randint(1, 7)
            d, c = stream.feed(text[i:i + k])
            out, got = out + d, got + c
            i += k
        d, c = stream.finish()
        out, got = out + d, got + c
        assert (out if out.strip() else None) == content and _calls(got) == calls


@pytest.mark.parametrize("family,text", [
    ("hermes", "no tools here, just <tool text"),
    ("hermes", "<tool_call>{not json}</tool_call>"),
    ("llama3_json", "The answer is {42}."),
    ("llama3_json", '{"no_name": 1}'),
    ("mistral", "[TOOL_CALLS] not json"),
])
def test_text_that_is_not_a_call_stays_content(family, text):
    parser = make_parser(family)
    content, calls = parser.parse(text)
    assert calls == [] and content == text
    stream = ToolStream(parser, ())
    a, c1 = stream.feed(text)
    b, c2 = stream.finish()
    assert c1 + c2 == [] and a + b == text


def test_unknown_parser():
    with pytest.raises(ValueError, match="hermes"):
        make_parser("nope")
