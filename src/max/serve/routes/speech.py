"""``POST /v1/audio/speech`` (OpenAI's text to speech) for a text-to-speech model (Sesame CSM).

JSON body: ``model``, ``input`` (1..4096 characters), ``voice`` (see the model's voices: for CSM a speaker
id ``"0"``, ``"1"``, ... or one of OpenAI's voice names, each mapped to a speaker id), ``response_format``
(``mp3`` default, ``wav``, ``pcm``, ``flac``; ``opus`` / ``aac`` are refused), ``speed`` (0.25-4.0, by
resampling), ``stream_format`` (``audio``: the bytes, chunked as they are made -- ``pcm`` and ``wav`` stream,
``mp3`` / ``flac`` come once complete; ``sse``: ``speech.audio.delta`` events with base64 bytes, then
``speech.audio.done``; without it a ``wav`` comes whole, once complete, with its real RIFF/data sizes -- a
streamed one cannot know them and says 0xFFFFFFFF), optional ``seed`` and ``max_new_frames`` (libremax
extensions).  Bad fields are 400s naming the field, answered before the request joins the batch.
"""

from __future__ import annotations

import base64
import json
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from max.serve.invalid import FieldMap, expect
from max.serve.openai_schemas import APIError
from max.serve.speech_output import FORMATS, MEDIA_TYPES, UNSUPPORTED, SpeechEncoder, streams
from max.serve.state import read_json, serve_state

router = APIRouter()

MAX_INPUT_CHARS = 4096
_FIELDS = {"model", "input", "voice", "response_format", "speed", "stream_format", "instructions", "seed",
           "max_new_frames"}


def _bad(message: str, param: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_request")


@router.post("/v1/audio/speech")
async def speech(request: Request) -> Response:
    state = serve_state(request)
    engine = getattr(state, "speaker", None)
    if engine is None:
        raise APIError(400, f"the model '{state.model_name}' is not a text-to-speech model; /v1/audio/speech is not "
                       "available", param="model", code="model_not_supported", keep=(state.model_name,))
    body = await read_json(request)
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_request")
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise _bad(f"unknown field '{unknown[0]}'", unknown[0])
    if "model" not in body:
        raise _bad("'model' is required", "model")
    state.check_model(body["model"])
    text = body.get("input")
    if not isinstance(text, str) or not text.strip():
        raise _bad("'input' must be a non-empty string (the text to speak)", "input")
    if len(text) > MAX_INPUT_CHARS:
        raise _bad(f"'input' is {len(text)} characters; the maximum is {MAX_INPUT_CHARS}", "input")
    pipe = engine.pipeline
    voice = body.get("voice")
    if isinstance(voice, dict):
        voice = voice.get("id")
    if not isinstance(voice, str) or not voice:
        raise _bad(f"'voice' is required: one of {', '.join(pipe.voices())}", "voice")
    expect(request, FieldMap(known=frozenset(), default="voice", code="invalid_request"))
    speaker = pipe.speaker_for_voice(voice)
    fmt = body.get("response_format", "mp3")
    if fmt in UNSUPPORTED or fmt not in FORMATS:
        raise _bad(f"response_format must be one of {', '.join(FORMATS)}, got {fmt!r}", "response_format")
    speed = body.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0.25 <= float(speed) <= 4.0:
        raise _bad(f"'speed' must be a number between 0.25 and 4.0, got {speed!r}", "speed")
    stream_format = body.get("stream_format", "audio")
    if stream_format not in ("audio", "sse"):
        raise _bad(f"stream_format must be 'audio' or 'sse', got {stream_format!r}", "stream_format")
    if body.get("instructions"):
        raise _bad("'instructions' is not supported by this model (choose the voice with 'voice')", "instructions")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 63):
        raise _bad(f"'seed' must be an integer in 0..2^63-1, got {seed!r}", "seed")
    frames = body.get("max_new_frames")
    if frames is not None and (isinstance(frames, bool) or not isinstance(frames, int) or frames < 1):
        raise _bad(f"'max_new_frames' must be a positive integer, got {frames!r}", "max_new_frames")
    expect(request, FieldMap(known=frozenset(_FIELDS), default="input", code="invalid_request"))
    ctx = pipe.new_context(text, speaker, sampling_params=pipe.default_sampling(seed), max_new_frames=frames)
    expect(request, None)
    whole = fmt == "wav" and "stream_format" not in body  # streamed only when asked: its header has no sizes
    enc = SpeechEncoder(fmt, pipe.sample_rate, float(speed), whole=whole)
    chunks = engine.speak(ctx)
    if stream_format == "sse":
        return StreamingResponse(_sse(chunks, enc), media_type="text/event-stream")
    if whole or not streams(fmt):  # one body once complete (errors are still a clean 4xx/5xx)
        data = b"".join([enc.add(out.audio_data) async for out in chunks]) + enc.finish()
        return Response(data, media_type=MEDIA_TYPES[fmt])
    return StreamingResponse(_bytes(chunks, enc), media_type=MEDIA_TYPES[fmt])


async def _bytes(chunks: AsyncIterator[Any], enc: SpeechEncoder) -> AsyncIterator[bytes]:
    async for out in chunks:
        data = enc.add(out.audio_data)
        if data:
            yield data
    tail = enc.finish()
    if tail:
        yield tail


async def _sse(chunks: AsyncIterator[Any], enc: SpeechEncoder) -> AsyncIterator[bytes]:
    def event(d: dict) -> bytes:
        return f"data: {json.dumps(d)}\n\n".encode()

    frames = 0
    async for out in chunks:
        frames = int(out.metadata.tokens_generated or frames)
        data = enc.add(out.audio_data)
        if data:
            yield event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
    tail = enc.finish()
    if tail:
        yield event({"type": "speech.audio.delta", "audio": base64.b64encode(tail).decode()})
    yield event({"type": "speech.audio.done", "usage": {"input_tokens": 0, "output_tokens": frames,
                                                         "total_tokens": frames}})
