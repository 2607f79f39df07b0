"""Typed request errors (max.interfaces.errors): raised where the check is made, carrying the field,
a code and the client-facing detail; still ValueError/TypeError for callers that catch those."""

from __future__ import annotations

import asyncio

import pytest

from max.interfaces import SamplingParams, TextGenerationRequest
from max.interfaces.errors import EmptyPrompt, InvalidRequest, InvalidRequestType, PromptTooLong


def test_sampling_params_errors_name_their_field():
    with pytest.raises(InvalidRequest) as ei:
        SamplingParams(top_p=1.5)
    e = ei.value
    assert isinstance(e, ValueError) and e.param == "top_p" and e.code == "invalid_value"
    assert e.detail == "top_p must be in (0, 1], got 1.5" and str(e) == "SamplingParams: " + e.detail
    with pytest.raises(InvalidRequestType) as ei:
        SamplingParams(max_new_tokens="8")
    assert isinstance(ei.value, TypeError) and ei.value.param == "max_new_tokens"


def test_request_errors_name_their_field():
    with pytest.raises(InvalidRequest) as ei:
        TextGenerationRequest(request_id="r", model_name="m", messages=[{"role": "robot", "content": "x"}])
    assert ei.value.param == "messages" and ei.value.detail.startswith("messages[0].role must be one of")
    with pytest.raises(InvalidRequest) as ei:
        TextGenerationRequest(request_id="r", model_name="m", prompt="x", response_format={"type": 3})
    assert ei.value.param == "response_format"


def test_tokenizer_raises_prompt_too_long_and_empty_prompt(tmp_path):
    from lm_support import make_tiny_llama  # the suite's tiny local model and tokenizer

    from max.pipelines.lib.tokenizer import TextTokenizer

    path = make_tiny_llama(str(tmp_path / "m"))
    tok = TextTokenizer(str(path), max_length=8)
    with pytest.raises(PromptTooLong) as ei:
        tok.encode_sync(list(range(20)))
    assert ei.value.length == 20 and ei.value.limit == 8 and ei.value.code == "context_length_exceeded"
    req = TextGenerationRequest(request_id="r1", model_name="m", prompt="")
    with pytest.raises(EmptyPrompt) as ei:
        asyncio.run(tok.new_context(req))
    assert ei.value.param == "prompt" and "r1" not in ei.value.detail and "request r1" in str(ei.value)
