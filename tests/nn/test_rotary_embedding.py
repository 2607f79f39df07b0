"""RoPE layers against Hugging Face transformers (float32, rtol 1e-5, atol 1e-5).

References: ``LlamaRotaryEmbedding`` + ``apply_rotary_pos_emb`` for applying,
and ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`` (llama3,
dynamic, yarn, longrope) for the frequency tables.  The absolute tolerance
covers float32 rounding of angles ``position * inv_freq`` in the reference.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from max.dtype import DType
from max.graph import Graph
from max import nn

from support import run_graph, session, tt
from support import test_device_ref as dev_ref

TOL = dict(rtol=1e-5, atol=1e-5)
N_HEADS, HEAD_DIM, THETA = 2, 16, 10000.0


def hf_config(max_pos: int, **rope: object) -> LlamaConfig:
    params = {"rope_type": "default", "rope_theta": THETA}
    params.update(rope)
    return LlamaConfig(hidden_size=N_HEADS * HEAD_DIM, num_attention_heads=N_HEADS, head_dim=HEAD_DIM,
                       max_position_embeddings=max_pos, rope_parameters=params)


def table_of(rope) -> np.ndarray:
    """Evaluate ``rope.freqs_cis_base()`` in a graph."""
    g = Graph("t", lambda: rope.freqs_cis_base(), input_types=[])
    (out,) = session().load(g).execute()
    return out.to_numpy()


def hf_table(inv_freq: torch.Tensor, positions: np.ndarray, scale: float = 1.0) -> np.ndarray:
    ang = torch.from_numpy(positions.astype(np.float32))[:, None] * inv_freq[None, :].float()
    return np.stack([ang.cos().numpy(), ang.sin().numpy()], -1) * scale


def apply_ours(rope, x: np.ndarray, start_pos=None) -> np.ndarray:
    shape = [x.shape[0], "seq", x.shape[2], x.shape[3]]
    (out,) = run_graph(lambda v: rope(v, start_pos=start_pos), [tt(DType.float32, shape)], x)
    return out


def apply_hf(hf_rope: LlamaRotaryEmbedding, x: np.ndarray, start: int, interleaved: bool) -> np.ndarray:
    """HF's rotate-half application; interleaved inputs are de-interleaved around it."""
    b, s, h, d = x.shape
    xt = torch.from_numpy(x)
    if interleaved:
        xt = torch.cat([xt[..., 0::2], xt[..., 1::2]], -1)
    q = xt.transpose(1, 2)  # (b, h, s, d)
    pos = torch.arange(start, start + s)[None].expand(b, s)
    cos, sin = hf_rope(q, pos)
    out, _ = apply_rotary_pos_emb(q, q, cos, sin)
    out = out.transpose(1, 2)
    if interleaved:
        half = d // 2
        out = torch.stack([out[..., :half], out[..., half:]], -1).reshape(b, s, h, d)
    return out.numpy()


def rand_x(seed: int, seq: int = 7, dim: int = HEAD_DIM) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, seq, N_HEADS, dim)).astype(np.float32)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("start", [None, 3])
def test_default_rope_matches_llama(interleaved, start):
    rope = nn.RotaryEmbedding(N_HEADS * HEAD_DIM, N_HEADS, THETA, 16, dev_ref(), interleaved=interleaved)
    assert rope.head_dim == HEAD_DIM
    x = rand_x(0)
    got = apply_ours(rope, x, start)
    want = apply_hf(LlamaRotaryEmbedding(hf_config(32)), x, start or 0, interleaved)
    np.testing.assert_allclose(got, want, **TOL)


