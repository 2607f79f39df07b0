"""``/v1/audio/transcriptions`` and ``/v1/audio/translations`` on a live server (the tiny random Whisper of
``whisper_support``) through the ``openai`` client: the text equals the pipeline's own transcription, every
response format renders, batched concurrent requests equal the alone ones, and bad uploads and fields get
OpenAI-shaped 400s naming the field while the server keeps serving."""

from __future__ import annotations

import concurrent.futures
import io
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

soundfile = pytest.importorskip("soundfile")
pytest.importorskip("soxr")
pytest.importorskip("multipart")

from whisper_support import speech, synthetic_voice, tiny_whisper_dir  # noqa: E402


def _wav(x: np.ndarray, rate: int = 16000, fmt: str = "WAV") -> bytes:
    b = io.BytesIO()
    soundfile.write(b, x, rate, format=fmt, subtype="FLOAT" if fmt == "WAV" else None)  # WAV: samples exact
    return b.getvalue()


@pytest.fixture(scope="module")
def whisper_server():
    from max.entrypoints.cli import build_config
    from max.serve.server import ServerThread, build_app

    app = build_app(build_config(tiny_whisper_dir(), None, "cpu", None, 4), served_model_name="whisper-tiny",
                    max_audio_seconds=60)
    with ServerThread(app) as srv:
        srv.state = app.state.serve
        yield srv


