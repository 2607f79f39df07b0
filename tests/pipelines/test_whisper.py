"""Whisper (``WhisperForConditionalGeneration``) against transformers on a tiny random checkpoint with a
locally written tokenizer (``whisper_support``), on speech made by espeak-ng (or a synthetic voice when
espeak-ng cannot be had): log-mel features equal ``WhisperFeatureExtractor``'s, the encoder's cross-attention
keys/values equal transformers', and the tokens equal ``generate``'s for transcription, translation,
detected language, timestamps, a text prompt, long audio (window seeking), alone and batched."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from whisper_support import audio, synthetic_voice, tiny_whisper_dir, whisper_pair  # noqa: F401 (audio: a fixture)

from max.pipelines.architectures.whisper.features import log_mel_spectrogram
from max.pipelines.architectures.whisper.transcribe import TranscriptionRequest

NEW = 16


@pytest.fixture(scope="module")
def tiny():
    d = tiny_whisper_dir()
    return (d, *whisper_pair(d))


def _hf_tokens(hf, fe, a, **kw):
    feats = torch.from_numpy(fe(a, sampling_rate=16000, return_tensors="np").input_features)
    with torch.no_grad():
        return hf.generate(feats, max_new_tokens=NEW, **kw)[0].tolist()


def test_log_mel_equals_feature_extractor(tiny, audio):
    fe = tiny[3]
    ref = fe(audio, sampling_rate=16000, return_tensors="np").input_features[0]
    np.testing.assert_allclose(log_mel_spectrogram(audio), ref, rtol=0, atol=1e-5)
    long = np.concatenate([audio, synthetic_voice(31.0)])
    ref = fe(long, sampling_rate=16000, return_tensors="np", truncation=False, padding="longest").input_features[0]
    ours = log_mel_spectrogram(long, pad_to_window=False)
    assert ours.shape == ref.shape and ours.shape[1] > 3000
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-5)


def test_encoder_cross_keys_values_equal_transformers(tiny, audio):
    _, pipe, hf, fe = tiny
    feats = fe(audio, sampling_rate=16000, return_tensors="np").input_features
    k, v = pipe.model.encode(feats)  # each [1, layers, 1500, heads, head_dim]
    ours = (k.double(), v.double())
    with torch.no_grad():
        enc = hf.model.encoder(torch.from_numpy(feats)).last_hidden_state
        for i, layer in enumerate(hf.model.decoder.layers):
            for j, proj in enumerate((layer.encoder_attn.k_proj, layer.encoder_attn.v_proj)):
                ref = proj(enc).double().reshape(ours[j][:, i].shape)
                assert torch.allclose(ours[j][:, i], ref, atol=2e-4 * max(1.0, float(ref.abs().max())))


def test_cross_attention_reads_the_cross_cache(tiny, audio):
    """A window's encoder keys/values sit in the cross cache's pages (what cross_attention_ragged reads, natively
    on the CPU when the native kernels exist), and are released with the window."""
    from max.engine import native

    _, pipe, _, fe = tiny
    m = pipe.model
    feats = fe(audio, sampling_rate=16000, return_tensors="np").input_features
    k, v = m.encode(feats)  # [1, layers, 1500, heads, head_dim]
    free = m.cross_manager.slots_remaining
    cross = m.encode_cross(feats, ["cross-test"])
    try:
        assert m.cross_manager.slots_remaining == free - 1
        blocks = m.cross_manager.device_buffers[0]._torch()  # [pages, 2, layers, page_size, heads, head_dim]
        pages = cross.lookup[0].long()
        _, L, S, H, D = k.shape
        for plane, ref in ((0, k[0]), (1, v[0])):
            got = blocks[pages, plane].transpose(0, 1).reshape(L, -1, H, D)[:, :S]
            assert torch.equal(got, ref)
    finally:
        m.release_cross(cross)
    assert m.cross_manager.slots_remaining == free
    ops = {n.op for n in m.decoder._prog.nodes}
    assert ("cross_attention_ragged_native" if native.lib() is not None else "cross_attention_ragged") in ops


CASES = {
    "transcribe-en": dict(language="en"),
    "translate-de": dict(language="de", task="translate"),
    "timestamps": dict(language="en", timestamps=True),
    "detect-language": dict(),
}


def _hf_kw(kw):
    return dict(language=kw.get("language"), task=kw.get("task"), return_timestamps=kw.get("timestamps", False))


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_tokens_equal_generate(tiny, audio, case):
    _, pipe, hf, fe = tiny
    kw = CASES[case]
    out = pipe.transcribe([TranscriptionRequest(audio, max_new_tokens=NEW, **kw)])[0]
    assert out.tokens == _hf_tokens(hf, fe, audio, **_hf_kw(kw))
    assert len(out.tokens) >= NEW
    assert pipe.model.kv_manager.num_used_pages == 0  # every request's pages released


def test_detected_language_is_transformers(tiny, audio):
    _, pipe, hf, fe = tiny
    feats = torch.from_numpy(fe(audio, sampling_rate=16000, return_tensors="np").input_features)
    ref = int(hf.detect_language(feats)[0])
    out = pipe.transcribe([TranscriptionRequest(audio, max_new_tokens=1)])[0]
    assert pipe.settings.lang_to_id[f"<|{out.language}|>"] == ref


def test_batched_equals_alone(tiny, audio):
    _, pipe, hf, fe = tiny
    other = synthetic_voice(4.0, seed=3)
    reqs = [TranscriptionRequest(audio, max_new_tokens=NEW, **CASES["transcribe-en"]),
            TranscriptionRequest(other, max_new_tokens=NEW, **CASES["timestamps"]),
            TranscriptionRequest(audio[: audio.size // 2], max_new_tokens=NEW, **CASES["translate-de"])]
    outs = pipe.transcribe(reqs)
    for r, o in zip(reqs, outs):
        kw = {k: getattr(r, k) for k in ("language", "task") if getattr(r, k) is not None}
        assert o.tokens == _hf_tokens(hf, fe, r.audio, **_hf_kw({**kw, "timestamps": r.timestamps}))


def test_text_prompt_equals_prompt_ids(tiny, audio):
    d, pipe, hf, fe = tiny
    tok = transformers.AutoTokenizer.from_pretrained(d)
    ids = [tok.convert_tokens_to_ids("<|startofprev|>"), *tok.encode(" the other one", add_special_tokens=False)]
    out = pipe.transcribe([TranscriptionRequest(audio, language="en", max_new_tokens=NEW, prompt="the other one")])[0]
    assert out.tokens == _hf_tokens(hf, fe, audio, language="en", prompt_ids=torch.tensor(ids))


def test_long_audio_seeks_like_generate(tiny, audio):
    _, pipe, hf, fe = tiny
    long = np.concatenate([audio, synthetic_voice(20.0), audio, synthetic_voice(10.0, seed=1)]).astype(np.float32)
    inp = fe(long, sampling_rate=16000, return_tensors="pt", truncation=False, padding="longest",
             return_attention_mask=True)
    assert inp.input_features.shape[-1] > 3000
    out = pipe.transcribe([TranscriptionRequest(long, language="en", max_new_tokens=24, timestamps=True)])[0]
    with torch.no_grad():
        g = hf.generate(inp.input_features, attention_mask=inp.attention_mask, max_new_tokens=24, language="en",
                        return_timestamps=True, return_segments=True)
    assert out.tokens == g["sequences"][0].tolist()
    ref = [float(t) for s in g["segments"][0] for t in (s["start"], s["end"])]
    assert [t for s in out.segments for t in (s.start, s.end)] == pytest.approx(ref)
    assert pipe.model.encodes >= 2


@pytest.mark.parametrize("bad, match", [
    (np.zeros(0, np.float32), "empty"),
    (np.full(1600, np.nan, np.float32), "NaN"),
])
def test_bad_audio_is_a_clear_error(tiny, bad, match):
    with pytest.raises(ValueError, match=match):
        tiny[1].transcribe([TranscriptionRequest(bad)])


def test_bad_options_are_clear_errors(tiny, audio):
    pipe = tiny[1]
    with pytest.raises(ValueError, match="language 'xx' is not supported"):
        pipe.transcribe([TranscriptionRequest(audio, language="xx")])
    with pytest.raises(ValueError, match="task must be"):
        pipe.transcribe([TranscriptionRequest(audio, task="summarize")])
    assert pipe.transcribe([TranscriptionRequest(audio, language="german", max_new_tokens=2)])[0].language == "de"


def test_sampling_is_seeded(tiny, audio):
    pipe = tiny[1]

    def run(seed):
        return pipe.transcribe([TranscriptionRequest(audio, language="en", temperature=1.0, seed=seed,
                                                     max_new_tokens=8)])[0].tokens

    a = run(7)
    assert a == run(7) and len(a) >= 8  # a sampled timestamp may re-enter the window: more than 8
    assert any(run(s) != a for s in (8, 9, 10))
