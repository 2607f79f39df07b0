"""Whisper with the released multilingual checkpoints' token layout and generation config
(``whisper_support.released_whisper_dir``: vocabulary 51865, 99 languages, ``forced_decoder_ids`` ``[[1, null],
[2, <|transcribe|>]]``, the released suppressed tokens) against transformers' ``generate``, token for token and
prompt for prompt, for every combination of language (given / detected), task (none / transcribe / translate)
and timestamps (off / on), on espeak-ng speech (a synthetic voice where espeak-ng cannot be had); the detected
language equals ``detect_language``'s on several clips; with no language given the prompt is the detected
language then ``<|transcribe|>`` (it transcribes, not continues); long audio, a window run to the decoder's
end, batches and an English-only generation config match too; the token rules equal transformers' logits
processors on random logits."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from whisper_support import audio, released_whisper_dir, synthetic_voice, whisper_pair  # noqa: F401 (audio: a fixture)

from max.pipelines.architectures.whisper.decoding import needs_language, prompt_tokens
from max.pipelines.architectures.whisper.transcribe import TranscriptionRequest

NEW = 16
SOT, TRANSLATE, TRANSCRIBE, NOTIMESTAMPS = 50258, 50358, 50359, 50363


@pytest.fixture(scope="module")
def rel():
    d = released_whisper_dir()
    return (d, *whisper_pair(d))


class _Prompts:
    """The ``input_ids`` of every call of transformers' decoder (the prompt is the first call of more than one
    token: detection reads ``<|startoftranscript|>`` alone, later steps one token each)."""

    def __init__(self, hf):
        self.calls: list[list[int]] = []
        self.handle = hf.model.decoder.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, mod, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.calls.append(ids[0].tolist())

    def prompt(self) -> list[int]:
        return next(c for c in self.calls if len(c) > 1)

    def close(self):
        self.handle.remove()


def _hf(hf, fe, a, max_new_tokens=NEW, **kw):
    """``(generated tokens, decoder prompt)`` of transformers' ``generate`` on one short clip."""
    feats = torch.from_numpy(fe(a, sampling_rate=16000, return_tensors="np").input_features)
    spy = _Prompts(hf)
    try:
        with torch.no_grad():
            out = hf.generate(feats, max_new_tokens=max_new_tokens, **kw)[0].tolist()
    finally:
        spy.close()
    return out, spy.prompt()


def test_layout_is_the_released_one(rel):
    s = rel[1].settings
    assert len(s.lang_to_id) == 99 and s.lang_to_id["<|en|>"] == 50259 and max(s.lang_to_id.values()) == 50357
    assert s.task_to_id == {"translate": TRANSLATE, "transcribe": TRANSCRIBE}
    assert s.no_timestamps_token_id == NOTIMESTAMPS and s.timestamp_begin == 50364 and s.prev_sot_token_id == 50361
    # the generation config's forced ids, not the model config's older [[1, <|en|>], [2, ...], [3, ...]]
    assert s.forced_decoder_ids == [(1, None), (2, TRANSCRIBE)]
    assert len(s.suppress_tokens) == 88 and s.begin_suppress_tokens == [220, 50257]
    assert rel[1].model.config.vocab_size == 51865


COMBOS = list(itertools.product(["de", None], [None, "transcribe", "translate"], [False, True]))


@pytest.mark.parametrize("language, task, timestamps", COMBOS,
                         ids=[f"{lang or 'detect'}-{task or 'default'}-{'ts' if ts else 'nots'}"
                              for lang, task, ts in COMBOS])
def test_tokens_and_prompt_equal_generate(rel, audio, language, task, timestamps):
    _, pipe, hf, fe = rel
    out = pipe.transcribe([TranscriptionRequest(audio, language=language, task=task, timestamps=timestamps,
                                                max_new_tokens=NEW)])[0]
    ref, ref_prompt = _hf(hf, fe, audio, language=language, task=task, return_timestamps=timestamps)
    assert out.prompt == ref_prompt
    assert out.tokens == ref
    assert len(out.tokens) >= 4  # enough tokens to tell prompts apart
    if timestamps:
        assert any(t >= 50364 for t in out.tokens)  # the timestamp rules were exercised
    lang = out.prompt[1]
    assert out.language == next(k.strip("<|>") for k, v in pipe.settings.lang_to_id.items() if v == lang)
    want = [SOT, lang, {None: TRANSCRIBE, "transcribe": TRANSCRIBE, "translate": TRANSLATE}[task]]
    assert out.prompt == want + ([] if timestamps else [NOTIMESTAMPS])  # never without its task token
    assert pipe.model.kv_manager.num_used_pages == 0


