"""``POST /v1/audio/transcriptions`` and ``POST /v1/audio/translations`` (OpenAI's multipart upload).

Form fields: ``file`` (the audio; any format libsndfile reads), ``model``, ``language`` (transcriptions;
ISO-639-1 code or English name), ``prompt`` (text the transcript continues), ``response_format`` (``json``,
``text``, ``srt``, ``vtt``, ``verbose_json``), ``temperature`` (0-1), ``timestamp_granularities[]``
(``segment`` and/or ``word``; only with ``verbose_json``: ``word`` adds ``words``, each with its start and
end).  Bad fields and bad audio (empty, corrupt, unsupported, too long) are
400s naming the field, answered before the request reaches the model, so other requests are unaffected.
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from max.serve.invalid import FieldMap, expect
from max.serve.openai_schemas import APIError
from max.serve.state import AppState, serve_state

router = APIRouter()

_CHECK_FIELDS = FieldMap(rename={"task": "model"},  # e.g. a model that does not translate
                         known=frozenset({"language", "prompt", "temperature", "timestamp_granularities"}),
                         default="file")
"""The form's names of the transcription pipeline's checks."""

FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
_FIELDS = {"file", "model", "language", "prompt", "response_format", "temperature", "timestamp_granularities[]",
           "timestamp_granularities", "stream", "include[]", "chunking_strategy"}


@router.post("/v1/audio/transcriptions")
async def transcriptions(request: Request) -> Response:
    return await _handle(request, "transcribe")


@router.post("/v1/audio/translations")
async def translations(request: Request) -> Response:
    return await _handle(request, "translate")


def _engine(state: AppState, path: str) -> Any:
    if state.transcriber is None:
        raise APIError(400, f"the model '{state.model_name}' is not a speech recognition model; {path} is not "
                       "available", param="model", code="model_not_supported", keep=(state.model_name,))
    return state.transcriber


async def _form(request: Request) -> Any:
    mime = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
    if mime != "multipart/form-data":
        raise APIError(415, f"unsupported Content-Type '{mime or 'none'}': upload the audio as multipart/form-data "
                       "with a 'file' field", code="unsupported_content_type")
    try:
        return await request.form()
    except Exception as e:  # noqa: BLE001 - the multipart parser's errors
        raise APIError(400, f"the multipart body could not be parsed: {e}", code="invalid_request") from None


def _one(form: Any, name: str) -> Optional[str]:
    vals = form.getlist(name)
    if not vals:
        return None
    if len(vals) > 1:
        raise APIError(400, f"'{name}' was given {len(vals)} times", param=name)
    v = vals[0]
    if not isinstance(v, str):
        raise APIError(400, f"'{name}' must be a text field, not a file", param=name)
    return v


async def _handle(request: Request, task: str) -> Response:
    from max.pipelines.lib.audio import AudioError, decode_audio
    from max.pipelines.lib.transcription import TranscriptionRequest

    state = serve_state(request)
    path = request.url.path
    engine = _engine(state, path)
    form = await _form(request)
    unknown = sorted(set(form.keys()) - _FIELDS)
    if unknown:
        raise APIError(400, f"unknown field '{unknown[0]}'", param=unknown[0])
    state.check_model(_one(form, "model"))
    if _one(form, "stream") not in (None, "false", "False"):
        raise APIError(400, "streaming transcriptions are not supported", param="stream")
    fmt = _one(form, "response_format") or "json"
    if fmt not in FORMATS:
        raise APIError(400, f"response_format must be one of {', '.join(FORMATS)}, got '{fmt}'",
                       param="response_format")
    temperature = 0.0
    t = _one(form, "temperature")
    if t is not None:
        try:
            temperature = float(t)
        except ValueError:
            raise APIError(400, f"temperature must be a number, got '{t}'", param="temperature") from None
        if not 0.0 <= temperature <= 1.0:
            raise APIError(400, f"temperature must be between 0 and 1, got {temperature:g}", param="temperature")
    grans = [*form.getlist("timestamp_granularities[]"), *form.getlist("timestamp_granularities")]
    for g in grans:
        if g not in ("segment", "word"):
            raise APIError(400, f"timestamp_granularities entries must be 'segment' or 'word', got '{g}'",
                           param="timestamp_granularities")
    if grans and fmt != "verbose_json":
        raise APIError(400, "timestamp_granularities needs response_format 'verbose_json'",
                       param="timestamp_granularities")
    language = _one(form, "language")
    if task == "translate" and language is not None:
        raise APIError(400, "translations take no 'language' (the output is English)", param="language")
    prompt = _one(form, "prompt")
    files = form.getlist("file")
    if not files:
        raise APIError(400, "the 'file' field (the audio to transcribe) is required", param="file")
    if len(files) > 1 or isinstance(files[0], str):
        raise APIError(400, "'file' must be exactly one uploaded file", param="file")
    upload = files[0]
    data = await upload.read()
    try:
        audio = await asyncio.to_thread(decode_audio, data, 16000, engine.max_audio_seconds, upload.filename)
    except AudioError as e:
        raise APIError(400, str(e), param="file", code="invalid_audio") from None
    req = TranscriptionRequest(audio, language=language, task="translate" if task == "translate" else None,
                               timestamps=fmt in ("srt", "vtt", "verbose_json"), temperature=temperature,
                               prompt=prompt, word_timestamps="word" in grans)
    expect(request, _CHECK_FIELDS)  # the pipeline's checks raise InvalidRequest, answered by the app's handler
    out = await engine.transcribe(req)
    return _render(out, fmt, task, temperature, set(grans) or {"segment"})


def _stamp(t: float, sep: str) -> str:
    ms = int(round(t * 1000))
    h, ms = divmod(ms, 3600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def _render(out: Any, fmt: str, task: str, temperature: float, grans: set) -> Response:
    from max.pipelines.lib.transcription import language_name

    text = out.text.strip()
    if fmt == "json":
        return JSONResponse({"text": text})
    if fmt == "text":
        return PlainTextResponse(text + "\n")
    segs = [s for s in out.segments if s.text.strip()] or out.segments
    if fmt == "srt":
        body = "".join(f"{i}\n{_stamp(s.start, ',')} --> {_stamp(s.end, ',')}\n{s.text.strip()}\n\n"
                       for i, s in enumerate(segs, 1))
        return PlainTextResponse(body, media_type="application/x-subrip")
    if fmt == "vtt":
        body = "WEBVTT\n\n" + "".join(f"{_stamp(s.start, '.')} --> {_stamp(s.end, '.')}\n{s.text.strip()}\n\n"
                                      for s in segs)
        return PlainTextResponse(body, media_type="text/vtt")
    lang = "english" if task == "translate" else language_name(out.language)
    body: dict = {"task": "translate" if task == "translate" else "transcribe", "language": lang,
                  "duration": round(out.duration, 3), "text": text}
    if "word" in grans:
        body["words"] = [{"word": w.word.strip(), "start": round(w.start, 3), "end": round(w.end, 3)}
                         for w in out.words]
    if "segment" in grans:
        body["segments"] = [{"id": i, "seek": s.seek, "start": round(s.start, 3), "end": round(s.end, 3),
                             "text": s.text, "tokens": list(map(int, s.tokens)), "temperature": temperature}
                            for i, s in enumerate(out.segments)]
    body["usage"] = {"type": "duration", "seconds": int(-(-out.duration // 1))}
    return JSONResponse(body)
