"""The registry hands out the speech-recognition pipeline by task: a Whisper checkpoint transcribes (its
architecture's ``transcription_pipeline``), a causal LM does not (a ValueError naming its architecture), and
the task records (request, language table) live in ``max.pipelines.lib.transcription``."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from lm_support import make_tiny_llama  # noqa: E402
from whisper_support import speech, tiny_whisper_dir  # noqa: E402

from max.pipelines import PipelineConfig  # noqa: E402
from max.pipelines.lib.registry import PIPELINE_REGISTRY, register_all_models  # noqa: E402
from max.pipelines.lib.transcription import LANGUAGE_CODES, TranscriptionRequest, language_name  # noqa: E402


def test_whisper_transcribes_through_the_registry():
    from max.pipelines.architectures.whisper.transcribe import TranscriptionRequest as FamilyRequest
    from max.pipelines.architectures.whisper.transcribe import WhisperPipeline

    assert FamilyRequest is TranscriptionRequest  # the family implements the task's record
    register_all_models()
    cfg = PipelineConfig(model_path=tiny_whisper_dir(), device_specs="cpu")
    assert PIPELINE_REGISTRY.transcribes(cfg)
    pipe = PIPELINE_REGISTRY.retrieve_transcriber(cfg)
    assert isinstance(pipe, WhisperPipeline)
    clip = speech()[0]
    got = pipe.transcribe([TranscriptionRequest(clip, language="en", max_new_tokens=4)])[0]
    want = WhisperPipeline(cfg).transcribe([TranscriptionRequest(clip, language="en", max_new_tokens=4)])[0]
    assert got.tokens == want.tokens


def test_a_text_model_does_not_transcribe(tmp_path):
    register_all_models()
    cfg = PipelineConfig(model_path=make_tiny_llama(str(tmp_path / "llama")), device_specs="cpu")
    assert not PIPELINE_REGISTRY.transcribes(cfg)
    with pytest.raises(ValueError, match="LlamaForCausalLM does not transcribe speech"):
        PIPELINE_REGISTRY.retrieve_transcriber(cfg)


def test_language_table():
    assert LANGUAGE_CODES["german"] == "de"
    assert language_name("de") == "german" and language_name("xx") == "xx" and language_name(None) is None
