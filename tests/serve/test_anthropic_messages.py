"""``POST /v1/messages`` (Anthropic's Messages API) with the official ``anthropic`` client (sampling fields
go in ``extra_body``: recent clients dropped ``temperature`` / ``top_k`` arguments), on a tiny random
Llama whose chat template renders tools the Hermes way.  Answers are checked against the same
conversation sent through ``/v1/chat/completions`` (greedy: the same prompt must give the same text)."""

from __future__ import annotations

import json

import httpx
import pytest

from lm_support import make_tiny_llama, make_tokenizer
from test_tools import CALL_RE, HERMES_TEMPLATE, WEATHER

anthropic = pytest.importorskip("anthropic")
KEY = "sekrit"
TOOLS = [{"name": "get_weather", "description": "Weather in a city", "input_schema": WEATHER}]
MSG = [{"role": "user", "content": "What is the weather in Paris?"}]
T0 = {"temperature": 0}  # greedy


@pytest.fixture(scope="module")
def aserver(tmp_path_factory):
    from max.entrypoints.cli import build_config
    from max.serve.server import ServerThread, build_app

    d = make_tiny_llama(str(tmp_path_factory.mktemp("tiny_anthropic")), tokenizer=make_tokenizer(
        chat_template=HERMES_TEMPLATE), max_position_embeddings=1024)
    app = build_app(build_config(d, None, "cpu", 1024, 8), served_model_name="tiny", api_key=KEY)
    with ServerThread(app) as srv:
        yield srv


@pytest.fixture(scope="module")
def ac(aserver):
    return anthropic.Anthropic(base_url=aserver.url, api_key=KEY, max_retries=0, timeout=60)  # sends x-api-key


