"""Mimi (``architectures/mimi``) against transformers' ``MimiModel`` on tiny random checkpoints (saved with
``save_pretrained``; random codebooks and layer scales so every part matters): encode codes equal
``MimiModel.encode``'s, decode waveforms equal ``MimiModel.decode``'s within 1e-4, streaming chunks concatenate
to the whole decode for several chunkings, batched decode equals one-by-one decode, a live state dict under a
CSM-style prefix loads the same codec, fewer codebooks work as transformers' ``num_quantizers``, and bad
codes / waveforms / configs get clear errors that leave a stream's state untouched."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from max.pipelines.architectures.mimi import MimiCodec

# two shapes: depthwise upsampling with input/output projections of the quantiser; and grouped (not depthwise)
# upsampling, grouped-query attention with biases, two residual layers per stage, no projections, two semantic
# codebooks
CONFIGS = {
    "depthwise": dict(hidden_size=32, num_filters=4, upsampling_ratios=[4, 3, 2], codebook_size=16, codebook_dim=8,
                      num_quantizers=4, vector_quantization_hidden_dimension=8, num_hidden_layers=2,
                      intermediate_size=64, num_attention_heads=4, num_key_value_heads=4, sliding_window=5,
                      upsample_groups=32, sampling_rate=2400),
    "grouped": dict(hidden_size=16, num_filters=4, upsampling_ratios=[3, 2], codebook_size=32, codebook_dim=16,
                    num_quantizers=5, num_semantic_quantizers=2, vector_quantization_hidden_dimension=16,
                    num_hidden_layers=1, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
                    sliding_window=3, upsample_groups=4, num_residual_layers=2, kernel_size=5, sampling_rate=1200,
                    attention_bias=True),
}


def _tiny(name: str, seed: int = 0) -> transformers.MimiModel:
    torch.manual_seed(seed)
    m = transformers.MimiModel(transformers.MimiConfig(**CONFIGS[name])).eval()
    with torch.no_grad():  # a fresh model has all-zero codebooks and 0.01 layer scales
        for n, b in m.named_buffers():
            if n.endswith("embed_sum"):
                b.normal_()
            elif n.endswith("cluster_usage"):
                b.uniform_(0.5, 2.0)
        for n, p in m.named_parameters():
            if n.endswith("layer_scale.scale"):
                p.normal_(0.0, 0.5)
    return m


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    m = _tiny(request.param)
    d = tmp_path_factory.mktemp(f"mimi_{request.param}")
    m.save_pretrained(d)
    return m, MimiCodec.from_pretrained(d)


def _hf_decode(m, codes: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return m.decode(torch.from_numpy(codes)[None]).audio_values[0, 0].numpy()


def _hf_encode(m, wave: np.ndarray, n: int | None = None) -> np.ndarray:
    with torch.no_grad():
        return m.encode(torch.from_numpy(wave)[None, None], num_quantizers=n).audio_codes[0].numpy()


def _same_samples(got: np.ndarray, want: np.ndarray) -> None:
    """Equal up to float32 rounding of a different summation order (chunked vs whole): 1e-5 of the peak."""
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.abs(want).max())))


def _codes(codec: MimiCodec, frames: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, codec.codebook_size, (codec.num_codebooks, frames))


def test_sizes(pair):
    m, codec = pair
    c = m.config
    assert codec.sample_rate == c.sampling_rate
    assert codec.frame_rate == c.frame_rate
    assert codec.num_codebooks == c.num_quantizers
    assert codec.samples_per_frame == c.frame_size


@pytest.mark.parametrize("samples_per_frames", [0.02, 1.0, 3.0, 20.3])
def test_encode_equals_transformers(pair, samples_per_frames):
    m, codec = pair
    n = max(1, int(samples_per_frames * codec.samples_per_frame))
    t = np.arange(n) / codec.sample_rate
    rng = np.random.default_rng(n)
    wave = (0.5 * np.sin(2 * np.pi * 220 * t) + 0.2 * rng.standard_normal(n)).astype(np.float32)
    got = codec.encode(wave)
    ref = _hf_encode(m, wave)
    assert got.dtype == np.int64 and got.shape == ref.shape == (codec.num_codebooks, -(-n // codec.samples_per_frame))
    # nearest codes are searched with float64 distances, transformers' with float32 cdist: a tie closer than
    # float32 rounding could in principle pick another code; random codebooks have none, so codes are equal
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("frames", [1, 2, 9, 31])
def test_decode_equals_transformers(pair, frames):
    m, codec = pair
    codes = _codes(codec, frames, frames)
    got = codec.decode(codes)
    ref = _hf_decode(m, codes)
    assert got.dtype == np.float32 and got.shape == ref.shape == (frames * codec.samples_per_frame,)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4)


def test_encode_decode_round_trip_is_transformers(pair):
    m, codec = pair
    wave = np.random.default_rng(5).standard_normal(6 * codec.samples_per_frame).astype(np.float32) * 0.3
    with torch.no_grad():
        ref = m(torch.from_numpy(wave)[None, None]).audio_values[0, 0].numpy()
    np.testing.assert_allclose(codec.decode(codec.encode(wave)), ref, rtol=0, atol=1e-4)


@pytest.mark.parametrize("chunking", [[1] * 12, [5, 7], [2, 1, 4, 3, 2], "random"])
def test_streaming_chunks_equal_whole_decode(pair, chunking):
    _, codec = pair
    if chunking == "random":
        cuts = np.sort(np.random.default_rng(11).choice(np.arange(1, 23), 5, replace=False))
        chunking = np.diff([0, *cuts, 23]).tolist()
    codes = _codes(codec, sum(chunking), 7)
    whole = codec.decode(codes)
    state = codec.new_decode_state()
    parts, at = [], 0
    for n in chunking:
        part = codec.decode_chunk(codes[:, at:at + n], state)
        assert part.shape == (n * codec.samples_per_frame,)
        parts.append(part)
        at += n
    _same_samples(np.concatenate(parts), whole)
    assert state.frames == len(codes[0])


def test_streams_are_independent(pair):
    _, codec = pair
    a, b = _codes(codec, 6, 1), _codes(codec, 6, 2)
    sa, sb = codec.new_decode_state(), codec.new_decode_state()
    out_a, out_b = [], []
    for i in range(0, 6, 2):  # interleaved
        out_a.append(codec.decode_chunk(a[:, i:i + 2], sa))
        out_b.append(codec.decode_chunk(b[:, i:i + 2], sb))
    _same_samples(np.concatenate(out_a), codec.decode(a))
    _same_samples(np.concatenate(out_b), codec.decode(b))


def test_batched_streams_equal_their_whole_decodes(pair):
    _, codec = pair
    codes = [_codes(codec, 9, 20 + i) for i in range(3)]
    states = [codec.new_decode_state() for _ in codes]
    # per call: each stream's next chunk; equal lengths share a graph call, streams sit at different positions
    plan = [(2, 3, 2), (3, 3, 1), (4, 3, 6)]
    at = [0, 0, 0]
    parts: list[list[np.ndarray]] = [[], [], []]
    for sizes in plan:
        chunks = [codes[i][:, at[i]:at[i] + n] for i, n in enumerate(sizes)]
        for i, out in enumerate(codec.decode_chunks(chunks, states)):
            assert out.shape == (sizes[i] * codec.samples_per_frame,)
            parts[i].append(out)
            at[i] += sizes[i]
    for i in range(3):
        _same_samples(np.concatenate(parts[i]), codec.decode(codes[i]))
    with pytest.raises(ValueError, match="twice"):
        codec.decode_chunks([codes[0], codes[1]], [states[0], states[0]])
    with pytest.raises(ValueError, match="2 code chunks for 1 states"):
        codec.decode_chunks([codes[0], codes[1]], [states[0]])
    assert [st.frames for st in states] == [9, 9, 9]


def test_decode_batch_equals_single(pair):
    _, codec = pair
    reqs = [_codes(codec, n, 10 + n) for n in (3, 8, 1)]
    got = codec.decode_batch(reqs)
    assert len(got) == 3
    for g, c in zip(got, reqs):
        _same_samples(g, codec.decode(c))
    assert codec.decode_batch([]) == []


def test_state_dict_under_prefix_and_fewer_codebooks():
    m = _tiny("grouped", seed=3)
    # a live model's nested names (encoder.encoder_seanet ...), under the prefix a CSM checkpoint uses
    sd = {f"codec_model.{k}": v for k, v in m.state_dict().items()}
    sd["backbone_model.embed_tokens.weight"] = torch.zeros(4, 4)  # other tensors of the checkpoint are left alone
    codec = MimiCodec.from_state_dict(m.config.to_dict(), sd, prefix="codec_model.")
    codes = _codes(codec, 5, 4)
    np.testing.assert_allclose(codec.decode(codes), _hf_decode(m, codes), rtol=0, atol=1e-4)
    few = MimiCodec.from_state_dict(m.config.to_dict(), {k: v.numpy() for k, v in sd.items()}, prefix="codec_model.",
                                    num_codebooks=3)
    assert few.num_codebooks == 3
    np.testing.assert_allclose(few.decode(codes[:3]), _hf_decode(m, codes[:3]), rtol=0, atol=1e-4)
    wave = np.random.default_rng(0).standard_normal(200).astype(np.float32)
    np.testing.assert_array_equal(few.encode(wave), _hf_encode(m, wave, 3))
    with pytest.raises(ValueError, match="num_codebooks"):
        MimiCodec.from_state_dict(m.config.to_dict(), sd, prefix="codec_model.", num_codebooks=1)
    with pytest.raises(ValueError, match="no tensors under the prefix"):
        MimiCodec.from_state_dict(m.config.to_dict(), sd, prefix="nothing.")


def test_bad_codes_are_refused_and_leave_the_stream_alone(pair):
    _, codec = pair
    k, size = codec.num_codebooks, codec.codebook_size
    good = _codes(codec, 4, 0)
    state = codec.new_decode_state()
    first = codec.decode_chunk(good[:, :2], state)
    bad = [
        (np.full((k, 2), size), ValueError, "outside the codebook"),
        (np.full((k, 2), -1), ValueError, "outside the codebook"),
        (good[: k - 1], ValueError, "codebooks"),
        (np.zeros((k + 1, 2), np.int64), ValueError, "codebooks"),
        (good.astype(np.float32), TypeError, "integer"),
        (good[0], ValueError, r"\[num_codebooks, frames\]"),
        (good[None], ValueError, r"\[num_codebooks, frames\]"),
    ]
    for codes, exc, msg in bad:
        with pytest.raises(exc, match=msg):
            codec.decode_chunk(codes, state)
        with pytest.raises(exc, match=msg):
            codec.decode(codes)
        with pytest.raises(exc, match=msg):
            codec.decode_batch([good, codes])
    assert state.frames == 2
    rest = codec.decode_chunk(good[:, 2:], state)
    _same_samples(np.concatenate([first, rest]), codec.decode(good))
    with pytest.raises(TypeError, match="new_decode_state"):
        codec.decode_chunk(good, object())
    with pytest.raises(TypeError, match="list"):
        codec.decode_batch(good)
    assert codec.decode(good[:, :0]).shape == (0,)


def test_bad_waveforms_and_configs_are_refused(pair):
    m, codec = pair
    for wave, exc, msg in [
        (np.zeros(10, np.int16), TypeError, "float"),
        (np.zeros((2, 10), np.float32), ValueError, "mono"),
        (np.zeros(0, np.float32), ValueError, "empty"),
        (np.array([0.0, np.nan], np.float32), ValueError, "NaN"),
    ]:
        with pytest.raises(exc, match=msg):
            codec.encode(wave)
    sd = m.state_dict()
    for change, msg in [(dict(use_causal_conv=False), "causal"), (dict(pad_mode="reflect"), "pad_mode"),
                        (dict(sliding_window=None), "sliding_window")]:
        with pytest.raises(NotImplementedError, match=msg):
            MimiCodec.from_state_dict({**m.config.to_dict(), **change}, sd)
    with pytest.raises(ValueError, match="no tensor for"):
        MimiCodec.from_state_dict(m.config.to_dict(), {k: v for k, v in sd.items() if "decoder.decoder_seanet"
                                                       not in k})
