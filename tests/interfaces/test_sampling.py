"""SamplingParams / SamplingParamsInput: documented defaults, validation, from_input."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from max.interfaces import SamplingParams, SamplingParamsInput

FIELD_ORDER = [
    "top_k",
    "top_p",
    "min_p",
    "temperature",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "max_new_tokens",
    "min_new_tokens",
    "ignore_eos",
    "stop",
    "stop_token_ids",
    "detokenize",
    "seed",
    "logits_processors",
    "logit_bias",  # extension (OpenAI / vLLM), after the documented fields
]


def test_logit_bias():
    assert SamplingParams(logit_bias={"12": 5, 3: -100.0}).logit_bias == {12: 5.0, 3: -100.0}  # JSON keys too
    for bad, exc in (({5: 100.5}, ValueError), ({-1: 1.0}, ValueError), ({"x": 1}, TypeError), ([1], TypeError),
                     ({5: "1"}, TypeError)):
        with pytest.raises(exc, match="logit_bias"):
            SamplingParams(logit_bias=bad)


def test_documented_defaults():
    sp = SamplingParams()
    assert sp.top_k == -1 and sp.effective_top_k == 255
    assert sp.top_p == 1 and sp.min_p == 0.0 and sp.temperature == 1
    assert sp.frequency_penalty == 0.0 and sp.presence_penalty == 0.0 and sp.repetition_penalty == 1.0
    assert sp.max_new_tokens is None and sp.min_new_tokens == 0
    assert sp.ignore_eos is False and sp.stop is None and sp.stop_token_ids is None
    assert sp.detokenize is True and sp.logits_processors is None
    assert isinstance(sp.seed, int) and 0 <= sp.seed < 2**32
    assert not sp.is_greedy


def test_field_order_matches_signature():
    assert [f.name for f in dataclasses.fields(SamplingParams)] == FIELD_ORDER
    assert [f.name for f in dataclasses.fields(SamplingParamsInput)] == FIELD_ORDER
    assert SamplingParams(5).top_k == 5  # positional in documented order
    assert SamplingParams(5, 0.5).top_p == 0.5


def test_seed_is_random_per_instance():
    assert len({SamplingParams().seed for _ in range(20)}) > 1
    assert SamplingParams(seed=7).seed == 7


def test_greedy():
    assert SamplingParams(temperature=0).is_greedy
    assert SamplingParams(top_k=1).is_greedy


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", -0.1),
        ("temperature", float("inf")),
        ("temperature", float("nan")),
        ("top_p", 0.0),
        ("top_p", -0.5),
        ("top_p", 1.01),
        ("top_k", -2),
        ("min_p", -0.01),
        ("min_p", 1.5),
        ("frequency_penalty", 2.5),
        ("presence_penalty", -2.5),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", -1.0),
        ("max_new_tokens", -1),
        ("max_new_tokens", 0),
        ("seed", -1),
        ("seed", 2**63),
        ("seed", 2**70),
        ("min_new_tokens", -1),
        ("stop_token_ids", [-1]),
        ("stop", [""]),
    ],
)
def test_invalid_values_raise_value_error_naming_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


@pytest.mark.parametrize(
    "field, value",
    [
        ("top_k", 1.5),
        ("top_k", True),
        ("temperature", "hot"),
        ("max_new_tokens", 2.0),
        ("ignore_eos", 1),
        ("detokenize", None),
        ("stop", [1, 2]),
        ("stop_token_ids", "12"),
        ("seed", 1.0),
        ("logits_processors", [1]),
    ],
)
def test_wrong_types_raise_type_error_naming_field(field, value):
    with pytest.raises(TypeError, match=field):
        SamplingParams(**{field: value})


def test_min_greater_than_max_new_tokens():
    with pytest.raises(ValueError, match="min_new_tokens"):
        SamplingParams(max_new_tokens=3, min_new_tokens=4)
    SamplingParams(max_new_tokens=3, min_new_tokens=3)


def test_boundaries_and_normalisation():
    sp = SamplingParams(top_p=1.0, min_p=1.0, temperature=0.0, frequency_penalty=-2, presence_penalty=2, top_k=0)
    assert sp.top_k == 0 and sp.effective_top_k is None and sp.top_k_for(1000) == 1000  # 0: no limit
    assert SamplingParams().top_k == -1 and SamplingParams().top_k_for(1000) == 255  # the reference's default
    assert SamplingParams(top_k=7).top_k_for(5) == 5
    assert SamplingParams(stop="END").stop == ["END"]
    assert SamplingParams(stop_token_ids=(1, 2)).stop_token_ids == [1, 2]
    assert SamplingParams(max_new_tokens=1).max_new_tokens == 1
    assert SamplingParams(seed=0).seed == 0 and SamplingParams(seed=2**63 - 1).seed == 2**63 - 1
    assert isinstance(SamplingParams(temperature=1).temperature, float)


def test_from_input_uses_defaults_for_none():
    sp = SamplingParams.from_input(SamplingParamsInput(top_k=4, temperature=0.5, seed=11))
    assert (sp.top_k, sp.temperature, sp.seed) == (4, 0.5, 11)
    assert sp.top_p == 1 and sp.max_new_tokens is None and sp.detokenize is True
    full = SamplingParams.from_input(SamplingParamsInput())
    assert full.top_k == -1 and full.repetition_penalty == 1.0
    assert all(getattr(SamplingParamsInput(), f) is None for f in FIELD_ORDER)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams.from_input(SamplingParamsInput(top_p=2.0))
    with pytest.raises(TypeError):
        SamplingParams.from_input({"top_k": 3})


def test_logits_processors_and_logging(caplog):
    calls = []
    sp = SamplingParams(logits_processors=[lambda inputs: calls.append(inputs)])
    sp.logits_processors[0]("x")
    assert calls == ["x"]
    with caplog.at_level(logging.INFO, logger="max.interfaces"):
        sp.log_sampling_info()
        SamplingParams(temperature=0).log_sampling_info()
    assert "Temperature" in caplog.text and "greedy" in caplog.text
