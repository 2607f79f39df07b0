"""``bench/generate.py``'s roofline figures: the weight bytes a decoded token reads, from the GGUF file."""

from __future__ import annotations

import importlib.util
import os

import gguf
import numpy as np
import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "generate.py")


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("bench_generate", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write(path, tensors):
    w = gguf.GGUFWriter(str(path), "llama")
    for name, (arr, raw) in tensors.items():
        w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()


@pytest.mark.parametrize("tied", [False, True])
def test_weight_bytes_per_token(gen, tmp_path, tied):
    """Every tensor counts whole except the input embedding table (one row), which counts whole when it is
    also the output projection (no output.weight); bytes as stored, and the same values as parameters."""
    rng = np.random.default_rng(0)
    T = gguf.GGMLQuantizationType
    emb = gguf.quants.quantize(rng.standard_normal((40, 64)).astype(np.float32), T.Q8_0)  # 40 rows x 2 blocks
    q = gguf.quants.quantize(rng.standard_normal((16, 64)).astype(np.float32), T.Q4_0)
    norm = np.ones(64, np.float32)
    tensors = {"token_embd.weight": (emb, T.Q8_0), "blk.0.attn_q.weight": (q, T.Q4_0),
               "blk.0.attn_norm.weight": (norm, None)}
    if not tied:
        tensors["output.weight"] = (q.copy(), T.Q4_0)
    path = tmp_path / "m.gguf"
    _write(path, tensors)
    got = gen.weight_bytes(str(path))
    emb_bytes = emb.nbytes if tied else emb.nbytes // 40
    want = emb_bytes + q.nbytes * (1 if tied else 2) + norm.nbytes
    assert emb.nbytes == 40 * 2 * 34 and q.nbytes == 16 * 2 * 18
    assert got["quant"] == want
    assert got["params"] == (40 * 64 if tied else 64) + 16 * 64 * (1 if tied else 2) + 64
    assert gen.engine_weight_bytes("llama.cpp", got) == want
    assert gen.engine_weight_bytes("libremax:bfloat16", got) == 2 * got["params"]
    assert gen.engine_weight_bytes("libremax:float32", got) == 4 * got["params"]


def test_context_lengths_are_checked(gen):
    assert gen.parse_contexts("2048") == (2048,)
    assert gen.parse_contexts("512, 4096") == (512, 4096)
    assert gen.parse_contexts(None) == ()
    for bad in ("0", "x", "-3"):
        with pytest.raises(SystemExit, match="--context"):
            gen.parse_contexts(bad)


def test_long_prompts_repeat_the_text(gen):
    """A context longer than the fixed text repeats it, so ``--context 4096`` gets 4,096 tokens."""
    enc = lambda s: [ord(c) for c in s]  # noqa: E731
    dec = lambda ids: "".join(map(chr, ids))  # noqa: E731
    n = len(gen.fixed_text()) * 2 + 5
    out = gen.prompt_of(enc, dec, n)
    assert len(out) == n and out.startswith(gen.fixed_text()) and out[len(gen.fixed_text()):].startswith(gen.fixed_text()[:100])
