"""``max transcribe FILE``: prints the pipeline's text for a WAV written by espeak-ng (or a synthetic voice),
timed segments with ``--timestamps``, timed words with ``--word-timestamps``, and a one-line error for a file that is not audio."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from click.testing import CliRunner

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

soundfile = pytest.importorskip("soundfile")

from whisper_support import speech, tiny_whisper_dir  # noqa: E402

from max.entrypoints.cli import main  # noqa: E402


def test_transcribe_prints_the_pipelines_text(tmp_path):
    from max.pipelines import PipelineConfig
    from max.pipelines.architectures.whisper.transcribe import TranscriptionRequest, WhisperPipeline

    d = tiny_whisper_dir()
    clip = speech()[0]
    wav = tmp_path / "speech.wav"
    soundfile.write(str(wav), clip, 16000, subtype="FLOAT")
    r = CliRunner().invoke(main, ["transcribe", str(wav), "--model-path", d, "--language", "en", "--devices", "cpu",
                                  "--timestamps", "--max-new-tokens", "8"])
    assert r.exit_code == 0, r.output
    pipe = WhisperPipeline(PipelineConfig(model_path=d, device_specs="cpu"))
    want = pipe.transcribe([TranscriptionRequest(clip, language="en", task="transcribe", timestamps=True,
                                                    max_new_tokens=8)])[0]
    assert r.stdout.splitlines() == [f"[{s.start:7.2f} --> {s.end:7.2f}] {s.text.strip()}" for s in want.segments]
    assert "real-time factor" in r.stderr
    r = CliRunner().invoke(main, ["transcribe", str(wav), "--model-path", d, "--language", "en", "--devices", "cpu",
                                  "--word-timestamps", "--max-new-tokens", "8"])
    assert r.exit_code == 0, r.output
    want = pipe.transcribe([TranscriptionRequest(clip, language="en", task="transcribe", max_new_tokens=8,
                                                 word_timestamps=True)])[0]
    assert want.words
    assert r.stdout.splitlines() == [f"[{w.start:7.2f} --> {w.end:7.2f}] {w.word.strip()}" for w in want.words]


def test_transcribe_fallback_thresholds_reach_the_pipeline(tmp_path):
    from whisper_support import synthetic_voice

    d = tiny_whisper_dir()
    clip = np.concatenate([speech()[0], synthetic_voice(32.0)]).astype(np.float32)  # long audio: two windows
    wav = tmp_path / "long.wav"
    soundfile.write(str(wav), clip, 16000, subtype="FLOAT")
    base = ["transcribe", str(wav), "--model-path", d, "--language", "en", "--devices", "cpu", "--max-new-tokens", "6"]
    r = CliRunner().invoke(main, base)
    assert r.exit_code == 0, r.output
    assert r.stdout.strip()
    # every window "silent" (its average log-probability is below 0, its no-speech probability above -1)
    r = CliRunner().invoke(main, [*base, "--temperature-increment", "0.5", "--logprob-threshold", "0",
                                  "--no-speech-threshold", "-1"])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == ""
    assert "0 window(s) decoded again, 2 skipped as silence" in r.stderr


def test_transcribe_bad_file_is_one_line_error(tmp_path):
    bad = tmp_path / "notes.wav"
    bad.write_bytes(b"plain text, not audio" * 10)
    r = CliRunner().invoke(main, ["transcribe", str(bad), "--model-path", tiny_whisper_dir()])
    assert r.exit_code != 0
    assert "could not be decoded" in r.output and "Traceback" not in r.output
    _ = np


def test_transcribe_default_follows_the_generation_config(tmp_path):
    """No --language, no --task on a model with the released checkpoints' generation config: espeak-ng speech
    goes through detection then <|transcribe|> (the checkpoint's forced_decoder_ids), plain and with
    --timestamps, and prints the pipeline's text for the same default request."""
    from whisper_support import released_whisper_dir

    from max.pipelines import PipelineConfig
    from max.pipelines.architectures.whisper.transcribe import TranscriptionRequest, WhisperPipeline

    clip, how = speech()
    if how != "espeak-ng":
        pytest.skip(f"no espeak-ng speech: {how}")
    d = released_whisper_dir()
    wav = tmp_path / "speech.wav"
    soundfile.write(str(wav), clip, 16000, subtype="FLOAT")
    pipe = WhisperPipeline(PipelineConfig(model_path=d, device_specs="cpu"))
    for extra, ts in (([], False), (["--timestamps"], True)):
        r = CliRunner().invoke(main, ["transcribe", str(wav), "--model-path", d, "--devices", "cpu",
                                      "--max-new-tokens", "8", *extra])
        assert r.exit_code == 0, r.output
        want = pipe.transcribe([TranscriptionRequest(clip, timestamps=ts, max_new_tokens=8)])[0]
        assert want.prompt[2] == 50359 and want.prompt[1] in pipe.settings.lang_to_id.values()
        if ts:
            assert r.stdout.splitlines() == [f"[{s.start:7.2f} --> {s.end:7.2f}] {s.text.strip()}"
                                             for s in want.segments]
        else:
            assert r.stdout.strip() == want.text.strip()
