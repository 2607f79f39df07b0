"""Sesame CSM against transformers' ``CsmForConditionalGeneration.generate`` on a tiny random checkpoint:
greedy frames (every codebook) alone, batched (requests of different lengths in one ragged batch), with a
request joining mid-generation (continuous batching), with a voice context (an earlier turn with audio,
encoded by the codec), and seeded sampling; streaming chunks concatenate to the codec's decoding of all
frames, with their metadata; bad input is a clear error naming the field; the registry resolves it.
The codec is libremax's own Mimi (``max.pipelines.architectures.mimi.MimiCodec``)."""

from __future__ import annotations

import numpy as np
import pytest

from max.interfaces import AudioGenerationRequest, GenerationStatus, PipelineTask, SamplingParams
from max.interfaces.errors import InvalidRequest
from tests.pipelines import csm_support as cs

_CODEC = None  # codec.CODEC_CLASS None: the native MimiCodec (csm_support.HFMimiCodec: transformers' Mimi)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from max.pipelines.architectures.csm import codec
    from max.pipelines.architectures.csm.pipeline import CsmPipeline
    from max.pipelines.lib import PipelineConfig

    before = codec.CODEC_CLASS
    codec.CODEC_CLASS = _CODEC
    d = cs.make_csm_dir(str(tmp_path_factory.mktemp("csm")))
    pipe = CsmPipeline(PipelineConfig(model_path=d, max_batch_size=4, kv_cache_page_size=16), chunk_frames=(2, 3))
    yield pipe, cs.hf_model(d), cs.hf_processor(d)
    codec.CODEC_CLASS = before


def _wave(seconds: float, seed: int = 0) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(int(24000 * seconds))).astype(np.float32)


def _run(pipe, ctxs):
    pipe.generate(ctxs)
    return [pipe.frames(c) for c in ctxs]


@pytest.mark.parametrize("text,speaker", [("Hello there world", 0), ("a", 3)])
def test_greedy_frames_equal_generate(tiny, text, speaker):
    pipe, hf, proc = tiny
    (ours,) = _run(pipe, [pipe.new_context(text, speaker, max_new_frames=8)])
    (ref,) = cs.hf_codes(hf, proc, [cs.conversation(text, speaker)], 8)
    assert ours.shape[1] == 4 and len(ref) > 0
    np.testing.assert_array_equal(ours, ref)


def test_batched_different_lengths_equal_generate(tiny):
    pipe, hf, proc = tiny
    cases = [("Hello there world, a longer sentence to say", 2), ("hi", 0), ("Three of them", 1)]
    ctxs = [pipe.new_context(t, s, max_new_frames=n) for (t, s), n in zip(cases, (7, 4, 6))]
    ours = _run(pipe, ctxs)
    assert [len(f) for f in ours] == [7, 4, 6]
    batched = cs.hf_codes(hf, proc, [cs.conversation(t, s) for t, s in cases], 7)  # left-padded batch
    for got, ref in zip(ours, batched):
        np.testing.assert_array_equal(got, ref[:len(got)])
    (alone,) = cs.hf_codes(hf, proc, [cs.conversation(*cases[1])], 4)
    np.testing.assert_array_equal(ours[1], alone)


def test_request_joining_mid_generation(tiny):
    pipe, hf, proc = tiny
    a = pipe.new_context("The first request", 0, max_new_frames=8)
    b = pipe.new_context("A second one joins", 1, max_new_frames=5)
    pipe.next_chunk({a.request_id: a})  # a is decoding when b's prompt arrives
    assert 0 < len(pipe.frames(a)) < 8
    pipe.generate([a, b])
    for c, (t, s, n) in zip((a, b), (("The first request", 0, 8), ("A second one joins", 1, 5))):
        (ref,) = cs.hf_codes(hf, proc, [cs.conversation(t, s)], n)
        np.testing.assert_array_equal(pipe.frames(c), ref)


