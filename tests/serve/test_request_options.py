"""``suffix`` (fill-in-the-middle), ``best_of``, and ``n`` / ``seed`` / ``logit_bias`` together with a
structured-output constraint, through the ``openai`` client."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import pytest

from max.serve.openai_schemas import APIError
from max.serve.routes.completions import _fim_prompt


def test_suffix_without_fim_tokens_is_a_clear_400(server):
    r = httpx.post(server.url + "/v1/completions", timeout=30,
                   json={"model": "tiny", "prompt": "def f(", "suffix": "\n    return x", "max_tokens": 4})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "suffix" and "fill-in-the-middle" in err["message"]


def test_suffix_builds_a_fim_prompt_when_the_vocabulary_has_fim_tokens():
    for pre, suf, mid in (("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
                          ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")):
        delegate = SimpleNamespace(get_vocab=lambda pre=pre, suf=suf, mid=mid: {pre: 1, suf: 2, mid: 3, "a": 4})
        gen = SimpleNamespace(tokenizer=SimpleNamespace(delegate=delegate))
        assert _fim_prompt(gen, "def f(", "):\n") == f"{pre}def f({suf}):\n{mid}"
    with pytest.raises(APIError):
        _fim_prompt(SimpleNamespace(tokenizer=SimpleNamespace(delegate=SimpleNamespace(get_vocab=dict))), "x", "y")


def test_best_of_returns_the_most_likely_candidates(client):
    kw = dict(model="tiny", prompt="import os", max_tokens=6, temperature=1.0, seed=21, logprobs=1,
              extra_body={"ignore_eos": True})
    best = client.completions.create(n=2, best_of=4, **kw)
    assert [c.index for c in best.choices] == [0, 1]
    assert best.usage.completion_tokens == 4 * 6  # every candidate was generated
    every = client.completions.create(n=4, **kw)  # the same four candidates (seeds 21..24)
    ranked = sorted(every.choices, key=lambda c: -sum(c.logprobs.token_logprobs))
    assert [c.text for c in best.choices] == [c.text for c in ranked[:2]]
    r = httpx.post(str(client.base_url) + "completions", timeout=30,
                   json={"model": "tiny", "prompt": "x", "n": 3, "best_of": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "best_of"


def test_n_seed_and_logit_bias_with_a_json_schema(server, client):
    schema = {"type": "object", "properties": {"k": {"enum": ["x", "y", "z"]}, "v": {"type": "integer",
                                                                                    "minimum": 0, "maximum": 50}},
              "required": ["k", "v"], "additionalProperties": False}
    kw = dict(model="tiny", messages=[{"role": "user", "content": "go"}], max_tokens=60, temperature=1.0, seed=8,
              n=3, response_format={"type": "json_schema", "json_schema": {"name": "kv", "schema": schema}})
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]  # seeded
    for c in a.choices:
        assert json.loads(c.message.content)["k"] in ("x", "y", "z")
    z = server.engine.tokenizer.delegate.convert_tokens_to_ids("z")
    biased = client.chat.completions.create(**kw, logit_bias={str(z): 100})  # the grammar allows z: it wins
    assert [json.loads(c.message.content)["k"] for c in biased.choices] == ["z", "z", "z"]
