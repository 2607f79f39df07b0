"""``POST /v1/audio/speech`` on a live server (the tiny random CSM of ``csm_support``) through the ``openai``
client: the audio equals the pipeline's own (greedy), every response format decodes, ``speed`` resamples,
streamed bytes (chunked ``pcm`` / ``wav``, ``sse`` events) equal the whole, a whole ``wav`` has its real sizes
(a streamed one 0xFFFFFFFF), concurrent requests (batched
together) equal the alone ones, and bad fields get OpenAI-shaped 400s naming the field while the server
keeps serving."""

from __future__ import annotations

import base64
import concurrent.futures
import io
import json

import numpy as np
import pytest

soundfile = pytest.importorskip("soundfile")
pytest.importorskip("soxr")

from tests.pipelines import csm_support as cs  # noqa: E402

_CODEC = None  # codec.CODEC_CLASS None: the native MimiCodec
MODEL = "csm-tiny"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from max.entrypoints.cli import build_config
    from max.pipelines.architectures.csm import codec
    from max.serve.server import ServerThread, build_app

    before, codec.CODEC_CLASS = codec.CODEC_CLASS, _CODEC
    try:
        d = cs.make_csm_dir(str(tmp_path_factory.mktemp("csm-serve")))
        app = build_app(build_config(d, None, "cpu", None, 4), served_model_name=MODEL)
    finally:
        codec.CODEC_CLASS = before
    with ServerThread(app) as srv:
        srv.pipe = app.state.serve.speaker.pipeline
        yield srv


