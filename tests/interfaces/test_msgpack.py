"""msgpack round trips of requests and outputs (numpy arrays in-band and via shared memory)."""

from __future__ import annotations

import os
import pickle

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st

from max.interfaces import (
    AudioGenerationRequest,
    AudioGeneratorOutput,
    EmbeddingsGenerationOutput,
    GenerationStatus,
    LogProbabilities,
    SamplingParams,
    SharedMemoryArray,
    TextGenerationOutput,
    TextGenerationRequest,
    msgpack_eq,
    msgpack_numpy_decoder,
    msgpack_numpy_encoder,
)


def roundtrip(obj, type_=None, **enc):
    data = msgpack_numpy_encoder(**enc)(obj)
    assert isinstance(data, bytes)
    return msgpack_numpy_decoder(type_ or type(obj))(data)


def chat_request() -> TextGenerationRequest:
    return TextGenerationRequest(
        "req-1",
        "llama",
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "u"}}]},
        ],
        images=[b"\x89PNG\x00\x01"],
        tools=[{"type": "function", "function": {"name": "f", "description": None, "parameters": {"type": "object"}}}],
        response_format={"type": "json_schema", "json_schema": {"type": "object", "properties": {}}},
        timestamp_ns=123,
        request_path="/v1/chat/completions",
        logprobs=2,
        echo=True,
        stop=["a", "b"],
        chat_template_options={"enable_thinking": False},
        sampling_params=SamplingParams(top_k=5, top_p=0.9, temperature=0.7, stop_token_ids=[2], seed=42,
                                       logit_bias={7: -2.5}),
        target_endpoint="ep",
    )


def test_text_generation_request_roundtrip():
    r = chat_request()
    back = roundtrip(r)
    assert back == r and isinstance(back.sampling_params, SamplingParams)
    assert msgpack_eq(r, back)
    p = TextGenerationRequest("x", "m", prompt=[1, 2, 3])
    assert roundtrip(p).prompt == [1, 2, 3]
    assert roundtrip(TextGenerationRequest("x", "m", prompt="text")).prompt == "text"


def test_decoding_validates():
    bad = msgpack_numpy_encoder()(
        {"request_id": "x", "model_name": "m", "prompt": "p", "sampling_params": {"top_p": 5.0}}
    )
    with pytest.raises(ValueError, match="top_p"):
        msgpack_numpy_decoder(TextGenerationRequest)(bad)
    missing = msgpack_numpy_encoder()({"request_id": "x"})
    with pytest.raises(Exception, match="model_name"):
        msgpack_numpy_decoder(TextGenerationRequest)(missing)


def test_outputs_roundtrip():
    o = TextGenerationOutput(
        "r", [5, 6], GenerationStatus.END_OF_SEQUENCE, [LogProbabilities([-0.1, -0.2], [{5: -0.1}, {6: -0.2, 7: -3.0}])]
    )
    back = roundtrip(o)
    assert back == o and back.final_status is GenerationStatus.END_OF_SEQUENCE and back.is_done
    assert back.log_probabilities[0].top_log_probabilities[1] == {6: -0.2, 7: -3.0}
    d = msgpack_numpy_decoder(dict[str, TextGenerationOutput])(msgpack_numpy_encoder()({"r": o}))
    assert d == {"r": o}


def test_numpy_fields_roundtrip():
    audio = AudioGeneratorOutput(
        GenerationStatus.ACTIVE,
        steps_executed=3,
        audio_data=np.linspace(0, 1, 7, dtype=np.float32),
        buffer_speech_tokens=np.arange(4, dtype=np.int32).reshape(2, 2),
    )
    back = roundtrip(audio)
    np.testing.assert_array_equal(back.audio_data, audio.audio_data)
    assert back.buffer_speech_tokens.dtype == np.int32 and back.buffer_speech_tokens.shape == (2, 2)
    emb = EmbeddingsGenerationOutput(np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3)))
    np.testing.assert_array_equal(roundtrip(emb).embeddings, emb.embeddings)
    req = AudioGenerationRequest("a", "m", input="hi", buffer_speech_tokens=np.array([1, 2], np.int64))
    assert roundtrip(req).buffer_speech_tokens.tolist() == [1, 2]


