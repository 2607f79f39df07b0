"""``/v1/responses`` (OpenAI's Responses API) through ``max serve`` with the ``openai`` client's
``client.responses.create``, plain and streamed, on a tiny random Llama whose chat template renders
tools the Hermes way."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from lm_support import make_tiny_llama, make_tokenizer
from test_tools import CALL_RE, HERMES_TEMPLATE, SCHEMAS, TIME

TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather in a city",
          "parameters": SCHEMAS["get_weather"]},
         {"type": "function", "name": "get_time", "parameters": TIME}]
GREEDY = dict(temperature=0, extra_body={"ignore_eos": True})


@pytest.fixture(scope="module")
def rserver(tmp_path_factory):
    from max.entrypoints.cli import build_config
    from max.serve.server import ServerThread, build_app

    d = make_tiny_llama(str(tmp_path_factory.mktemp("tiny_responses")), tokenizer=make_tokenizer(
        chat_template=HERMES_TEMPLATE), max_position_embeddings=1024)
    app = build_app(build_config(d, None, "cpu", 1024, 8), served_model_name="tiny", responses_store_size=2)
    with ServerThread(app) as srv:
        srv.state = app.state.serve
        yield srv


@pytest.fixture(scope="module")
def rclient(rserver):
    import openai

    return openai.OpenAI(base_url=rserver.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _chat_text(client, messages, n):
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=n, **GREEDY)
    return r.choices[0].message.content, r.usage


def test_plain_string_input_matches_chat_completions(rclient):
    r = rclient.responses.create(model="tiny", input="Hello there", max_output_tokens=6, **GREEDY)
    text, usage = _chat_text(rclient, [{"role": "user", "content": "Hello there"}], 6)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "tiny"
    assert r.output_text == text and r.output[0].type == "message" and r.output[0].role == "assistant"
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"  # ignore_eos: cut at 6
    assert r.usage.input_tokens == usage.prompt_tokens and r.usage.output_tokens == 6
    assert r.usage.total_tokens == usage.prompt_tokens + 6


def test_instructions_and_input_items(rclient):
    items = [{"role": "developer", "content": "Be brief."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi, "},
                                                             {"type": "input_text", "text": "who are you?"}]}]
    r = rclient.responses.create(model="tiny", instructions="You are a parrot.", input=items, max_output_tokens=5,
                                 **GREEDY)
    text, usage = _chat_text(rclient, [{"role": "system", "content": "You are a parrot."},
                                       {"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": "Hi, who are you?"}], 5)
    assert r.output_text == text and r.usage.input_tokens == usage.prompt_tokens
    assert r.instructions == "You are a parrot."


def test_streamed_events_follow_openais_sequence(rclient):
    plain = rclient.responses.create(model="tiny", input="Count", max_output_tokens=8, **GREEDY)
    events = list(rclient.responses.create(model="tiny", input="Count", max_output_tokens=8, stream=True, **GREEDY))
    kinds = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert kinds[:5] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.output_text.delta"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"} and len(deltas) >= 2
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress"
    done = events[-1].response
    assert "".join(deltas) == plain.output_text == events[-4].text == done.output_text
    assert done.usage.output_tokens == 8 and done.status == "incomplete"
    # the streamed response is stored too
    assert rclient.responses.retrieve(done.id).output_text == plain.output_text


def test_previous_response_id_continues_the_conversation(rclient):
    first = rclient.responses.create(model="tiny", input="My name is Ada.", instructions="Answer shortly.",
                                     max_output_tokens=4, **GREEDY)
    second = rclient.responses.create(model="tiny", input="What is my name?", previous_response_id=first.id,
                                      max_output_tokens=4, **GREEDY)
    # the same conversation as chat messages: the first turn, its answer, the new turn (instructions not carried)
    text, usage = _chat_text(rclient, [{"role": "user", "content": "My name is Ada."},
                                       {"role": "assistant", "content": first.output_text},
                                       {"role": "user", "content": "What is my name?"}], 4)
    assert second.output_text == text and second.usage.input_tokens == usage.prompt_tokens
    assert second.previous_response_id == first.id
    # streamed continuation of a streamed response
    events = list(rclient.responses.create(model="tiny", input="And again?", previous_response_id=second.id,
                                           max_output_tokens=3, stream=True, **GREEDY))
    assert events[-1].response.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens


def test_unknown_previous_response_id_is_a_400(rclient):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        rclient.responses.create(model="tiny", input="x", previous_response_id="resp_nope")
    assert e.value.body["param"] == "previous_response_id"
    assert e.value.body["code"] == "previous_response_not_found"


def test_store_false_and_retrieve_delete(rclient, rserver):
    import openai

    r = rclient.responses.create(model="tiny", input="x", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        rclient.responses.retrieve(r.id)
    kept = rclient.responses.create(model="tiny", input="x", max_output_tokens=2)
    assert rclient.responses.retrieve(kept.id).id == kept.id
    rclient.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        rclient.responses.retrieve(kept.id)


def test_store_is_bounded_lru(rclient, rserver):
    assert rserver.state.responses.max_entries == 2  # build_app(responses_store_size=2)
    ids = [rclient.responses.create(model="tiny", input=f"q{i}", max_output_tokens=1).id for i in range(3)]
    assert len(rserver.state.responses) == 2
    r = httpx.post(rserver.url + "/v1/responses", json={"model": "tiny", "input": "x",
                                                        "previous_response_id": ids[0]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "previous_response_not_found"
    rclient.responses.retrieve(ids[1])  # a use: ids[1] becomes the most recent
    rclient.responses.create(model="tiny", input="q3", max_output_tokens=1)
    rclient.responses.retrieve(ids[1])
    assert httpx.get(rserver.url + f"/v1/responses/{ids[2]}").status_code == 404  # the least recent went


def test_store_bounds_entries_and_bytes():
    from max.serve.response_store import ResponseStore, StoredResponse

    s = ResponseStore(0)
    s.put("a", StoredResponse([], {}))
    assert len(s) == 0 and s.get("a") is None
    with pytest.raises(ValueError):
        ResponseStore(-1)

    def entry(n):
        return StoredResponse([{"role": "user", "content": "x" * n}], {"id": "r"})

    size = entry(1000).nbytes
    s = ResponseStore(10, max_bytes=3 * size)
    for k in "abcd":
        s.put(k, entry(1000))
    assert len(s) == 3 and s.get("a") is None and s.nbytes == 3 * size  # the oldest went for the bytes
    s.put("big", entry(10 * size))  # bigger than the whole store: not kept, nothing else dropped
    assert s.get("big") is None and len(s) == 3
    s.put("b", entry(1000))  # replacing an entry counts it once
    assert s.nbytes == 3 * size and s.delete("b") and s.nbytes == 2 * size and not s.delete("b")


def _check_call(item, names):
    assert item.type == "function_call" and item.call_id.startswith("call_") and item.name in names
    jsonschema.validate(json.loads(item.arguments), SCHEMAS[item.name])


def test_named_and_required_tool_choice_give_function_call_items(rclient):
    r = rclient.responses.create(model="tiny", input="Weather in Paris?", tools=TOOLS, max_output_tokens=200,
                                 temperature=1.0, tool_choice={"type": "function", "name": "get_time"})
    assert [o.type for o in r.output] == ["function_call"] and r.status == "completed"
    _check_call(r.output[0], {"get_time"})
    r = rclient.responses.create(model="tiny", input="Weather in Paris?", tools=TOOLS, max_output_tokens=300,
                                 temperature=0.8, tool_choice="required")
    assert r.output and all(o.type == "function_call" for o in r.output)
    for o in r.output:
        _check_call(o, {"get_weather", "get_time"})


def test_auto_tool_calls_plain_and_streamed_and_the_result_round_trip(rclient):
    kw = dict(model="tiny", input="Weather in Paris?", tools=TOOLS, max_output_tokens=100, temperature=0.7,
              extra_body={"guided_regex": CALL_RE, "seed": 2})
    r = rclient.responses.create(**kw)
    assert [o.type for o in r.output] == ["message", "function_call"]
    assert r.output[0].content[0].text == "Sure. "
    _check_call(r.output[1], {"get_weather"})
    events = list(rclient.responses.create(**kw, stream=True))
    kinds = [e.type for e in events]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Sure. "
    i = kinds.index("response.function_call_arguments.done")
    assert kinds[i - 2:i + 2] == ["response.output_item.added", "response.function_call_arguments.delta",
                                  "response.function_call_arguments.done", "response.output_item.done"]
    assert json.loads(events[i].arguments) == json.loads(r.output[1].arguments)
    final = events[-1].response
    assert [o.type for o in final.output] == ["message", "function_call"]
    # the client runs the tool and sends its result after the stored call
    call = r.output[1]
    follow = rclient.responses.create(model="tiny", previous_response_id=r.id, tools=TOOLS, max_output_tokens=2,
                                      input=[{"type": "function_call_output", "call_id": call.call_id,
                                              "output": "18 degrees"}])
    short = rclient.responses.create(model="tiny", input="Weather in Paris?", tools=TOOLS, max_output_tokens=1)
    assert follow.usage.input_tokens > short.usage.input_tokens + 15  # call + result rendered


def test_json_schema_text_format(rclient):
    """The schema bounds the integer, so the random model's output always closes well within the token limit
    (an unbounded integer let it sample digits until max_output_tokens cut the JSON short -- on some CPUs)."""
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999}},
              "required": ["a"], "additionalProperties": False}
    r = rclient.responses.create(model="tiny", input="json please", max_output_tokens=200, temperature=1.0,
                                 text={"format": {"type": "json_schema", "name": "obj", "schema": schema}})
    assert r.status == "completed", r.incomplete_details
    jsonschema.validate(json.loads(r.output_text), schema)


@pytest.mark.parametrize("body,param", [
    ({}, "input"),
    ({"input": []}, "input"),
    ({"input": 5}, "input"),
    ({"input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "input[0].content[0].type"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "temperature": 3}, "temperature"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"input": "x", "tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format"),
    ({"input": "x", "tools": TOOLS, "tool_choice": "required", "text": {"format": {"type": "json_object"}}},
     "text.format"),
])
def test_bad_requests_are_openai_shaped_400s(rserver, body, param):
    r = httpx.post(rserver.url + "/v1/responses", json={"model": "tiny", **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]


def test_unknown_model_and_response_ids_are_404(rserver):
    r = httpx.post(rserver.url + "/v1/responses", json={"model": "other", "input": "x"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    for method in ("GET", "DELETE"):
        r = httpx.request(method, rserver.url + "/v1/responses/resp_missing")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