def test_default_table_shape_and_values():
    rope = nn.RotaryEmbedding(N_HEADS * HEAD_DIM, N_HEADS, THETA, 16, dev_ref())
    t = table_of(rope)
    assert t.shape == (32, HEAD_DIM // 2, 2)
    inv, _ = LlamaRotaryEmbedding.compute_default_rope_parameters(hf_config(32))
    np.testing.assert_allclose(t, hf_table(inv, np.arange(32)), **TOL)
    assert rope.compute_scale() == pytest.approx(1 / math.sqrt(HEAD_DIM))
    assert rope.compute_scale(0.5) == 0.5


@pytest.mark.parametrize("interleaved", [False, True])
def test_llama3_rope_matches_hf(interleaved):
    params = nn.Llama3RopeScalingParams(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, orig_max_position=8)
    rope = nn.Llama3RotaryEmbedding(N_HEADS * HEAD_DIM, N_HEADS, 500000.0, 32, dev_ref(), interleaved=interleaved,
                                    scaling_params=params)
    cfg = hf_config(64, rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                    high_freq_factor=4.0, original_max_position_embeddings=8)
    inv, af = ROPE_INIT_FUNCTIONS["llama3"](cfg, None)
    assert af == 1.0
    np.testing.assert_allclose(table_of(rope), hf_table(inv, np.arange(64)), **TOL)
    x = rand_x(1)
    np.testing.assert_allclose(apply_ours(rope, x, 2), apply_hf(LlamaRotaryEmbedding(cfg), x, 2, interleaved), **TOL)


def test_llama3_without_scaling_is_default():
    a = nn.Llama3RotaryEmbedding(N_HEADS * HEAD_DIM, N_HEADS, THETA, 8, dev_ref())
    b = nn.RotaryEmbedding(N_HEADS * HEAD_DIM, N_HEADS, THETA, 8, dev_ref())
    np.testing.assert_array_equal(table_of(a), table_of(b))


@pytest.mark.parametrize("interleaved", [False, True])
def test_yarn_rope_matches_hf(interleaved):
    params = nn.YarnScalingParams(factor=4.0, beta_fast=32.0, beta_slow=1.0, original_max_position_embeddings=16,
                                  truncate=False)
    rope = nn.YarnRotaryEmbedding(N_HEADS * HEAD_DIM, N_HEADS, THETA, 32, dev_ref(), interleaved=interleaved,
                                  scaling_params=params)
    cfg = hf_config(64, rope_type="yarn", factor=4.0, beta_fast=32.0, beta_slow=1.0,
                    original_max_position_embeddings=16, truncate=False)
    inv, af = ROPE_INIT_FUNCTIONS["yarn"](cfg, None)
    assert af == pytest.approx(0.1 * math.log(4.0) + 1)
    np.testing.assert_allclose(table_of(rope), hf_table(inv, np.arange(64), af), **TOL)
    x = rand_x(2)
    np.testing.assert_allclose(apply_ours(rope, x), apply_hf(LlamaRotaryEmbedding(cfg), x, 0, interleaved), **TOL)


def test_yarn_truncate_matches_hf():
    params = nn.YarnScalingParams(4.0, 32.0, 1.0, 16, True)
    rope = nn.YarnRotaryEmbedding(N_HEADS * HEAD_DIM, N_HEADS, THETA, 8, dev_ref(), scaling_params=params)
    cfg = hf_config(64, rope_type="yarn", factor=4.0, beta_fast=32.0, beta_slow=1.0,
                    original_max_position_embeddings=16, truncate=True)
    inv, af = ROPE_INIT_FUNCTIONS["yarn"](cfg, None)
    np.testing.assert_allclose(table_of(rope), hf_table(inv, np.arange(16), af), **TOL)


def test_dynamic_rope_grows_and_reverts_like_hf():
    max_seq = 8
    rope = nn.DynamicRotaryEmbedding(N_HEADS * HEAD_DIM, N_HEADS, THETA, max_seq, dev_ref())
    cfg = hf_config(max_seq, rope_type="dynamic", factor=1.0)
    base_table = table_of(rope)
    inv0, _ = ROPE_INIT_FUNCTIONS["dynamic"](cfg, None, seq_len=max_seq)
    np.testing.assert_allclose(base_table, hf_table(inv0, np.arange(2 * max_seq)), **TOL)

    rope.maybe_update_freqs(np.arange(20)[None])  # seq_len 20 > 8: NTK base grows
    inv20, _ = ROPE_INIT_FUNCTIONS["dynamic"](cfg, None, seq_len=20)
    grown = table_of(rope)
    assert grown.shape == (40, HEAD_DIM // 2, 2)
    np.testing.assert_allclose(grown, hf_table(inv20, np.arange(40)), **TOL)
    x = rand_x(3, seq=20)
    got = apply_ours(rope, x)
    # HF applies the same frequencies (dynamic_rope_update recomputes them for seq_len 20)
    hf = LlamaRotaryEmbedding(hf_config(max_seq, rope_type="dynamic", factor=1.0))
    np.testing.assert_allclose(got, apply_hf(hf, x, 0, True), **TOL)

    rope.maybe_update_freqs([0, 1, 2])  # short again: original frequencies
    np.testing.assert_array_equal(table_of(rope), base_table)
    with pytest.raises(TypeError, match="host"):
        with Graph("g", input_types=[tt(DType.int64, [4])]) as g:
            rope.maybe_update_freqs(g.inputs[0])


def test_longrope_stitched_table_and_scale():
    half = HEAD_DIM // 2
    rng = np.random.default_rng(4)
    short = (1.0 + rng.random(half)).tolist()
    long = (1.0 + 10 * rng.random(half)).tolist()
    params = nn.LongRoPEScalingParams(short_factor=short, long_factor=long, original_max_position=8,
                                      max_position_embeddings=32)
    rope = nn.LongRoPERotaryEmbedding(N_HEADS * HEAD_DIM, N_HEADS, THETA, 16, dev_ref(), scaling_params=params)
    cfg = hf_config(32, rope_type="longrope", short_factor=short, long_factor=long,
                    original_max_position_embeddings=8)
    inv_short, af = ROPE_INIT_FUNCTIONS["longrope"](cfg, None, seq_len=8)
    inv_long, _ = ROPE_INIT_FUNCTIONS["longrope"](cfg, None, seq_len=9)
    t = table_of(rope)
    assert t.shape == (32, half, 2)
    pos = np.arange(32)
    np.testing.assert_allclose(t[:8], hf_table(inv_short, pos[:8]), **TOL)
    np.testing.assert_allclose(t[8:], hf_table(inv_long, pos[8:]), **TOL)
    # HF scales cos/sin by the attention factor; here it enters the softmax scale squared
    assert af == pytest.approx(math.sqrt(1 + math.log(4) / math.log(8)))
    assert rope.compute_scale() == pytest.approx(af * af / math.sqrt(HEAD_DIM))
    # applying: ours * af == HF (long factors, sequence longer than the original context)
    x = rand_x(5, seq=12)
    hf = LlamaRotaryEmbedding(cfg)
    want = apply_hf(hf, x, 0, False)
    ours = nn.LongRoPERotaryEmbedding(N_HEADS * HEAD_DIM, N_HEADS, THETA, 16, dev_ref(), interleaved=False,
                                      scaling_params=nn.LongRoPEScalingParams(long, long, 8, 32))
    np.testing.assert_allclose(apply_ours(ours, x) * af, want, **TOL)


def test_deepseek_yarn_matches_hf():
    rope_dim, factor = 8, 40.0
    params = nn.DeepseekYarnRopeScalingParams(scaling_factor=factor, original_max_position_embeddings=16,
                                              beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=0.8)
    rope = nn.DeepseekYarnRotaryEmbedding(rope_dim, N_HEADS, THETA, 24, dev_ref(), head_dim=24,
                                          scaling_params=params)
    cfg = LlamaConfig(hidden_size=N_HEADS * rope_dim, num_attention_heads=N_HEADS, head_dim=rope_dim,
                      max_position_embeddings=640,
                      rope_parameters={"rope_type": "yarn", "rope_theta": THETA, "factor": factor,
                                       "original_max_position_embeddings": 16, "beta_fast": 32, "beta_slow": 1,
                                       "mscale": 1.0, "mscale_all_dim": 0.8})
    inv, af = ROPE_INIT_FUNCTIONS["yarn"](cfg, None)
    t = table_of(rope)
    assert t.shape == (24, rope_dim // 2, 2)
    np.testing.assert_allclose(t, hf_table(inv, np.arange(24), af), **TOL)
    m = 0.1 * 0.8 * math.log(factor) + 1
    assert rope.compute_scale() == pytest.approx(m * m / math.sqrt(24))
    x = rand_x(6, seq=5, dim=rope_dim)
    np.testing.assert_allclose(apply_ours(rope, x), apply_hf(LlamaRotaryEmbedding(cfg), x, 0, True), **TOL)


def test_rope_errors_name_the_layer():
    rope = nn.RotaryEmbedding(N_HEADS * HEAD_DIM, N_HEADS, THETA, 8, dev_ref())
    with Graph("g", input_types=[tt(DType.float32, [1, 3, 2, 8]), tt(DType.int32, [1, 3, 2, 16])]) as g:
        with pytest.raises(ValueError, match="RotaryEmbedding.*last dim"):
            rope(g.inputs[0])
        with pytest.raises(TypeError, match="RotaryEmbedding.*floating"):
            rope(g.inputs[1])
    with pytest.raises(ValueError, match="short_factor"):
        nn.LongRoPERotaryEmbedding(32, 2, THETA, 8, dev_ref(), scaling_params=nn.LongRoPEScalingParams([1.0], [1.0], 8, 16))


@pytest.mark.parametrize("partial,factor", [(0.25, 1.0), (0.5, 2.0), (1.0, 1.0)])
def test_proportional_rope_matches_hf(partial, factor):
    """Gemma 4's proportional RoPE: a whole-head table whose frequencies past the rotated fraction are 0."""
    from max.nn.rotary_embedding import ProportionalRotaryEmbedding, rope_from_hf

    sc = {"rope_type": "proportional", "rope_theta": THETA, "partial_rotary_factor": partial, "factor": factor}
    rope = rope_from_hf(sc, max_position_embeddings=64, dim=N_HEADS * HEAD_DIM, n_heads=N_HEADS, theta=THETA,
                        max_seq_len=32, device=dev_ref(), interleaved=False)
    assert isinstance(rope, ProportionalRotaryEmbedding)
    inv, af = ROPE_INIT_FUNCTIONS["proportional"](hf_config(64, **sc), None)
    assert af == 1.0 and int((inv == 0).sum()) == HEAD_DIM // 2 - int(partial * HEAD_DIM // 2)
    np.testing.assert_allclose(table_of(rope), hf_table(inv, np.arange(64)), **TOL)
    x = rand_x(3)
    want = apply_hf(LlamaRotaryEmbedding(hf_config(64, **sc)), x, 1, False)
    np.testing.assert_allclose(apply_ours(rope, x, 1), want, **TOL)