@given(
    dtype=st.sampled_from([np.float32, np.float16, np.int64, np.uint8, np.bool_, ml_dtypes.bfloat16]),
    shape=st.lists(st.integers(0, 4), max_size=3),
)
def test_any_array_roundtrip(dtype, shape):
    a = (np.arange(int(np.prod(shape)), dtype=np.float64) % 3).astype(dtype).reshape(shape)
    back = msgpack_numpy_decoder(np.ndarray)(msgpack_numpy_encoder()(a))
    assert back.dtype == a.dtype and back.shape == a.shape and (back == a).all()


def test_arrays_in_untyped_containers_and_copy_flag():
    payload = {"x": [np.arange(3)], "y": np.float32(1.5)}
    data = msgpack_numpy_encoder()(payload)
    out = msgpack_numpy_decoder(dict)(data)
    assert out["x"][0].tolist() == [0, 1, 2] and out["y"] == 1.5
    view = msgpack_numpy_decoder(np.ndarray, copy=False)(msgpack_numpy_encoder()(np.arange(4)))
    assert not view.flags.writeable
    copied = msgpack_numpy_decoder(np.ndarray)(msgpack_numpy_encoder()(np.arange(4)))
    assert copied.flags.writeable


def _shm_names():
    return {f for f in os.listdir("/dev/shm") if f.startswith("psm_")} if os.path.isdir("/dev/shm") else set()


def test_shared_memory_roundtrip_and_cleanup():
    before = _shm_names()
    big = np.arange(1000, dtype=np.float32)
    small = np.arange(3, dtype=np.float32)
    enc = msgpack_numpy_encoder(use_shared_memory=True, shared_memory_threshold=100)
    out = AudioGeneratorOutput(GenerationStatus.ACTIVE, audio_data=big, buffer_speech_tokens=small.astype(np.int64))
    data = enc(out)
    assert len(data) < big.nbytes  # the big array travelled out of band
    assert len(_shm_names() - before) == 1
    back = msgpack_numpy_decoder(AudioGeneratorOutput)(data)
    np.testing.assert_array_equal(back.audio_data, big)
    assert back.buffer_speech_tokens.tolist() == [0, 1, 2]
    assert _shm_names() == before  # the decoder unlinked the segment
    # A SharedMemoryArray placeholder in an untyped field is read back as an array.
    from max.interfaces.msgpack import _write_shm

    ph = _write_shm(np.array([7, 8], np.int16))
    assert isinstance(ph, SharedMemoryArray)
    assert msgpack_numpy_decoder(dict)(msgpack_numpy_encoder()({"p": ph}))["p"].tolist() == [7, 8]
    assert _shm_names() == before


def test_encoder_decoder_are_picklable():
    enc = pickle.loads(pickle.dumps(msgpack_numpy_encoder(use_shared_memory=True, shared_memory_threshold=5)))
    assert enc.use_shared_memory and enc.shared_memory_threshold == 5
    dec = pickle.loads(pickle.dumps(msgpack_numpy_decoder(TextGenerationOutput, copy=False)))
    o = TextGenerationOutput("r", [1], GenerationStatus.ACTIVE)
    assert dec(msgpack_numpy_encoder()(o)) == o
    dec(msgpack_numpy_encoder()(o))  # reusable after first use


def test_unencodable_objects_raise():
    with pytest.raises(TypeError):
        msgpack_numpy_encoder()(SamplingParams(logits_processors=[print]))
    with pytest.raises(TypeError):
        msgpack_numpy_encoder()(np.array([object()]))
    with pytest.raises(ValueError):
        msgpack_numpy_encoder(shared_memory_threshold=-1)


def test_msgpack_eq():
    assert msgpack_eq(TextGenerationOutput("r", [1], "active"), TextGenerationOutput("r", [1], "active"))
    assert not msgpack_eq(TextGenerationOutput("r", [1], "active"), TextGenerationOutput("r", [2], "active"))
    assert msgpack_eq(np.arange(3), np.arange(3)) and not msgpack_eq(np.arange(3), np.arange(3.0))
