"""Tool calling through ``max serve`` with the ``openai`` client, on a tiny random Llama whose chat
template renders tools the Hermes/Qwen way (``<tool_call>...</tool_call>``)."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from lm_support import make_tiny_llama, make_tokenizer

HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou may call these functions:\n"
    "{% for t in tools %}{{ t.function.name }}: {{ t.function.parameters | tojson }}\n{% endfor %}"
    "Call one as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n"
    "{% for c in m.tool_calls %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                            "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET", "PST"]}}, "required": ["tz"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MSG = [{"role": "user", "content": "What is the weather in Paris?"}]
# forces the model (random weights) to answer in the Hermes format, so the auto parser has a call to find
CALL_RE = r'Sure\. <tool_call>\n\{"name": "get_weather", "arguments": \{"city": "[a-z]{3,8}", "unit": "c"\}\}\n</tool_call>'


@pytest.fixture(scope="module")
def tools_server(tmp_path_factory):
    from max.entrypoints.cli import build_config
    from max.serve.server import ServerThread, build_app

    d = make_tiny_llama(str(tmp_path_factory.mktemp("tiny_tools")), tokenizer=make_tokenizer(
        chat_template=HERMES_TEMPLATE), max_position_embeddings=1024)
    app = build_app(build_config(d, None, "cpu", 1024, 8), served_model_name="tiny")
    with ServerThread(app) as srv:
        yield srv


@pytest.fixture(scope="module")
def tclient(tools_server):
    import openai

    return openai.OpenAI(base_url=tools_server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _check_calls(calls, names=None):
    assert calls
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        assert names is None or c.function.name in names
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


def test_tools_are_rendered_through_the_chat_template(tclient):
    plain = tclient.chat.completions.create(model="tiny", messages=MSG, max_tokens=2)
    with_tools = tclient.chat.completions.create(model="tiny", messages=MSG, max_tokens=2, tools=TOOLS,
                                                 tool_choice="none")
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 20
    assert with_tools.choices[0].message.tool_calls is None


def test_named_tool_choice_is_enforced(tclient):
    r = tclient.chat.completions.create(model="tiny", messages=MSG, max_tokens=200, tools=TOOLS, temperature=1.0,
                                        seed=1, n=3, tool_choice={"type": "function",
                                                                  "function": {"name": "get_weather"}})
    for ch in r.choices:
        assert ch.finish_reason == "tool_calls" and ch.message.content is None
        _check_calls(ch.message.tool_calls, {"get_weather"})
        assert len(ch.message.tool_calls) == 1


def test_required_tool_choice_is_enforced(tclient):
    r = tclient.chat.completions.create(model="tiny", messages=MSG, max_tokens=300, tools=TOOLS, temperature=0.8,
                                        seed=3, n=2, tool_choice="required")
    for ch in r.choices:
        assert ch.finish_reason == "tool_calls"
        _check_calls(ch.message.tool_calls, {"get_weather", "get_time"})


def test_auto_parses_the_models_tool_call_text(tclient):
    kw = dict(model="tiny", messages=MSG, max_tokens=100, tools=TOOLS, temperature=0.7, seed=2,
              extra_body={"guided_regex": CALL_RE})
    r = tclient.chat.completions.create(**kw)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content == "Sure. "
    _check_calls(ch.message.tool_calls, {"get_weather"})
    # streamed as OpenAI does: content deltas, then tool_calls deltas with index/id/type/function
    chunks = list(tclient.chat.completions.create(**kw, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert content == "Sure. " and len(deltas) == 1 and deltas[0].index == 0
    assert deltas[0].function.name == "get_weather"
    assert json.loads(deltas[0].function.arguments) == json.loads(ch.message.tool_calls[0].function.arguments)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        ["tool_calls"]


def test_named_choice_streams_one_tool_call(tclient):
    chunks = list(tclient.chat.completions.create(
        model="tiny", messages=MSG, max_tokens=200, tools=TOOLS, temperature=1.0, seed=5, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_time"}}))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(deltas) == 1 and deltas[0].function.name == "get_time"
    jsonschema.validate(json.loads(deltas[0].function.arguments), TIME)
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_auto_without_a_call_is_plain_content(tclient):
    r = tclient.chat.completions.create(model="tiny", messages=MSG, max_tokens=8, tools=TOOLS, temperature=0,
                                        extra_body={"ignore_eos": True})
    ch = r.choices[0]
    assert ch.message.tool_calls is None and ch.finish_reason == "length" and ch.message.content
    assert "<|im_end|>" not in ch.message.content


def test_history_with_tool_calls_and_results(tclient):
    history = MSG + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "paris", "unit": "c"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"}]
    r = tclient.chat.completions.create(model="tiny", messages=history, max_tokens=4, tools=TOOLS)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    short = tclient.chat.completions.create(model="tiny", messages=MSG, max_tokens=1, tools=TOOLS)
    assert r.usage.prompt_tokens > short.usage.prompt_tokens + 15  # the call and its result were rendered


@pytest.mark.parametrize("body,param", [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "launch_rocket"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
     "tools[0].function.parameters"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "wizard"}}}],
      "tool_choice": "required"}, "tools[0].function.parameters"),
    # a bad schema is found under auto (and none) too, and named by its index
    ({"tools": [TOOLS[0], {"type": "function", "function": {"name": "f", "parameters": {"type": "wizard"}}}],
      "tool_choice": "auto"}, "tools[1].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/missing"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [TOOLS[0], {"type": "function", "function": {"name": "f", "parameters": {"type": "wizard"}}}],
      "tool_choice": "none"}, "tools[1].function.parameters"),
])
def test_bad_tools_are_400(tools_server, tclient, body, param):
    r = httpx.post(tools_server.url + "/v1/chat/completions", timeout=30,
                   json={"model": "tiny", "messages": MSG, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert "\n" not in r.json()["error"]["message"]
    assert tclient.chat.completions.create(model="tiny", messages=MSG, max_tokens=2).choices  # still serving
