"""Reasoning parsers: ``<think>...</think>`` split into ``reasoning_content`` and ``content``, the same
whichever way the answer is cut into streamed deltas."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from max.serve.reasoning import ReasoningStream, check_reasoning_parser, split_reasoning


@pytest.mark.parametrize("parser,constrained,text,want", [
    ("qwen3", False, "<think>\nhmm, 2+2</think>\n\nIt is 4.", ("\nhmm, 2+2", "It is 4.")),
    ("qwen3", False, "<think>r</think> \n\n  The answer.\n", ("r", "The answer.\n")),  # no leading spaces
    ("qwen3", False, "<think>r</think>\n\n", ("r", None)),
    ("deepseek_r1", False, "r</think>\n\nThe answer.", ("r", "The answer.")),
    ("qwen3", False, "pre <think>a</think> b", ("a", "pre b")),
    ("qwen3", False, "It is 4.", (None, "It is 4.")),
    ("qwen3", False, "pre<think>a</think>b", ("a", "preb")),
    ("qwen3", False, "<think>cut off by max_tokens", ("cut off by max_tokens", None)),
    ("qwen3", False, "a < b and </think> alone", (None, "a < b and </think> alone")),
    ("deepseek_r1", False, "step 1, step 2</think>The answer.", ("step 1, step 2", "The answer.")),
    ("deepseek_r1", False, "<think>step 1</think>The answer.", ("step 1", "The answer.")),
    ("deepseek_r1", False, "\n<think>x</think>y", ("x", "y")),
    ("deepseek_r1", False, "never closed", ("never closed", None)),
    ("deepseek_r1", True, '{"a": 1}', (None, '{"a": 1}')),  # a constrained answer: no implicit <think>
    ("deepseek_r1", True, "<think>r</think>{}", ("r", "{}")),
    ("qwen3", False, "<think></think>only content", (None, "only content")),
])
def test_split(parser, constrained, text, want):
    assert split_reasoning(parser, text, constrained) == want


_PIECES = st.sampled_from(["<think>", "</think>", "<", "</", "<th", "think>", ">", "a", " b", "\n", "é", "<t"])


@given(parser=st.sampled_from(["qwen3", "deepseek_r1"]), constrained=st.booleans(),
       parts=st.lists(_PIECES, max_size=12), cuts=st.lists(st.integers(0, 80), max_size=6))
def test_streamed_deltas_add_up_to_the_full_split(parser, constrained, parts, cuts):
    text = "".join(parts)
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    s = ReasoningStream(parser, constrained)
    r, c = "", ""
    for a, b in zip(bounds, bounds[1:]):
        dr, dc = s.feed(text[a:b])
        r, c = r + dr, c + dc
    dr, dc = s.finish()
    r, c = r + dr, c + dc
    whole = split_reasoning(parser, text, constrained)
    assert (r or None, c or None) == whole
    # nothing is lost but the tags themselves
    assert len(r) + len(c) <= len(text)


def test_unknown_parser_is_a_clear_error():
    with pytest.raises(ValueError, match="deepseek_r1, qwen3"):
        check_reasoning_parser("granite")
