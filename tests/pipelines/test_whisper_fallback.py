"""Whisper's temperature fallback on long audio (transformers' ``generate`` with a temperature tuple,
``compression_ratio_threshold``, ``logprob_threshold``, ``no_speech_threshold``) on the tiny random checkpoint of
``whisper_support``: thresholds that pass leave the greedy tokens equal to transformers'; a no-speech threshold
that skips every window gives transformers' empty result; thresholds that fail every window retry each at every
temperature (seeded: the tokens equal transformers' under the same seed); the compression ratio equals transformers' measure."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.whisper import generation_whisper as hf_gen

from whisper_support import speech, synthetic_voice, tiny_whisper_dir, whisper_pair

from max.pipelines.architectures.whisper.transcribe import TranscriptionRequest, compression_ratio

NEW = 12
TEMPS = (0.0, 0.6)


@pytest.fixture(scope="module")
def tiny():
    return whisper_pair(tiny_whisper_dir())


@pytest.fixture(scope="module")
def long_audio():
    a = speech()[0]
    return np.concatenate([a, synthetic_voice(20.0), a, synthetic_voice(10.0, seed=1)]).astype(np.float32)


def _hf(hf, fe, a, **kw):
    inp = fe(a, sampling_rate=16000, return_tensors="pt", truncation=False, padding="longest",
             return_attention_mask=True)
    with torch.no_grad():
        g = hf.generate(inp.input_features, attention_mask=inp.attention_mask, max_new_tokens=NEW, language="en",
                        return_timestamps=True, temperature=TEMPS, **kw)
    return (g["sequences"] if isinstance(g, dict) else g)[0].tolist()


def _ours(pipe, a, seed=5, **kw):
    return pipe.transcribe([TranscriptionRequest(a, language="en", max_new_tokens=NEW, timestamps=True,
                                                 temperature=TEMPS, seed=seed, **kw)])[0]


def test_passing_thresholds_keep_greedy_tokens(tiny, long_audio):
    pipe, hf, fe = tiny
    th = dict(compression_ratio_threshold=100.0, logprob_threshold=-100.0)
    out = _ours(pipe, long_audio, **th)
    assert out.fallbacks == 0 and out.skipped_windows == 0
    assert out.tokens == _hf(hf, fe, long_audio, **th) and len(out.tokens) > NEW  # more than one window


def test_no_speech_skips_windows_like_generate(tiny, long_audio):
    pipe, hf, fe = tiny
    th = dict(logprob_threshold=0.0, no_speech_threshold=-1.0)  # every window "silent"
    out = _ours(pipe, long_audio, **th)
    assert out.skipped_windows >= 2 and out.tokens == [] and out.segments == []
    assert _hf(hf, fe, long_audio, **th) == []


def test_failing_thresholds_fall_back_through_every_temperature(tiny, long_audio):
    pipe, hf, fe = tiny
    greedy = _ours(pipe, long_audio)
    # no average log-probability is >= 0; a no-speech threshold no window reaches: no skip
    hot = _ours(pipe, long_audio, logprob_threshold=0.0, no_speech_threshold=1.0)
    assert hot.skipped_windows == 0
    windows = len({s.seek for s in hot.segments})
    assert windows >= 2 and hot.fallbacks == windows * (len(TEMPS) - 1)
    assert hot.tokens != greedy.tokens  # the last temperature's (sampled) result stands
    # transformers samples from the same generator state when seeded alike (its default top-k of 50 off: the
    # whole distribution, as Whisper samples)
    torch.manual_seed(5)
    assert hot.tokens == _hf(hf, fe, long_audio, logprob_threshold=0.0, no_speech_threshold=1.0, top_k=0)
    assert _ours(pipe, long_audio, logprob_threshold=0.0).tokens == hot.tokens  # seeded
    assert _ours(pipe, long_audio, seed=6, logprob_threshold=0.0).tokens != hot.tokens
    # short audio: the thresholds are not used (transformers' short-form rule); the first temperature decodes
    short = speech()[0]
    out = _ours(pipe, short, logprob_threshold=0.0)
    assert out.fallbacks == 0 and out.tokens == _ours(pipe, short).tokens


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 51864), min_size=1, max_size=60), st.sampled_from([1800, 51865, 70000]))
def test_compression_ratio_equals_transformers(tokens, vocab):
    tokens = [t % vocab for t in tokens]
    ref = hf_gen.WhisperGenerationMixin._retrieve_compression_ratio(torch.tensor(tokens), vocab)
    assert compression_ratio(tokens, vocab) == pytest.approx(ref)


def test_bad_temperatures_are_clear_errors(tiny):
    pipe = tiny[0]
    for bad in ((), (0.0, 3.0)):
        with pytest.raises(ValueError, match="temperature"):
            pipe.transcribe([TranscriptionRequest(speech()[0], temperature=bad)])