def test_detected_language_equals_detect_language(rel, audio):
    _, pipe, hf, fe = rel
    tone = (0.5 * np.sin(2 * np.pi * 440 * np.arange(32000) / 16000)).astype(np.float32)
    clips = [audio, np.zeros(16000, np.float32), synthetic_voice(2.0, seed=1), tone,
             np.random.default_rng(3).standard_normal(16000 * 2).astype(np.float32) * 0.1]  # 5 > max_batch_size
    outs = pipe.transcribe([TranscriptionRequest(c, max_new_tokens=1) for c in clips])
    feats = torch.from_numpy(fe(clips, sampling_rate=16000, return_tensors="np").input_features)
    ref = hf.detect_language(feats).tolist()
    assert [o.prompt[1] for o in outs] == ref
    assert len(set(ref)) >= 2, [o.language for o in outs]  # the audio decides (on this random model: two languages)


def test_prompt_rules():
    """The prompt as transformers builds it from the generation config, including configs other than the
    released one: a fixed forced language (no detection), forced <|notimestamps|> dropped with timestamps,
    no forced ids at all (no task token after a detected language, as transformers)."""
    from max.pipelines.architectures.whisper.config import GenerationSettings

    s = GenerationSettings(decoder_start_token_id=SOT, eos_token_id=50257, no_timestamps_token_id=NOTIMESTAMPS,
                           lang_to_id={"<|en|>": 50259, "<|de|>": 50261},
                           task_to_id={"translate": TRANSLATE, "transcribe": TRANSCRIBE},
                           forced_decoder_ids=[(1, None), (2, TRANSCRIBE)])
    assert needs_language(s, None, None) and needs_language(s, None, "translate") and not needs_language(s, 50261,
                                                                                                        None)
    assert prompt_tokens(s, None, False, detected_id=50261) == [SOT, 50261, TRANSCRIBE, NOTIMESTAMPS]
    assert prompt_tokens(s, None, True, language_id=50259) == [SOT, 50259, TRANSCRIBE]
    assert prompt_tokens(s, "translate", True, detected_id=50259) == [SOT, 50259, TRANSLATE]
    s.forced_decoder_ids = [(1, 50259), (2, TRANSCRIBE), (3, NOTIMESTAMPS)]
    assert not needs_language(s, None, None) and needs_language(s, None, "transcribe")
    assert prompt_tokens(s, None, False) == [SOT, 50259, TRANSCRIBE, NOTIMESTAMPS]
    assert prompt_tokens(s, None, True) == [SOT, 50259, TRANSCRIBE]
    assert prompt_tokens(s, None, True, language_id=50261) == [SOT, 50261, TRANSCRIBE]
    s.forced_decoder_ids = []
    assert prompt_tokens(s, None, False, detected_id=50261) == [SOT, 50261, NOTIMESTAMPS]
    assert prompt_tokens(s, None, False, previous=None, language_id=50261) == [SOT, 50261, TRANSCRIBE, NOTIMESTAMPS]


def test_bad_forced_decoder_ids_are_a_clear_error():
    from max.pipelines.architectures.whisper.config import _forced_ids

    assert _forced_ids([[1, None], [2, 5]]) == [(1, None), (2, 5)]
    assert _forced_ids([[2, 5]]) == []  # not starting at position 1: ignored, as transformers does
    with pytest.raises(ValueError, match="positions 1, 2"):
        _forced_ids([[1, None], [3, 5]])
    with pytest.raises(ValueError, match="pairs"):
        _forced_ids([[1]])


def test_a_window_run_to_the_end_equals_generate(rel, audio):
    """No max_new_tokens, no language, timestamps: the window ends where transformers' does (the end token, or
    the generation config's max_length within the decoder's positions)."""
    _, pipe, hf, fe = rel
    out = pipe.transcribe([TranscriptionRequest(audio, timestamps=True)])[0]
    ref, ref_prompt = _hf(hf, fe, audio, max_new_tokens=None, return_timestamps=True)
    assert out.prompt == ref_prompt and out.tokens == ref
    tb = pipe.settings.timestamp_begin
    for seek in {seg.seek for seg in out.segments}:  # times never go back within a window
        stamps = [t for seg in out.segments if seg.seek == seek for t in seg.tokens if t >= tb]
        assert stamps == sorted(stamps)


def test_long_audio_without_language_equals_generate(rel, audio):
    _, pipe, hf, fe = rel
    long = np.concatenate([audio, synthetic_voice(24.0), audio, synthetic_voice(8.0, seed=1)]).astype(np.float32)
    inp = fe(long, sampling_rate=16000, return_tensors="pt", truncation=False, padding="longest",
             return_attention_mask=True)
    out = pipe.transcribe([TranscriptionRequest(long, max_new_tokens=24)])[0]
    with torch.no_grad():
        g = hf.generate(inp.input_features, attention_mask=inp.attention_mask, max_new_tokens=24,
                        return_timestamps=True, return_segments=True)
    assert out.tokens == g["sequences"][0].tolist()
    ref = [float(t) for s in g["segments"][0] for t in (s["start"], s["end"])]
    assert [t for s in out.segments for t in (s.start, s.end)] == pytest.approx(ref)
    assert out.prompt[2] == TRANSCRIBE


