"""Requests, messages/tools/response formats, statuses, outputs, LoRA, scheduler types."""

from __future__ import annotations

import numpy as np
import pytest

from max.interfaces import (
    AudioGenerationMetadata,
    AudioGenerationRequest,
    AudioGeneratorOutput,
    EmbeddingsGenerationInputs,
    EmbeddingsGenerationOutput,
    GenerationStatus,
    LogProbabilities,
    LoRAOperation,
    LoRARequest,
    LoRAStatus,
    LoRAType,
    PipelineOutput,
    PipelineTask,
    Request,
    RequestID,
    SamplingParams,
    SchedulerResult,
    TextGenerationInputs,
    TextGenerationOutput,
    TextGenerationRequest,
)


def test_generation_status():
    assert [s.value for s in GenerationStatus] == ["active", "end_of_sequence", "maximum_length", "cancelled"]
    assert not GenerationStatus.ACTIVE.is_done
    assert all(s.is_done for s in GenerationStatus if s is not GenerationStatus.ACTIVE)
    assert GenerationStatus("cancelled") is GenerationStatus.CANCELLED


def test_request_id_and_base_request():
    assert RequestID is str
    assert Request("abc").request_id == "abc"
    with pytest.raises(TypeError, match="request_id"):
        Request(5)


def test_text_generation_request_defaults():
    r = TextGenerationRequest("id", "model", prompt="hello")
    assert r.messages is None and r.images is None and r.tools is None and r.response_format is None
    assert r.timestamp_ns == 0 and r.request_path == "/" and r.logprobs == 0 and r.echo is False
    assert r.stop is None and r.chat_template_options is None and r.target_endpoint is None
    assert isinstance(r.sampling_params, SamplingParams)
    assert r.sampling_params is not TextGenerationRequest("id2", "m", prompt="x").sampling_params
    assert TextGenerationRequest("i", "m", prompt=[1, 2, 3]).prompt == [1, 2, 3]
    assert TextGenerationRequest("i", "m", prompt=np.array([4, 5])).prompt == [4, 5]


def test_chat_request_with_tools_and_response_format():
    r = TextGenerationRequest(
        "id",
        "m",
        messages=[
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What's in this image?"},
                    {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                ],
            },
            {"role": "assistant", "content": None},
            {"role": "tool", "content": "42"},
        ],
        tools=[
            {
                "type": "function",
                "function": {"name": "get_weather", "description": "d", "parameters": {"type": "object"}},
            }
        ],
        response_format={"type": "json_schema", "json_schema": {"type": "object"}},
        stop="###",
        sampling_params=SamplingParams(stop=["END", "###"]),
    )
    assert r.stop_sequences == ["###", "END"]
    assert r.tools[0]["function"]["name"] == "get_weather"


@pytest.mark.parametrize(
    "kw, exc, match",
    [
        (dict(), ValueError, "prompt or messages"),
        (dict(prompt=[1, -2]), ValueError, "non-negative"),
        (dict(prompt=[1.5]), TypeError, "prompt"),
        (dict(messages=[{"role": "robot", "content": "x"}]), ValueError, "role"),
        (dict(messages=[{"role": "user", "content": 3}]), TypeError, "content"),
        (dict(messages=[{"role": "user", "content": [{"text": "no type"}]}]), ValueError, "type"),
        (dict(messages={"role": "user"}), TypeError, "messages"),
        (dict(prompt="x", tools=[{"type": "function", "function": {}}]), ValueError, "name"),
        (dict(prompt="x", tools=[{"function": {"name": "f"}}]), ValueError, "type"),
        (dict(prompt="x", response_format={"json_schema": {}}), ValueError, "response_format"),
        (dict(prompt="x", response_format={"type": "json_schema"}), ValueError, "json_schema"),
        (dict(prompt="x", logprobs=-1), ValueError, "logprobs"),
        (dict(prompt="x", images=["not bytes"]), TypeError, "images"),
        (dict(prompt="x", stop=[1]), TypeError, "stop"),
        (dict(prompt="x", sampling_params={"top_k": 1}), TypeError, "sampling_params"),
    ],
)
def test_text_generation_request_validation(kw, exc, match):
    with pytest.raises(exc, match=match):
        TextGenerationRequest("id", "m", **kw)