@pytest.fixture(scope="module")
def oc(aserver):
    import openai

    return openai.OpenAI(base_url=aserver.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def _text(msg) -> str:
    return "".join(b.text for b in msg.content if b.type == "text")


def test_plain_message_matches_chat_completions(ac, oc):
    r = ac.messages.create(model="tiny", max_tokens=12, system="You are terse.", messages=MSG, extra_body=T0)
    assert r.type == "message" and r.role == "assistant" and r.model == "tiny" and r.id.startswith("msg_")
    assert r.stop_reason == "max_tokens" and r.stop_sequence is None
    o = oc.chat.completions.create(model="tiny", max_tokens=12, temperature=0,
                                   messages=[{"role": "system", "content": "You are terse."}, *MSG])
    assert _text(r) == o.choices[0].message.content and _text(r)
    assert r.usage.output_tokens == o.usage.completion_tokens == 12
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == o.usage.prompt_tokens
    # system as blocks, content as blocks: the same prompt
    r2 = ac.messages.create(model="tiny", max_tokens=12, extra_body=T0,
                            system=[{"type": "text", "text": "You are terse."}],
                            messages=[{"role": "user", "content": [{"type": "text", "text": MSG[0]["content"]}]}])
    assert _text(r2) == _text(r)
    # top_k=1 at temperature 1 is greedy
    r3 = ac.messages.create(model="tiny", max_tokens=12, system="You are terse.", messages=MSG,
                            extra_body={"temperature": 1.0, "top_k": 1})
    assert _text(r3) == _text(r)


def test_stop_sequences(ac):
    full = _text(ac.messages.create(model="tiny", max_tokens=24, messages=MSG, extra_body=T0))
    stop = full[len(full) // 2:len(full) // 2 + 3]
    assert stop.strip()
    r = ac.messages.create(model="tiny", max_tokens=24, messages=MSG, extra_body=T0, stop_sequences=["@@@", stop])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop
    assert _text(r) == full[:full.index(stop)]
    chunks = []
    with ac.messages.stream(model="tiny", max_tokens=24, messages=MSG, extra_body=T0, stop_sequences=[stop]) as s:
        for t in s.text_stream:
            chunks.append(t)
        final = s.get_final_message()
    assert "".join(chunks) == _text(r) and final.stop_reason == "stop_sequence" and final.stop_sequence == stop


def test_streaming_events_and_text(ac, aserver):
    plain = ac.messages.create(model="tiny", max_tokens=16, messages=MSG, extra_body=T0)
    with ac.messages.stream(model="tiny", max_tokens=16, messages=MSG, extra_body=T0) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == _text(plain) and _text(final) == text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 16
    # the raw event sequence (stream=True)
    events = list(ac.messages.create(model="tiny", max_tokens=16, messages=MSG, extra_body=T0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    # the client skips pings: read the SSE lines themselves
    with httpx.stream("POST", aserver.url + "/v1/messages", headers={"x-api-key": KEY}, timeout=60,
                      json={"model": "tiny", "max_tokens": 16, "messages": MSG, "temperature": 0, "stream": True}) as r:
        lines = [ln for ln in r.iter_lines() if ln.startswith("event: ")]
    assert [ln[7:] for ln in lines] == [*kinds[:2], "ping", *kinds[2:]]
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == text
    assert events[-2].delta.stop_reason == "max_tokens" and events[-2].usage.output_tokens == 16
    assert events[0].message.usage.input_tokens + (events[0].message.usage.cache_read_input_tokens or 0) == \
        plain.usage.input_tokens + plain.usage.cache_read_input_tokens


def test_tool_round_trip(ac, oc):
    r = ac.messages.create(model="tiny", max_tokens=200, messages=MSG, tools=TOOLS,
                           extra_body={"temperature": 1.0, "seed": 1},
                           tool_choice={"type": "tool", "name": "get_weather"})
    assert r.stop_reason == "tool_use"
    uses = [b for b in r.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].id.startswith("toolu_")
    import jsonschema

    jsonschema.validate(uses[0].input, WEATHER)
    result = {"temp_c": 21}
    convo = [*MSG, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                           "content": json.dumps(result)}]}]
    answer = ac.messages.create(model="tiny", max_tokens=10, messages=convo, tools=TOOLS, extra_body=T0)
    assert answer.stop_reason in ("end_turn", "max_tokens")
    # the same conversation through the OpenAI route renders the same prompt and gives the same answer
    oai = [*MSG, {"role": "assistant", "content": None, "tool_calls": [
        {"id": uses[0].id, "type": "function", "function": {"name": "get_weather",
                                                            "arguments": json.dumps(uses[0].input)}}]},
           {"role": "tool", "tool_call_id": uses[0].id, "content": json.dumps(result)}]
    o = oc.chat.completions.create(model="tiny", max_tokens=10, messages=oai, temperature=0,
                                   tools=[{"type": "function", "function": {"name": "get_weather",
                                                                            "description": "Weather in a city",
                                                                            "parameters": WEATHER}}])
    assert answer.usage.input_tokens + answer.usage.cache_read_input_tokens == o.usage.prompt_tokens
    assert _text(answer) == (o.choices[0].message.content or "")
    counted = ac.messages.count_tokens(model="tiny", messages=convo, tools=TOOLS)
    assert counted.input_tokens == o.usage.prompt_tokens
    # auto: the model's own Hermes text parsed into a tool_use block, streamed as input_json_delta
    kw = dict(model="tiny", max_tokens=100, messages=MSG, tools=TOOLS,
              extra_body={"temperature": 0.7, "seed": 2, "guided_regex": CALL_RE})
    r = ac.messages.create(**kw)
    assert r.stop_reason == "tool_use" and [b.type for b in r.content] == ["text", "tool_use"]
    assert r.content[0].text == "Sure. "
    jsonschema.validate(r.content[1].input, WEATHER)
    events = list(ac.messages.create(**kw, stream=True))
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert [d.type for d in deltas][-1] == "input_json_delta"
    assert json.loads(deltas[-1].partial_json) == r.content[1].input
    starts = [e.content_block for e in events if e.type == "content_block_start"]
    assert [b.type for b in starts] == ["text", "tool_use"] and starts[1].name == "get_weather"
    assert events[-2].delta.stop_reason == "tool_use"


def test_errors_in_anthropics_shape(ac, aserver):
    h = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    r = httpx.post(aserver.url + "/v1/messages", json={"model": "tiny", "messages": MSG}, headers=h)
    assert r.status_code == 400
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError, match="text only"):  # a text-only model
        ac.messages.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
            {"type": "text", "text": "What is this?"}]}])
    with pytest.raises(anthropic.NotFoundError):
        ac.messages.create(model="claude-nope", max_tokens=4, messages=MSG)
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=aserver.url, api_key="wrong", max_retries=0).messages.create(
            model="tiny", max_tokens=4, messages=MSG)
    bad = httpx.post(aserver.url + "/v1/messages", json={"model": "tiny", "max_tokens": 4, "messages": MSG},
                     headers={"anthropic-version": "2023-06-01"})
    assert bad.status_code == 401 and bad.json()["error"]["type"] == "authentication_error"
    r = httpx.post(aserver.url + "/v1/messages", json={"model": "tiny", "max_tokens": 4, "messages": [
        {"role": "system", "content": "x"}]}, headers=h)
    assert r.status_code == 400 and "messages[0].role" in r.json()["error"]["message"]
    r = httpx.post(aserver.url + "/v1/messages", headers=h, json={
        "model": "tiny", "max_tokens": 4, "messages": MSG, "tools": TOOLS, "guided_regex": "a+",
        "tool_choice": {"type": "tool", "name": "get_weather"}})
    assert r.status_code == 400 and "constrains the output already" in r.json()["error"]["message"]
    r = httpx.post(aserver.url + "/v1/messages", headers=h, json={
        "model": "tiny", "max_tokens": 4, "messages": MSG, "tools": TOOLS, "tool_choice": {"type": "tool",
                                                                                           "name": "nope"}})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_image_blocks_on_a_vision_model():
    """A base64 ``image`` block reaches a vision model as the chat route's image part does: the same text."""
    import base64

    pytest.importorskip("PIL")
    import openai

    from max.entrypoints.cli import build_config
    from max.serve.server import ServerThread, build_app
    from vlm_support import image_bytes, tiny_gemma3_vlm

    app = build_app(build_config(tiny_gemma3_vlm()[0], None, "cpu", 128, 2), served_model_name="vlm")
    with ServerThread(app) as srv:
        ac = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=60)
        oc = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        texts = []
        for seed in (21, 22):
            data = base64.b64encode(image_bytes(seed, (50, 30))).decode()
            r = ac.messages.create(model="vlm", max_tokens=10, extra_body=T0, messages=[
                {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                          "data": data}},
                                             {"type": "text", "text": "What is this?"}]}])
            o = oc.chat.completions.create(model="vlm", max_tokens=10, temperature=0, messages=[
                {"role": "user", "content": [{"type": "image_url",
                                              "image_url": {"url": f"data:image/png;base64,{data}"}},
                                             {"type": "text", "text": "What is this?"}]}])
            assert _text(r) == o.choices[0].message.content
            assert r.usage.input_tokens + r.usage.cache_read_input_tokens == o.usage.prompt_tokens
            texts.append(_text(r))
        assert texts[0] != texts[1]  # the image matters
