"""Whisper word-level timestamps: token start times equal ``generate(..., return_token_timestamps=True)`` of
transformers (cross-attention of ``alignment_heads``, median filter, dynamic time warping) on the tiny random
checkpoint of ``whisper_support``; the time warping and the median filter equal transformers' helpers on random
matrices; tokens group into words at spaces and punctuation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.whisper import generation_whisper as hf_gen

from whisper_support import speech, synthetic_voice, tiny_whisper_dir, whisper_pair

from max.pipelines.architectures.whisper.alignment import dtw_path, group_words, median_filter
from max.pipelines.architectures.whisper.transcribe import TranscriptionRequest

NEW = 16


@pytest.fixture(scope="module")
def tiny():
    return whisper_pair(tiny_whisper_dir(), attn_implementation="eager")


def _hf(hf, fe, a, **kw):
    inp = fe(a, sampling_rate=16000, return_tensors="pt", return_attention_mask=True)
    with torch.no_grad():
        g = hf.generate(inp.input_features, attention_mask=inp.attention_mask, max_new_tokens=NEW,
                        return_token_timestamps=True, **kw)
    return g["sequences"][0].tolist(), g["token_timestamps"][0].tolist()


@pytest.mark.parametrize("timestamps", [False, True])
def test_token_times_equal_generate(tiny, timestamps):
    pipe, hf, fe = tiny
    a = speech()[0]
    toks, ref = _hf(hf, fe, a, language="en", return_timestamps=timestamps)
    out = pipe.transcribe([TranscriptionRequest(a, language="en", max_new_tokens=NEW, timestamps=timestamps,
                                                word_timestamps=True)])[0]
    assert out.tokens == toks and len(out.token_times) == len(out.tokens)
    # the first window (transformers' later windows past the audio's end are degenerate: NaN weights)
    n = sum(len(seg.tokens) for seg in out.segments if seg.seek == 0)
    assert len(set(ref[:n])) > 2  # the times move: a real alignment to compare
    np.testing.assert_allclose(out.token_times[:n], ref[:n], atol=0.021)
    assert out.words and out.words[0].start == out.token_times[0]
    assert all(w.start <= w.end for w in out.words)
    assert all(b.start >= a.start for a, b in zip(out.words, out.words[1:]))


def test_batched_word_times_equal_alone(tiny):
    pipe = tiny[0]
    a, b = speech()[0], synthetic_voice(4.0, seed=3)
    reqs = [TranscriptionRequest(x, language="en", max_new_tokens=NEW, word_timestamps=True) for x in (a, b)]
    together = pipe.transcribe(reqs)
    for r, t in zip(reqs, together):
        alone = pipe.transcribe([r])[0]
        assert alone.tokens == t.tokens
        np.testing.assert_allclose(alone.token_times, t.token_times, atol=0.021)


def test_without_alignment_heads_is_a_clear_error(tiny):
    pipe = tiny[0]
    heads, pipe.settings.alignment_heads = pipe.settings.alignment_heads, []
    try:
        with pytest.raises(ValueError, match="alignment_heads"):
            pipe.transcribe([TranscriptionRequest(speech()[0], word_timestamps=True)])
    finally:
        pipe.settings.alignment_heads = heads


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 12), st.integers(1, 40), st.integers(0, 2 ** 31 - 1))
def test_dtw_equals_transformers(rows, cols, seed):
    m = np.random.default_rng(seed).standard_normal((rows, cols))
    if seed % 3 == 0:
        m = np.round(m)  # ties
    r, c = dtw_path(m)
    hr, hc = hf_gen._dynamic_time_warping(m)
    assert r.tolist() == hr.tolist() and c.tolist() == hc.tolist()


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 5), st.integers(1, 30), st.sampled_from([1, 3, 7]), st.integers(0, 2 ** 31 - 1))
def test_median_filter_equals_transformers(rows, cols, width, seed):
    x = np.random.default_rng(seed).standard_normal((2, rows, cols))
    ref = hf_gen._median_filter(torch.from_numpy(x), width).numpy()
    np.testing.assert_allclose(median_filter(x, width), ref, rtol=0, atol=1e-12)


def test_words_split_on_spaces_and_punctuation():
    pieces = {1: " Hello", 2: ",", 3: " wor", 4: "ld", 5: " (", 6: "it", 7: "'s", 8: ")", 9: " fine", 10: ".",
              99: "<|0.00|>"}
    toks = [99, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 99]
    times = [0.0, 0.1, 0.3, 0.4, 0.6, 0.8, 0.9, 1.0, 1.1, 1.2, 1.5, 1.6]
    words = group_words(toks, times, lambda ts: "".join(pieces[t] for t in ts), text_limit=50)
    assert [(w.word, w.start, w.end) for w in words] == [
        (" Hello,", 0.1, 0.4), (" world", 0.4, 0.8), (" (it's)", 0.8, 1.2), (" fine.", 1.2, 1.6)]