def test_text_generation_output_and_logprobs():
    lp = LogProbabilities([-0.5], [{3: -0.5, 4: -1.0}])
    o = TextGenerationOutput("r", [3], GenerationStatus.ACTIVE, [lp])
    assert not o.is_done and isinstance(o, PipelineOutput)
    assert TextGenerationOutput("r", [], "end_of_sequence").is_done
    assert TextGenerationOutput("r", [], GenerationStatus.MAXIMUM_LENGTH).log_probabilities is None
    with pytest.raises(ValueError):
        TextGenerationOutput("r", [], "bogus")
    with pytest.raises(ValueError, match="same length"):
        LogProbabilities([-0.1, -0.2], [{}])


def test_other_outputs_and_tasks():
    e = EmbeddingsGenerationOutput(np.ones((2, 3), np.float32))
    assert e.is_done
    a = AudioGeneratorOutput(GenerationStatus.ACTIVE)
    assert not a.is_done and a.audio_data.dtype == np.float32 and a.audio_data.size == 0
    assert a.metadata == AudioGenerationMetadata()
    md = AudioGenerationMetadata(sample_rate=24000, final_chunk=True)
    assert md.to_dict() == {"sample_rate": 24000, "final_chunk": True}
    with pytest.raises(TypeError):
        AudioGenerationMetadata(24000)  # keyword-only
    assert PipelineTask.TEXT_GENERATION.output_type is TextGenerationOutput
    assert PipelineTask.EMBEDDINGS_GENERATION.output_type is EmbeddingsGenerationOutput
    assert PipelineTask.AUDIO_GENERATION.output_type is AudioGeneratorOutput
    assert PipelineTask("speech_token_generation") is PipelineTask.SPEECH_TOKEN_GENERATION


def test_audio_request():
    r = AudioGenerationRequest("id", "m", input="hi")
    assert r.audio_prompt_tokens == [] and r.audio_prompt_transcription == "" and r.streaming is True
    with pytest.raises(ValueError, match="4096"):
        AudioGenerationRequest("id", "m", input="x" * 4097)
    with pytest.raises(ValueError, match="input or prompt"):
        AudioGenerationRequest("id", "m")


def test_generation_inputs_merge_batches():
    ti = TextGenerationInputs([{"a": 1}, {"b": 2}], num_steps=3)
    assert ti.batch == {"a": 1, "b": 2} and ti.num_steps == 3
    with pytest.raises(ValueError, match="more than one batch"):
        TextGenerationInputs([{"a": 1}, {"a": 2}], 1).batch
    with pytest.raises(ValueError, match="num_steps"):
        TextGenerationInputs([{}], 0)
    assert EmbeddingsGenerationInputs([{"x": 1}, {"y": 2}]).batch == {"x": 1, "y": 2}


def test_lora_and_scheduler_types():
    assert LoRAType.A.value == "lora_A" and LoRAType.BIAS.value == "lora.bias"
    assert LoRAStatus.UNLOAD_NAME_NONEXISTENT.value == "unload_name_nonexistent"
    assert LoRARequest(LoRAOperation.LIST).lora_name is None
    with pytest.raises(ValueError, match="lora_path"):
        LoRARequest(LoRAOperation.LOAD, lora_name="a")
    c = SchedulerResult.cancelled()
    assert c.is_done and c.result is None
    out = TextGenerationOutput("r", [1], GenerationStatus.ACTIVE)
    assert SchedulerResult.create(out) == SchedulerResult(False, out)
    assert SchedulerResult.create(TextGenerationOutput("r", [], "cancelled")).is_done