def test_voice_context_equals_generate(tiny):
    pipe, hf, proc = tiny
    from max.pipelines.architectures.csm.pipeline import Turn

    wav, other = _wave(0.6), _wave(0.3, seed=1)
    turns = [(0, "an earlier turn", other), (1, "first words", wav)]
    ctx = pipe.new_context("Say it again", 1, [Turn(*t) for t in turns], max_new_frames=6)
    frames = pipe.codec.encode(wav)
    # one <|AUDIO|> position per codec frame of each context audio, in order
    assert ctx.audio_prompt_tokens.size == pipe.codec.encode(other).size + frames.size
    (ours,) = _run(pipe, [ctx])
    (ref,) = cs.hf_codes(hf, proc, [cs.conversation("Say it again", 1, turns)], 6)
    np.testing.assert_array_equal(ours, ref)
    ctx = pipe.new_context("Say it again", 1, [Turn(1, "first words", wav)], max_new_frames=6)
    (ours,) = _run(pipe, [ctx])
    (ref,) = cs.hf_codes(hf, proc, [cs.conversation("Say it again", 1, [(1, "first words", wav)])], 6)
    np.testing.assert_array_equal(ours, ref)
    # the same voice from its codes (AudioGenerationRequest.audio_prompt_tokens, frame-major)
    req = AudioGenerationRequest(request_id="r-voice", model="csm", input="Say it again",
                                 audio_prompt_tokens=frames.T.reshape(-1).tolist(),
                                 audio_prompt_transcription="first words",
                                 sampling_params=SamplingParams(top_k=1, max_new_tokens=6))
    (again,) = _run(pipe, [pipe.context_from_request(req, speaker=1)])
    np.testing.assert_array_equal(again, ref)


def test_seeded_sampling_equals_generate(tmp_path):
    import torch

    from max.pipelines.architectures.csm import codec
    from max.pipelines.architectures.csm.pipeline import CsmPipeline
    from max.pipelines.lib import PipelineConfig

    d = cs.make_csm_dir(str(tmp_path), do_sample=True, top_k=20, temperature=0.8, depth_decoder_do_sample=True,
                        depth_decoder_top_k=10, depth_decoder_temperature=0.7)
    before, codec.CODEC_CLASS = codec.CODEC_CLASS, _CODEC
    try:
        pipe = CsmPipeline(PipelineConfig(model_path=d, max_batch_size=4, kv_cache_page_size=16))
    finally:
        codec.CODEC_CLASS = before
    hf, proc = cs.hf_model(d), cs.hf_processor(d)
    runs = []
    for seed in (1, 1, 2):
        ctx = pipe.new_context("Hello there world", 0, sampling_params=pipe.default_sampling(seed), max_new_frames=8)
        runs.append(_run(pipe, [ctx])[0])
    np.testing.assert_array_equal(runs[0], runs[1])
    assert not np.array_equal(runs[0], runs[2])
    # batched, each request keeps its own generator: the same draws as alone
    ctxs = [pipe.new_context("Hello there world", 0, sampling_params=pipe.default_sampling(s), max_new_frames=8)
            for s in (2, 1)]
    both = _run(pipe, ctxs)
    np.testing.assert_array_equal(both[0], runs[2])
    np.testing.assert_array_equal(both[1], runs[0])
    torch.manual_seed(1)
    (ref,) = cs.hf_codes(hf, proc, [cs.conversation("Hello there world")], 8)
    np.testing.assert_array_equal(runs[0], ref)