def test_batched_combinations_equal_alone(rel, audio):
    _, pipe, hf, fe = rel
    other = synthetic_voice(4.0, seed=3)
    reqs = [TranscriptionRequest(audio, max_new_tokens=NEW),
            TranscriptionRequest(other, task="translate", timestamps=True, max_new_tokens=NEW),
            TranscriptionRequest(audio[: audio.size // 2], language="fr", max_new_tokens=NEW)]
    outs = pipe.transcribe(reqs)
    for r, o in zip(reqs, outs):
        ref, prompt = _hf(hf, fe, r.audio, language=r.language, task=r.task, return_timestamps=r.timestamps)
        assert (o.prompt, o.tokens) == (prompt, ref)


def test_english_only_generation_config(rel, audio):
    """``is_multilingual: false``: no language or task may be chosen (transformers refuses both; here English and
    transcribe are accepted as what the model does anyway, anything else is a clear error), and the prompt is
    still the generation config's (detection, as transformers does while ``lang_to_id`` is there)."""
    from max.interfaces.errors import InvalidRequest

    _, pipe, hf, fe = rel
    pipe.settings.is_multilingual = hf.generation_config.is_multilingual = False
    try:
        out = pipe.transcribe([TranscriptionRequest(audio, max_new_tokens=8)])[0]
        ref, prompt = _hf(hf, fe, audio, max_new_tokens=8)
        assert (out.prompt, out.tokens) == (prompt, ref)
        assert pipe.settings.lang_to_id[f"<|{out.language}|>"] == out.prompt[1]  # the prompt's language
        with pytest.raises(ValueError, match="English-only"):
            _hf(hf, fe, audio, language="en")
        same = pipe.transcribe([TranscriptionRequest(audio, language="english", task="transcribe",
                                                     max_new_tokens=8)])[0]
        assert (same.prompt, same.tokens) == (out.prompt, out.tokens)
        for kw, param in ((dict(language="de"), "language"), (dict(task="translate"), "task")):
            with pytest.raises(InvalidRequest, match="English-only") as e:
                pipe.transcribe([TranscriptionRequest(audio, **kw)])
            assert e.value.param == param
    finally:
        pipe.settings.is_multilingual = hf.generation_config.is_multilingual = True


def test_token_rules_equal_transformers_processors(rel):
    """The token rules on random logits after histories that reach every timestamp rule (first step and
    max_initial_timestamp, an open pair, a closed pair, times never going back, the summed timestamp probability
    forcing a timestamp) equal transformers' SuppressTokensAtBegin + SuppressTokens + WhisperTimeStamp processors
    (the order ``generate`` builds them in), with and without timestamps."""
    from transformers.generation.logits_process import (
        SuppressTokensAtBeginLogitsProcessor,
        SuppressTokensLogitsProcessor,
        WhisperTimeStampLogitsProcessor,
    )

    from max.pipelines.architectures.whisper.decoding import TokenRules

    _, pipe, hf, _ = rel
    s, gc = pipe.settings, hf.generation_config
    V, tb = 51865, 50364
    prompt = [SOT, 50261, TRANSCRIBE]
    histories = [[], [tb + 3], [tb + 3, 400], [tb + 3, 400, tb + 40], [tb + 3, 400, tb + 40, tb + 40],
                 [tb, 500, 501, tb + 90, tb + 90, 77], [123, 456], [tb + 10, 9, tb + 30, tb + 30, 8, tb + 60]]
    rng = np.random.default_rng(0)
    rules = TokenRules(s, V)
    forced = 0
    for h in histories:
        for boost in (0.0, 4.0):  # 4: timestamps' summed probability beats the best text token's
            x = rng.standard_normal(V).astype(np.float32) * 3
            x[tb:] += boost
            for ts in (False, True):
                procs = [SuppressTokensAtBeginLogitsProcessor(gc.begin_suppress_tokens, len(prompt)),
                         SuppressTokensLogitsProcessor(gc.suppress_tokens)]
                if ts:
                    procs.append(WhisperTimeStampLogitsProcessor(gc, begin_index=len(prompt)))
                ids = torch.tensor([prompt + h])
                ref = torch.from_numpy(x.copy())[None]
                for p in procs:
                    ref = p(ids, ref)
                got = rules.apply(x.copy()[None], [list(h)], [ts])[0]
                np.testing.assert_array_equal(got, ref[0].numpy())
                forced += int(ts and bool(h) and h[-1] < tb and bool(np.isneginf(got[:tb]).all()))
    assert forced >= 1  # the summed-probability rule decided at least once
