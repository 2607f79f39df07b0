"""Structured output through ``max serve`` with the ``openai`` client: ``response_format`` json_object /
json_schema and the vLLM-style regex / choice / grammar extensions; constrained and free requests share
a batch; bad constraints are 400s that leave the server and its running batch alone."""

from __future__ import annotations

import json
import re
import threading
import time

import httpx
import jsonschema
import pytest

from serve_support import wait_idle

MSG = [{"role": "user", "content": "Describe a user"}]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "admin": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["red", "green", "blue"]}, "maxItems": 3},
        "address": {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["zip"], "additionalProperties": False},
    },
    "required": ["name", "age", "admin", "tags", "address"],
    "additionalProperties": False,
}
RF = {"type": "json_schema", "json_schema": {"name": "user", "schema": SCHEMA, "strict": True}}


def test_json_schema_output_parses_and_validates(client):
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=200, temperature=1.0, seed=11, n=4,
                                       response_format=RF)
    assert len(r.choices) == 4
    for ch in r.choices:
        assert ch.finish_reason == "stop", ch
        jsonschema.validate(json.loads(ch.message.content), SCHEMA)
    greedy = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=200, temperature=0,
                                            response_format=RF)
    jsonschema.validate(json.loads(greedy.choices[0].message.content), SCHEMA)


def test_json_schema_streamed_and_through_completions(client):
    chunks = list(client.chat.completions.create(model="tiny", messages=MSG, max_tokens=200, temperature=0.8,
                                                 seed=5, stream=True, response_format=RF))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), SCHEMA)
    r = client.completions.create(model="tiny", prompt="user = ", max_tokens=200, temperature=0.7, seed=2,
                                  extra_body={"response_format": RF})
    jsonschema.validate(json.loads(r.choices[0].text), SCHEMA)


def test_json_object_with_logit_bias(server, client):
    """Any JSON object; a bias towards '"' and '}' lets the random model close strings and objects soon."""
    tok = server.engine.tokenizer.delegate
    bias = {str(tok.convert_tokens_to_ids(t)): 6 for t in ('"', "}")}
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=200, temperature=0.7, seed=3, n=3,
                                       response_format={"type": "json_object"}, logit_bias=bias)
    for ch in r.choices:
        assert ch.finish_reason == "stop"
        assert isinstance(json.loads(ch.message.content), dict)


@pytest.mark.parametrize("extra,check", [
    ({"guided_regex": r"[0-9]{3}-[a-z]{4}"}, lambda s: re.fullmatch(r"[0-9]{3}-[a-z]{4}", s)),
    ({"structured_outputs": {"regex": r"(yes|no), because [a-z]{2,6}\."}},
     lambda s: re.fullmatch(r"(yes|no), because [a-z]{2,6}\.", s)),
    ({"guided_choice": ["alpha", "beta", "gamma"]}, lambda s: s in ("alpha", "beta", "gamma")),
    ({"structured_outputs": {"choice": ["left", "right"]}}, lambda s: s in ("left", "right")),
    ({"guided_grammar": 'root ::= "(" num ("+" num)* ")"\nnum ::= [1-9] [0-9]?'},
     lambda s: re.fullmatch(r"\([1-9][0-9]?(\+[1-9][0-9]?)*\)", s)),
    ({"guided_json": json.dumps({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                                 "minItems": 2, "maxItems": 4})},
     lambda s: 2 <= len(json.loads(s)) <= 4),
])
def test_regex_choice_grammar_extensions(client, extra, check):
    for seed in (1, 2):
        r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=60, temperature=1.0, seed=seed,
                                           extra_body=extra)
        text = r.choices[0].message.content
        assert r.choices[0].finish_reason == "stop" and check(text), (extra, text)


def _paused_batch(server, bodies):
    """Post ``bodies`` concurrently while the scheduler is paused, so they are admitted into one step."""
    sched = server.engine.scheduler
    results: dict[int, httpx.Response] = {}

    def post(i, body):
        results[i] = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)

    threads = [threading.Thread(target=post, args=(i, b)) for i, b in enumerate(bodies)]
    with sched._step_lock:
        for t in threads:
            t.start()
        t0 = time.monotonic()
        while sched.queue_depth < len(bodies):
            assert time.monotonic() - t0 < 20, "requests did not reach the queue"
            time.sleep(0.01)
    for t in threads:
        t.join()
    return [results[i] for i in range(len(bodies))]


def test_constrained_and_free_requests_share_a_batch(server, client):
    free = {"model": "tiny", "messages": MSG, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    alone = client.chat.completions.create(**{k: v for k, v in free.items() if k != "ignore_eos"},
                                           extra_body={"ignore_eos": True}).choices[0].message.content
    batch_before = server.state.metrics.batch._sum.get()
    constrained = {"model": "tiny", "messages": MSG, "max_tokens": 200, "temperature": 0.9, "seed": 4,
                   "response_format": RF}
    rs = _paused_batch(server, [free, constrained, free, constrained])
    assert server.state.metrics.batch._sum.get() - batch_before >= 4  # the first step ran all four
    for i, r in enumerate(rs):
        assert r.status_code == 200, r.text
        content = r.json()["choices"][0]["message"]["content"]
        if i % 2 == 0:
            assert content == alone  # the masks of other rows never touch a free request
        else:
            jsonschema.validate(json.loads(content), SCHEMA)
    wait_idle(server)


@pytest.mark.parametrize("body,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wizard"}}}},
     "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}}},
     "response_format.json_schema"),
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_grammar": "root ::= missing_rule"}, "guided_grammar"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
])
def test_bad_constraints_are_400_naming_the_field(server, body, param):
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": "tiny", "messages": MSG, **body}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]
    assert "\n" not in err["message"] and "^" not in err["message"]  # one line, no source excerpt


@pytest.mark.parametrize("field,value,needle", [
    ("guided_regex", "[a-", 'invalid regex "[a-": unclosed character class'),
    ("guided_regex", "a(b", "unclosed group"),
    ("guided_grammar", "start: foo", 'unknown name: "foo"'),
])
def test_constraint_compile_errors_are_one_clear_line(server, field, value, needle):
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": "tiny", "messages": MSG, field: value},
                   timeout=30)
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    assert needle in msg and "\n" not in msg, msg


def test_bad_schema_leaves_a_running_stream_unaffected(server, client):
    kw = dict(model="tiny", messages=MSG, max_tokens=40, temperature=0)
    alone = client.chat.completions.create(**kw, extra_body={"ignore_eos": True}).choices[0].message.content
    pieces = []
    stream = client.chat.completions.create(**kw, stream=True, extra_body={"ignore_eos": True})
    for i, c in enumerate(stream):
        if c.choices:
            pieces.append(c.choices[0].delta.content or "")
        if i == 3:
            bad = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
                "model": "tiny", "messages": MSG, "response_format": {
                    "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
                        "a": {"type": "string", "pattern": "(("}}}}}})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "response_format.json_schema"
    assert "".join(pieces) == alone
    wait_idle(server)