def test_streaming_chunks_and_metadata(tiny):
    pipe, _, _ = tiny
    ctx = pipe.new_context("Stream this please", 0, max_new_frames=7)
    rid = ctx.request_id
    outs = []
    while True:
        out = pipe.next_chunk({rid: ctx})[rid]
        outs.append(out)
        if out.is_done:
            break
    frames = pipe.frames(ctx)
    assert [o.metadata.chunk_id for o in outs] == list(range(len(outs)))
    assert [o.metadata.final_chunk for o in outs] == [False] * (len(outs) - 1) + [True]
    assert len(outs) >= 3  # chunks of 2 then 3 frames
    whole = pipe.codec.decode(frames.T)
    np.testing.assert_allclose(np.concatenate([o.audio_data for o in outs]), whole, rtol=1e-5, atol=1e-5)
    sr = pipe.sample_rate
    for o in outs:
        assert o.metadata.sample_rate == sr and o.metadata.request_id == rid
        assert o.metadata.duration == pytest.approx(o.audio_data.size / sr)
    assert outs[-1].final_status in (GenerationStatus.MAXIMUM_LENGTH, GenerationStatus.END_OF_SEQUENCE)
    assert outs[-1].metadata.tokens_generated == len(frames) and ctx.is_done
    assert not pipe.model.kv_manager.contains(rid)  # pages freed when the request ended


def test_bad_input_is_a_clear_error(tiny):
    pipe, _, _ = tiny
    with pytest.raises(InvalidRequest, match="empty") as e:
        pipe.new_context("   ")
    assert e.value.param == "input"
    with pytest.raises(InvalidRequest) as e:
        pipe.new_context("hi", speaker=-1)
    assert e.value.param == "voice"
    with pytest.raises(InvalidRequest) as e:
        pipe.new_context("word " * 400)
    assert e.value.param == "input"
    from max.pipelines.architectures.csm.pipeline import Turn

    with pytest.raises(InvalidRequest):
        pipe.new_context("hi", 0, [Turn(0, "x", codes=np.full((4, 3), 999))])
    # a good request still runs after the bad ones
    (ours,) = _run(pipe, [pipe.new_context("hi", 0, max_new_frames=2)])
    assert ours.shape == (2, 4)


def test_registry_lists_and_resolves_csm(tiny):
    from max.pipelines.architectures.csm.pipeline import CsmPipeline
    from max.pipelines.lib.registry import PIPELINE_REGISTRY, register_all_models

    register_all_models()
    arch = PIPELINE_REGISTRY.architectures["CsmForConditionalGeneration"]
    assert arch.task is PipelineTask.AUDIO_GENERATION
    assert arch.pipeline_model.pipeline_class() is CsmPipeline


def test_max_generate_writes_the_speech(tiny, tmp_path, monkeypatch):
    import soundfile
    from click.testing import CliRunner

    from max.entrypoints.cli import main
    from max.pipelines.architectures.csm import codec

    pipe = tiny[0]
    monkeypatch.setattr(codec, "CODEC_CLASS", _CODEC)
    folder = str(pipe.pipeline_config.model_config.model_path)
    out = tmp_path / "x.wav"
    r = CliRunner().invoke(main, ["generate", "--model-path", folder, "--prompt", "Hello there world", "--voice", "2",
                                  "--max-new-tokens", "5", "--output", str(out), "--devices", "cpu"])
    assert r.exit_code == 0, r.output
    data, rate = soundfile.read(str(out), dtype="float32")
    (ref,) = pipe.generate([pipe.new_context("Hello there world", 2, max_new_frames=5)])
    assert rate == pipe.sample_rate
    # 16-bit WAV: one step of rounding, plus one for float32 summation order (the CLI decodes chunk by chunk)
    np.testing.assert_allclose(data, np.clip(ref, -1, 1), atol=2 / 32767)
    bad = CliRunner().invoke(main, ["generate", "--model-path", folder, "--prompt", "hi", "--voice", "nobody",
                                    "--output", str(tmp_path / "y.wav"), "--devices", "cpu"])
    assert bad.exit_code == 2 and "--voice" in bad.output
    bad = CliRunner().invoke(main, ["generate", "--model-path", folder, "--prompt", "hi",
                                    "--output", str(tmp_path / "y.ogg"), "--devices", "cpu"])
    assert bad.exit_code == 2 and "--output" in bad.output