@pytest.fixture(scope="module")
def oa(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _direct(server, text: str, speaker: int, frames: int) -> np.ndarray:
    pipe = server.pipe
    ctx = pipe.new_context(text, speaker, sampling_params=pipe.default_sampling(), max_new_frames=frames)
    (audio,) = pipe.generate([ctx])
    return audio


def _pcm16(x: np.ndarray) -> np.ndarray:
    return (np.clip(x, -1, 1) * 32767.0).round().astype(np.int16)


def _speak(oa, text="Hello there", voice="1", fmt="wav", frames=5, **kw) -> bytes:
    return oa.audio.speech.create(model=MODEL, input=text, voice=voice, response_format=fmt,
                                  extra_body={"max_new_frames": frames}, **kw).content


def test_wav_equals_pipeline(server, oa):
    data, rate = soundfile.read(io.BytesIO(_speak(oa)), dtype="int16")
    ref = _direct(server, "Hello there", 1, 5)
    assert rate == server.pipe.sample_rate and ref.size > 0
    np.testing.assert_array_equal(data, _pcm16(ref))
    # an OpenAI voice name is a speaker id (echo: 4)
    data, _ = soundfile.read(io.BytesIO(_speak(oa, voice="echo")), dtype="int16")
    np.testing.assert_array_equal(data, _pcm16(_direct(server, "Hello there", 4, 5)))


def test_formats_and_speed(server, oa):
    ref = _pcm16(_direct(server, "Hello there", 1, 5))
    pcm = np.frombuffer(_speak(oa, fmt="pcm"), "<i2")
    np.testing.assert_array_equal(pcm, ref)
    flac, _ = soundfile.read(io.BytesIO(_speak(oa, fmt="flac")), dtype="int16")
    np.testing.assert_allclose(flac, ref, atol=1)  # libsndfile scales by 32768
    mp3, rate = soundfile.read(io.BytesIO(_speak(oa, fmt="mp3")), dtype="float32")  # lossy: length only
    assert rate == server.pipe.sample_rate and abs(mp3.shape[0] - ref.size) <= 2 * 1152
    fast = np.frombuffer(_speak(oa, fmt="pcm", speed=2.0), "<i2")
    assert abs(fast.size - ref.size / 2) <= 64


def test_streamed_bytes_equal_whole(server, oa):
    whole = _speak(oa, fmt="pcm", frames=7)
    with oa.audio.speech.with_streaming_response.create(model=MODEL, input="Hello there", voice="1",
                                                        response_format="pcm",
                                                        extra_body={"max_new_frames": 7}) as r:
        parts = [p for p in r.iter_bytes() if p]
    assert b"".join(parts) == whole
    import httpx

    with httpx.stream("POST", server.url + "/v1/audio/speech", timeout=120,
                      json={"model": MODEL, "input": "Hello there", "voice": "1", "response_format": "pcm",
                            "stream_format": "sse", "max_new_frames": 7}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 2 and events[-1]["type"] == "speech.audio.done"  # chunks of 5 frames, then the rest
    assert b"".join(base64.b64decode(e["audio"]) for e in deltas) == whole


def _wav_sizes(data: bytes) -> tuple[int, int]:
    """The RIFF and data chunk sizes of a 44-byte-header WAV."""
    import struct

    assert data[:4] == b"RIFF" and data[8:16] == b"WAVE" + b"fmt " and data[36:40] == b"data"
    return struct.unpack("<I", data[4:8])[0], struct.unpack("<I", data[40:44])[0]


def test_wav_whole_has_real_sizes_streamed_has_unknown(server, oa):
    """A wav returned at once (no stream_format) says its real sizes; one streamed on request (stream_format
    ``audio``, or ``sse``) says 0xFFFFFFFF, which readers take as "to the end"; the samples are the same."""
    import httpx

    whole = _speak(oa, fmt="wav", frames=6)
    riff, data = _wav_sizes(whole)
    assert (riff, data) == (len(whole) - 8, len(whole) - 44) and data > 0
    info = soundfile.info(io.BytesIO(whole))
    assert info.frames == data // 2 and info.duration < 60  # not the 24 h a 0xFFFFFFFF size reads as
    with oa.audio.speech.with_streaming_response.create(model=MODEL, input="Hello there", voice="1",
                                                        response_format="wav", stream_format="audio",
                                                        extra_body={"max_new_frames": 6}) as r:
        streamed = b"".join(r.iter_bytes())
    assert _wav_sizes(streamed) == (0xFFFFFFFF, 0xFFFFFFFF) and streamed[44:] == whole[44:]
    with httpx.stream("POST", server.url + "/v1/audio/speech", timeout=120,
                      json={"model": MODEL, "input": "Hello there", "voice": "1", "response_format": "wav",
                            "stream_format": "sse", "max_new_frames": 6}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    sse = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    assert _wav_sizes(sse) == (0xFFFFFFFF, 0xFFFFFFFF) and sse[44:] == whole[44:]


def test_speech_encoder_wav_forms():
    from max.serve.speech_output import SpeechEncoder

    x = np.sin(np.arange(1000) / 7.0).astype(np.float32) * 0.5
    for speed in (1.0, 1.5):
        whole = SpeechEncoder("wav", 24000, speed, whole=True)
        assert whole.add(x[:300]) == b"" and whole.add(x[300:]) == b""
        w = whole.finish()
        s = SpeechEncoder("wav", 24000, speed)
        streamed = s.add(x[:300]) + s.add(x[300:]) + s.finish()
        assert w[44:] == streamed[44:] and _wav_sizes(w) == (len(w) - 8, len(w) - 44)
        assert _wav_sizes(streamed) == (0xFFFFFFFF, 0xFFFFFFFF)
        back, rate = soundfile.read(io.BytesIO(w), dtype="int16")
        assert rate == 24000 and back.size == (len(w) - 44) // 2
    empty = SpeechEncoder("wav", 24000, whole=True).finish()
    assert len(empty) == 44 and _wav_sizes(empty) == (36, 0)
    pcm = SpeechEncoder("pcm", 24000, whole=True)
    pcm.add(x)
    assert pcm.finish() == SpeechEncoder("pcm", 24000).add(x)


def test_concurrent_requests_equal_alone(server, oa):
    cases = [("Hello there", "1", 5), ("a much longer sentence to speak", "0", 6), ("hi", "3", 4)]
    with concurrent.futures.ThreadPoolExecutor(3) as ex:
        got = list(ex.map(lambda c: _speak(oa, c[0], c[1], "pcm", c[2]), cases))
    for (text, voice, frames), data in zip(cases, got):
        np.testing.assert_array_equal(np.frombuffer(data, "<i2"), _pcm16(_direct(server, text, int(voice), frames)))


@pytest.mark.parametrize("body,param", [
    ({"input": ""}, "input"),
    ({"input": "x" * 4097}, "input"),
    ({"voice": "nobody"}, "voice"),
    ({"voice": None}, "voice"),
    ({"response_format": "opus"}, "response_format"),
    ({"response_format": "ogg"}, "response_format"),
    ({"speed": 9}, "speed"),
    ({"stream_format": "video"}, "stream_format"),
    ({"instructions": "whisper it"}, "instructions"),
    ({"max_new_frames": 0}, "max_new_frames"),
    ({"volume": 3}, "volume"),
])
def test_bad_fields_are_400s_naming_the_field(server, body, param):
    import httpx

    req = {"model": MODEL, "input": "Hello there", "voice": "1", "max_new_frames": 2, **body}
    r = httpx.post(server.url + "/v1/audio/speech", json={k: v for k, v in req.items() if v is not None}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"


def test_server_keeps_serving_and_refuses_text_routes(server, oa):
    import httpx

    r = httpx.post(server.url + "/v1/audio/speech", json={"model": MODEL, "input": "", "voice": "1"})
    assert r.status_code == 400
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user",
                                                                                            "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    r = httpx.post(server.url + "/v1/audio/speech", json={"model": "other", "input": "hi", "voice": "1"})
    assert r.status_code == 404
    assert len(_speak(oa, fmt="pcm", frames=2)) > 0
    assert not any(server.pipe.model.kv_manager.contains(f"csm-{i}") for i in range(1000))
