"""Server defaults an OpenAI / vLLM user expects: no ``top_k`` (or vLLM's ``-1``, or ``0``) samples
from the whole vocabulary (the Python ``SamplingParams`` default stays the reference's top 255)."""

from __future__ import annotations

import pytest

from max.serve.jobs import sampling_params
from max.serve.openai_schemas import ChatCompletionRequest

MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("extra,want", [({}, 0), ({"top_k": -1}, 0), ({"top_k": 0}, 0), ({"top_k": 40}, 40),
                                        ({"top_k": 1}, 1)])
def test_http_top_k_default_is_the_whole_vocabulary(extra, want):
    req = ChatCompletionRequest(messages=MSG, **extra)
    params = sampling_params(req, None, 1)
    assert params.top_k == want
    assert params.top_k_for(32000) == (32000 if want == 0 else want)