@pytest.fixture(scope="module")
def oa(whisper_server):
    import openai

    return openai.OpenAI(base_url=whisper_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def clip():
    return speech()[0]


def _direct(srv, audio, **kw):
    from max.pipelines.architectures.whisper.transcribe import TranscriptionRequest

    pipe = srv.state.transcriber.pipeline
    return pipe.transcribe([TranscriptionRequest(audio, **kw)])[0]


def test_transcription_json_equals_pipeline(whisper_server, oa, clip):
    r = oa.audio.transcriptions.create(model="whisper-tiny", file=("a.wav", _wav(clip)), language="en")
    ref = _direct(whisper_server, clip, language="en", task="transcribe")
    assert r.text == ref.text.strip()
    assert ref.tokens  # the model produced something to compare


def test_resampled_flac_and_stereo_are_decoded(whisper_server, oa, clip):
    import soxr

    x8k = soxr.resample(clip, 16000, 8000).astype(np.float32)
    stereo = np.stack([x8k, x8k], axis=1)
    r = oa.audio.transcriptions.create(model="whisper-tiny", file=("a.flac", _wav(stereo, 8000, "FLAC")),
                                       language="en", response_format="text")
    from max.pipelines.lib.audio import decode_audio

    back = decode_audio(_wav(stereo, 8000, "FLAC"))  # FLAC is 16-bit: compare on what the server decoded
    assert back.size == clip.size
    assert r.strip() == _direct(whisper_server, back, language="en", task="transcribe").text.strip()


def test_formats_verbose_srt_vtt(whisper_server, oa, clip):
    v = oa.audio.transcriptions.create(model="whisper-tiny", file=("a.wav", _wav(clip)), language="en",
                                       response_format="verbose_json", timestamp_granularities=["segment"])
    ref = _direct(whisper_server, clip, language="en", task="transcribe", timestamps=True)
    assert v.language == "english" and v.text == ref.text.strip()
    assert abs(v.duration - clip.size / 16000) < 1e-3
    assert [(s.start, s.end) for s in v.segments] == [(round(s.start, 3), round(s.end, 3)) for s in ref.segments]
    srt = oa.audio.transcriptions.create(model="whisper-tiny", file=("a.wav", _wav(clip)), language="en",
                                         response_format="srt")
    assert srt.startswith("1\n00:00:") and " --> " in srt
    vtt = oa.audio.transcriptions.create(model="whisper-tiny", file=("a.wav", _wav(clip)), language="en",
                                         response_format="vtt")
    assert vtt.startswith("WEBVTT\n\n00:00:") and " --> " in vtt


def test_verbose_json_word_timestamps(whisper_server, oa, clip):
    v = oa.audio.transcriptions.create(model="whisper-tiny", file=("a.wav", _wav(clip)), language="en",
                                       response_format="verbose_json", timestamp_granularities=["word"])
    ref = _direct(whisper_server, clip, language="en", task="transcribe", timestamps=True, word_timestamps=True)
    assert ref.words and v.text == ref.text.strip()
    assert [(w.word, w.start, w.end) for w in v.words] == [(w.word.strip(), round(w.start, 3), round(w.end, 3))
                                                           for w in ref.words]
    assert not v.segments  # only the granularities asked for
    both = oa.audio.transcriptions.create(model="whisper-tiny", file=("a.wav", _wav(clip)), language="en",
                                          response_format="verbose_json", timestamp_granularities=["word", "segment"])
    assert both.segments and len(both.words) == len(v.words)


def test_translation(whisper_server, oa, clip):
    r = oa.audio.translations.create(model="whisper-tiny", file=("a.wav", _wav(clip)))
    assert r.text == _direct(whisper_server, clip, task="translate").text.strip()


def test_concurrent_requests_equal_alone(whisper_server, oa, clip):
    clips = [clip, synthetic_voice(3.0, seed=5), clip[: clip.size // 2]]
    alone = [_direct(whisper_server, c, language="en", task="transcribe").text.strip() for c in clips]
    bad = _wav(clip)[:40]  # a broken header in the same burst: fails alone

    def send(i):
        if i == len(clips):
            try:
                oa.audio.transcriptions.create(model="whisper-tiny", file=("bad.wav", bad), language="en")
            except Exception as e:  # noqa: BLE001
                return e
            return None
        return oa.audio.transcriptions.create(model="whisper-tiny", file=("a.wav", _wav(clips[i])),
                                              language="en").text

    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(send, range(len(clips) + 1)))
    assert outs[:-1] == alone
    assert getattr(outs[-1], "status_code", None) == 400


def _post(srv, files=None, data=None, path="/v1/audio/transcriptions"):
    import httpx

    return httpx.post(srv.url + path, files=files, data=data, timeout=60)


@pytest.mark.parametrize("upload, param, words", [
    (b"", "file", "empty"),
    (b"not audio at all" * 20, "file", "could not be decoded"),
    ("long", "file", "maximum is 60"),
])
def test_bad_audio_is_a_400_naming_file(whisper_server, clip, upload, param, words):
    if upload == "long":
        upload = _wav(np.zeros(16000 * 61, np.float32))
    r = _post(whisper_server, files={"file": ("x.wav", upload)}, data={"model": "whisper-tiny"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"] and err["type"] == "invalid_request_error"
    assert _post(whisper_server, files={"file": ("a.wav", _wav(clip))}, data={"language": "en"}).status_code == 200


@pytest.mark.parametrize("data, param", [
    ({"response_format": "mp3"}, "response_format"),
    ({"temperature": "3"}, "temperature"),
    ({"temperature": "warm"}, "temperature"),
    ({"language": "klingon"}, "language"),
    ({"timestamp_granularities[]": "word", "response_format": "json"}, "timestamp_granularities"),
    ({"timestamp_granularities[]": "sentence", "response_format": "verbose_json"}, "timestamp_granularities"),
    ({"timestamp_granularities[]": "segment"}, "timestamp_granularities"),
    ({"model": "other-model"}, "model"),
    ({"bogus": "1"}, "bogus"),
])
def test_bad_fields_are_400s_naming_them(whisper_server, clip, data, param):
    r = _post(whisper_server, files={"file": ("a.wav", _wav(clip))}, data=data)
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param


def test_missing_file_and_wrong_content_type(whisper_server):
    import httpx

    r = _post(whisper_server, files={"other": ("x", b"1")}, data={"model": "whisper-tiny"})
    assert r.status_code == 400 and r.json()["error"]["param"] in ("file", "other")
    r = httpx.post(whisper_server.url + "/v1/audio/transcriptions", json={"model": "whisper-tiny"}, timeout=30)
    assert r.status_code == 415
    r = httpx.post(whisper_server.url + "/v1/chat/completions", json={"model": "whisper-tiny", "messages": [{"role": "user", "content": "hi"}]},
                   timeout=30)
    assert r.status_code == 400 and "speech recognition" in r.json()["error"]["message"]
    assert httpx.get(whisper_server.url + "/health", timeout=30).status_code == 200


def test_models_and_errors_name_the_model_alike():
    """A model served from a folder without --served-model-name is named by the folder's path, as a text model is:
    ``/v1/models`` lists it so and every error names it so (the path is public: it is the model's id); the
    folder's name is accepted as an alias; other paths in errors are still cut to their last component."""
    import httpx

    from max.entrypoints.cli import build_config
    from max.serve.openai_schemas import scrub_paths
    from max.serve.server import ServerThread, build_app

    d = tiny_whisper_dir()
    app = build_app(build_config(d, None, "cpu", None, 1))
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    with ServerThread(app) as srv:
        assert [m["id"] for m in httpx.get(srv.url + "/v1/models", timeout=30).json()["data"]] == [d]
        r = httpx.post(srv.url + "/v1/chat/completions", json={"model": "nope", **chat}, timeout=30)
        assert r.status_code == 404 and f"this server serves '{d}'" in r.json()["error"]["message"]
        for name in (d, os.path.basename(d)):
            r = httpx.post(srv.url + "/v1/chat/completions", json={"model": name, **chat}, timeout=30)
            assert r.status_code == 400 and f"the model '{d}' is a speech recognition model" in r.json()["error"][
                "message"]
        r = _post(srv, files={"file": ("a.wav", b"xx")}, data={"model": "nope"})
        assert r.status_code == 404 and f"serves '{d}'" in r.json()["error"]["message"]
    msg = scrub_paths(f"'{d}' cannot read {d}/config.json", keep=(d,))
    assert msg == f"'{d}' cannot read {d}/config.json"  # the kept name (a prefix of the file's path)
    assert scrub_paths(f"cannot read {d}/config.json") == "cannot read config.json"


def test_transcription_without_language_follows_the_generation_config(clip):
    """``/v1/audio/transcriptions`` with no language on a model with the released checkpoints' generation config:
    the detected language then <|transcribe|>, the pipeline's default request's text (verbose_json names the
    detected language); ``/v1/audio/translations`` translates."""
    import openai

    from whisper_support import released_whisper_dir

    from max.entrypoints.cli import build_config
    from max.pipelines.architectures.whisper.languages import LANGUAGE_CODES
    from max.serve.server import ServerThread, build_app

    app = build_app(build_config(released_whisper_dir(), None, "cpu", None, 2), served_model_name="rel")
    with ServerThread(app) as srv:
        srv.state = app.state.serve
        oa = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        ref = _direct(srv, clip, timestamps=True)
        assert ref.prompt[2] == 50359 and ref.tokens
        v = oa.audio.transcriptions.create(model="rel", file=("a.wav", _wav(clip)), response_format="verbose_json")
        names = {c: n for n, c in LANGUAGE_CODES.items()}
        assert v.text == ref.text.strip() and v.language == names.get(ref.language, ref.language)
        tr = oa.audio.translations.create(model="rel", file=("a.wav", _wav(clip)))
        want = _direct(srv, clip, task="translate")
        assert want.prompt[2] == 50358 and tr.text == want.text.strip()
        settings = srv.state.transcriber.pipeline.settings
        settings.is_multilingual = False  # as an English-only model: no translation, a 400 naming the model
        try:
            r = _post(srv, files={"file": ("a.wav", _wav(clip))}, data={"model": "rel"},
                      path="/v1/audio/translations")
            assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text
            assert "English-only" in r.json()["error"]["message"]
        finally:
            settings.is_multilingual = True
