"""The native CPU kernels (max.engine.native) against independent references.

Every kernel is checked in every variant of this architecture (``build.VARIANTS``: avx512, avxvnni,
avx2 and generic on x86; neondot, neon and generic on ARM) that this CPU can execute -- an AVX-512
host runs the AVX2 and portable C variants too -- against the same references (gguf's dequantizer,
float64 numpy/torch).  A variant this CPU cannot execute is reported as skipped with the reason.
The ARM variants are also checked on x86 under qemu (``test_native_kernels_arm.py``).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf import quants  # noqa: E402

from max.engine import native  # noqa: E402
from support import q8_activation_reference  # noqa: E402

if native.lib() is None:  # pragma: no cover - no C compiler on this machine
    pytest.skip(f"native kernels unavailable: {native.error()}", allow_module_level=True)

from max.engine.native import build  # noqa: E402

ISAS = [pytest.param(v, marks=pytest.mark.skipif(v not in native.runnable(),
                                                  reason=f"this CPU cannot execute the {v} kernels"))
        for v, (arch, _, _) in build.VARIANTS.items() if build._arch_matches(arch)]
ALL_KINDS = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
PACKABLE = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
K_QUANTS = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}
# fp16 scale fields of the K-quant blocks (gguf cannot make K-quants: random codes, sane scales)
_SCALE_BYTES = {"Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def blocks(kind: str, n: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind not in K_QUANTS:
        return quants.quantize(rng.standard_normal((n, k)).astype(np.float32), T[kind])
    bs, ts = gguf.GGML_QUANT_SIZES[T[kind]]
    b = rng.integers(0, 256, (n, k // bs, ts), dtype=np.uint8)
    scales = (rng.uniform(0.002, 0.02, (n, k // bs, 1))).astype(np.float16).view(np.uint8)
    for o in _SCALE_BYTES[kind]:
        b[:, :, o:o + 2] = scales
    return b.reshape(n, -1)


def deq(kind: str, b: np.ndarray, n: int, k: int) -> np.ndarray:
    return quants.dequantize(b, T[kind]).reshape(n, k).astype(np.float32)


def q8_ref(x: np.ndarray, w: np.ndarray, kind: str, mode: str = "packed") -> np.ndarray:
    """The float64 reference of a quantised matmul of weights of ``kind`` in ``mode``: 8-bit activation codes,
    refined over each row's selected blocks by the packed kernels only."""
    return q8_activation_reference(x, w, refine=0 if mode == "ggml" else None)


def kdim(kind: str, mult: int) -> int:
    return (256 if kind in K_QUANTS else 32) * mult



@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "Q6_K"])
def test_pack_of_a_mapped_checkpoint_goes_in_chunks_and_equals_one_call(kind, tmp_path, monkeypatch):
    """Blocks viewing a mapped file are packed a few rows at a time (their file pages dropped after each
    chunk): the same bytes as one call, the file untouched."""
    from max.graph.weights import mapped

    n, k = 203, kdim(kind, 2)  # chunks of 16-row groups and a partial last group
    b = blocks(kind, n, k, 2)
    code = native.GGML_KINDS[kind]
    whole = native.pack(torch.from_numpy(b), code, n, k)  # plain memory: one call
    path = tmp_path / "w.bin"
    b.tofile(path)
    mm = np.memmap(path, dtype=np.uint8, mode="c", shape=b.shape)
    mapped.register(mm.ctypes.data, mm.nbytes)
    calls = []
    real = native.lib()

    class Spy:
        def __getattr__(self, name):
            return getattr(real, name)

        def lmx_pack(self, *args):
            calls.append(args[2])
            return real.lmx_pack(*args)

    monkeypatch.setattr(native, "PACK_CHUNK_BYTES", 48 * b.shape[1])
    monkeypatch.setattr(native, "lib", lambda *a: Spy())
    try:
        chunked = native.pack(torch.from_numpy(mm), code, n, k)
    finally:
        mapped.unregister(mm.ctypes.data)
    assert calls == [48, 48, 48, 48, 11]
    assert torch.equal(chunked, whole)
    np.testing.assert_array_equal(np.fromfile(path, dtype=np.uint8).reshape(b.shape), b)


@pytest.mark.parametrize("nbytes", [1, 4096, (2 << 20) - 1, (2 << 20) + 17, 5 << 20])
def test_huge_empty_is_a_writable_aligned_buffer_of_that_size(nbytes):
    """Packed weights live in huge_empty's buffers: exactly nbytes of uint8, writable, independent of each
    other, 2 MiB-aligned (the alignment a transparent huge page needs) once they reach 2 MiB."""
    a, b = native.huge_empty(nbytes), native.huge_empty(nbytes)
    assert a.dtype == torch.uint8 and a.shape == (nbytes,) and a.is_contiguous()
    a.fill_(7)
    b.fill_(9)
    assert int(a.sum()) == 7 * nbytes and int(b.sum()) == 9 * nbytes
    if nbytes >= 2 << 20:
        assert a.data_ptr() % (2 << 20) == 0 and b.data_ptr() % (2 << 20) == 0


def test_packed_weights_of_several_thread_items_equal_one_thread():
    """The threads take a packed matmul's 16-row groups as work items in turn (dynamic schedule): a weight
    of many items gives bit for bit what one thread computes, whatever thread took which item."""
    from max.engine import threads

    n, k = 16 * 2000, 256  # 4.7 MB of Q4_K: several work items (smaller weights are one share per thread)
    b = blocks("Q4_K", n, k, 5)
    code = native.GGML_KINDS["Q4_K"]
    plan = native.MatmulPlan([native.pack(torch.from_numpy(b), code, n, k)], [code], ["packed"], [n], k)
    x = torch.randn(3, k)
    before = torch.get_num_threads()
    try:
        threads.apply(1)
        one = [plan(x[i:i + 1]) for i in range(3)]
        threads.apply(max(2, before))
        for _ in range(5):
            for i in range(3):
                assert torch.equal(plan(x[i:i + 1]), one[i])
    finally:
        threads.apply(before)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", PACKABLE)
def test_pack_is_lossless(kind, isa):
    """Every row of a packed weight decodes to exactly gguf's dequantisation (bit for bit)."""
    so = native.lib(isa)
    n, k = 37, kdim(kind, 2)  # 37: a partial last group of 16 rows
    b = blocks(kind, n, k, 1)
    code = native.GGML_KINDS[kind]
    packed = torch.empty(so.lmx_packed_bytes(code, n, k), dtype=torch.uint8)
    src = torch.from_numpy(b)
    assert so.lmx_pack(code, src.data_ptr(), n, k, b.shape[1], packed.data_ptr()) == 0
    assert packed.numel() == native.packed_nbytes(code, n, k)
    ref = deq(kind, b, n, k)
    out = torch.empty(k)
    for r in range(n):
        assert so.lmx_packed_row(code, packed.data_ptr(), n, k, r, out.data_ptr()) == 0
        np.testing.assert_array_equal(out.numpy().view(np.uint32), ref[r].view(np.uint32), err_msg=f"row {r}")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", ALL_KINDS)
def test_dequant_rows_and_gather_bit_exact(kind, isa):
    so = native.lib(isa)
    n, k = 6, kdim(kind, 2)
    b = blocks(kind, n, k, 2)
    ref = deq(kind, b, n, k)
    src = torch.from_numpy(b)
    ids = torch.tensor([5, 0, 5, 3], dtype=torch.int64)
    out = torch.empty(4, k)
    assert so.lmx_gather_rows(native.GGML_KINDS[kind], src.data_ptr(), n, b.shape[1], k, ids.data_ptr(), 4,
                              out.data_ptr()) == 0
    np.testing.assert_array_equal(out.numpy().view(np.uint32), ref[[5, 0, 5, 3]].view(np.uint32))
    bad = torch.tensor([1, 6], dtype=torch.int64)
    assert so.lmx_gather_rows(native.GGML_KINDS[kind], src.data_ptr(), n, b.shape[1], k, bad.data_ptr(), 2,
                              out.data_ptr()) == 2  # the 1-based position of the first bad id


@pytest.mark.parametrize("isa", ISAS)
@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(ALL_KINDS), m=st.integers(1, 19), n=st.integers(1, 70),
       kmult=st.integers(1, 3), packed=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_quantized_matmul_matches_q8_reference(kind, isa, m, n, kmult, packed, seed):
    """x (8-bit codes per 32 values) @ dequantize(W).T: integer sums are exact, so only float
    rounding separates the kernel from the float64 reference -- both layouts, every M tile."""
    if packed and kind not in PACKABLE:
        packed = False
    so = native.lib(isa)
    k = kdim(kind, kmult)
    b = blocks(kind, n, k, seed)
    w = deq(kind, b, n, k)
    rng = np.random.default_rng(seed + 1)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 10)).astype(np.float32)
    code = native.GGML_KINDS[kind]
    src = torch.from_numpy(b)
    bias = torch.from_numpy(rng.standard_normal(n).astype(np.float32))
    if packed:
        wt, mode = native.pack(src, code, n, k), "packed"
    else:
        wt, mode = src, "ggml"
    plan = native.MatmulPlan([wt], [code], [mode], [n], k, [bias], so=so)
    y = plan(torch.from_numpy(x)).numpy()
    ref = q8_ref(x, w, kind, mode) + bias.numpy()
    np.testing.assert_allclose(y, ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind,mode", [("Q4_1", "packed"), ("Q8_0", "packed"), ("Q4_K", "packed"), ("Q5_K", "packed"),
                                       ("Q6_K", "packed"), ("Q5_0", "packed"), ("Q4_0", "packed"), ("Q5_1", "packed"),
                                       ("Q3_K", "ggml"), ("Q8_0", "ggml"),
                                       ("F32", "dense"), ("BF16", "dense")])
def test_matmul_rows_do_not_depend_on_the_batch(isa, kind, mode):
    """A row's result is bit-identical whether it is computed alone or among M others, at any position
    (greedy speculative decoding and ragged batching rely on it: verifying 5 tokens must give the
    logits that decoding them one by one gives)."""
    so = native.lib(isa)
    rng = np.random.default_rng(11)
    n, k, m = 37, 512, 21
    x = torch.from_numpy((rng.standard_normal((m, k)) * 3).astype(np.float32))
    if mode == "dense":
        w = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32))
        w = w.bfloat16() if kind == "BF16" else w
        plan = native.MatmulPlan([w], [native.dense_kind(w.dtype)], ["dense"], [n], k, so=so)
    else:
        code = native.GGML_KINDS[kind]
        src = torch.from_numpy(blocks(kind, n, k, 5))
        plan = native.MatmulPlan([native.pack(src, code, n, k) if mode == "packed" else src], [code], [mode], [n],
                                 k, so=so)
    full = plan(x).numpy()
    for i in (0, 7, 8, 13, 20):
        np.testing.assert_array_equal(plan(x[i:i + 1]).numpy()[0].view(np.uint32), full[i].view(np.uint32))
    # batch sizes on both sides of every switch between the AVX2 kernels' register tiles and their
    # weight-stationary order (M = 2, 3, 5, 6), and across its 16-row tiles (21)
    for a, b in ((3, 12), (0, 2), (5, 8), (8, 12), (10, 15), (12, 18), (1, 8), (2, 9), (4, 15), (6, 18)):
        np.testing.assert_array_equal(plan(x[a:b]).numpy().view(np.uint32), full[a:b].view(np.uint32))


@pytest.mark.parametrize("isa", ISAS)
@settings(max_examples=15, deadline=None)
@given(kinds=st.lists(st.sampled_from(PACKABLE), min_size=1, max_size=3), m=st.integers(1, 9),
       n=st.integers(1, 40), with_bias=st.booleans(), norm=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_packed_matmul_residual_epilogue(isa, kinds, m, n, with_bias, norm, seed):
    """lmx_packed_matmul_res: ``(x @ W^T + b) + r`` is bit for bit the packed matmul followed by a float32
    add of ``r`` (rows with a stride), for every kind, M tile and partial group of 16 rows, with and without
    biases and a fused RMSNorm; and close to the float64 reference."""
    so = native.lib(isa)
    rng = np.random.default_rng(seed)
    k = max(kdim(kind, 1) for kind in kinds)
    ws, codes, ns, biases, refs = [], [], [], [], []
    x = (rng.standard_normal((m, k)) * 2).astype(np.float32)
    for j, kind in enumerate(kinds):
        b = blocks(kind, n + j, k, seed + j)
        code = native.GGML_KINDS[kind]
        ws.append(native.pack(torch.from_numpy(b), code, n + j, k))
        codes.append(code)
        ns.append(n + j)
        biases.append(torch.from_numpy(rng.standard_normal(n + j).astype(np.float32)) if with_bias else None)
        refs.append(q8_ref(x, deq(kind, b, n + j, k), kind) + (biases[-1].numpy() if with_bias else 0))
    gamma = (torch.from_numpy(rng.uniform(0.5, 1.5, k).astype(np.float32)), 1e-5) if norm else None
    plan = native.MatmulPlan(ws, codes, ["packed"] * len(kinds), ns, k, biases, so=so, norm=gamma)
    total = sum(ns)
    r_full = torch.from_numpy(rng.standard_normal((m, total + 3)).astype(np.float32) * 4)
    r = r_full[:, 1:total + 1]  # a strided view
    xt = torch.from_numpy(x)
    got = plan(xt, residual=r)
    want = torch.add(r, plan(xt))
    np.testing.assert_array_equal(got.numpy().view(np.uint32), want.numpy().view(np.uint32))
    if not norm:
        ref = np.concatenate(refs, axis=1) + r.double().numpy()
        np.testing.assert_allclose(got.numpy(), ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())
    dense = native.MatmulPlan([torch.ones(4, k)], [native.dense_kind(torch.float32)], ["dense"], [4], k, so=so)
    with pytest.raises(ValueError, match="packed"):
        dense(xt, residual=torch.zeros(m, 4))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("act", [0, 1])
@pytest.mark.parametrize("m", [1, 3, 9])
def test_packed_matmul_glu_is_the_matmul_then_the_gate(isa, act, m):
    """lmx_packed_matmul_glu (gate and up projections, then act(gate) * up, in one call) is bit for bit
    lmx_packed_matmul followed by lmx_glu (I = 40: a partial vector tail), with a fused RMSNorm; and close
    to the float64 reference."""
    so = native.lib(isa)
    rng = np.random.default_rng(act + 10 * m)
    k, i = 64, 40
    bs = [blocks(kind, i, k, j) for j, kind in enumerate(("Q4_1", "Q8_0"))]
    codes = [native.GGML_KINDS["Q4_1"], native.GGML_KINDS["Q8_0"]]
    ws = [native.pack(torch.from_numpy(b), c, i, k) for b, c in zip(bs, codes)]
    plan = native.MatmulPlan(ws, codes, ["packed", "packed"], [i, i], k, so=so)
    (fn, args, _), = plan.calls
    x = torch.from_numpy((rng.standard_normal((m, k)) * 2).astype(np.float32))
    for gamma in (None, torch.from_numpy(rng.uniform(0.5, 1.5, k).astype(np.float32))):
        nwp = 0 if gamma is None else gamma.data_ptr()
        gu = torch.empty(m, 2 * i)
        assert fn(m, k, x.data_ptr(), k, *args, gu.data_ptr(), 2 * i, 0, nwp, ctypes.c_float(1e-5)) == 0
        want = torch.empty(m, i)
        so.lmx_glu(gu.data_ptr(), m, i, 2 * i, act, want.data_ptr(), i)
        got = torch.full((m, i + 3), 7.0)
        assert so.lmx_packed_matmul_glu(m, k, x.data_ptr(), k, *args, got.data_ptr(), i + 3, 0, nwp,
                                        ctypes.c_float(1e-5), act) == 0
        np.testing.assert_array_equal(got[:, :i].numpy().view(np.uint32), want.numpy().view(np.uint32))
        assert bool((got[:, i:] == 7.0).all())  # only the output's columns are written
    g = q8_ref(x.numpy(), deq("Q4_1", bs[0], i, k), "Q4_1")
    u = q8_ref(x.numpy(), deq("Q8_0", bs[1], i, k), "Q8_0")
    a = g / (1 + np.exp(-g)) if act == 0 else 0.5 * g * (1 + np.tanh(0.7978845608028654 * (g + 0.044715 * g**3)))
    nogamma = torch.empty(m, i)
    so.lmx_packed_matmul_glu(m, k, x.data_ptr(), k, *args, nogamma.data_ptr(), i, 0, 0, ctypes.c_float(1e-5), act)
    np.testing.assert_allclose(nogamma.numpy(), a * u, rtol=1e-4, atol=1e-4 * np.abs(a * u).max())


@pytest.mark.parametrize("isa", ISAS)
def test_multi_weight_plan_mixes_modes_and_kinds(isa):
    """One call over q/k/v-like weights of different kinds and layouts writes each its columns."""
    so = native.lib(isa)
    rng = np.random.default_rng(3)
    k = 512
    specs = [("Q4_K", "packed", 32), ("dense32", "dense", 16), ("Q8_0", "packed", 16), ("Q3_K", "ggml", 8),
             ("dense16", "dense", 24), ("Q6_K", "packed", 16)]
    ws, codes, modes, ns, refs, x = [], [], [], [], [], rng.standard_normal((5, k)).astype(np.float32)
    for kind, mode, n in specs:
        if mode == "dense":
            t = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32))
            t = t.half() if kind == "dense16" else t
            ws.append(t)
            codes.append(native.dense_kind(t.dtype))
            refs.append(x.astype(np.float64) @ t.double().numpy().T)
        else:
            b = blocks(kind, n, k, n)
            code = native.GGML_KINDS[kind]
            src = torch.from_numpy(b)
            ws.append(native.pack(src, code, n, k) if mode == "packed" else src)
            codes.append(code)
            refs.append(q8_ref(x, deq(kind, b, n, k), kind, mode))
        modes.append(mode)
        ns.append(n)
    y = native.MatmulPlan(ws, codes, modes, ns, k, so=so)(torch.from_numpy(x)).numpy()
    ref = np.concatenate(refs, axis=1)
    np.testing.assert_allclose(y, ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())


@pytest.mark.parametrize("isa", ISAS)
@settings(max_examples=20, deadline=None)
@given(m=st.integers(1, 20), n=st.integers(1, 40), k=st.integers(1, 300),
       dtype=st.sampled_from(["float32", "bfloat16", "float16"]), seed=st.integers(0, 2**31 - 1))
def test_dense_matmul_matches_float64(isa, m, n, k, dtype, seed):
    """Dense weights in their [N, K] layout: float32 accumulation of float32 x times the exactly widened
    weight."""
    so = native.lib(isa)
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g).to(getattr(torch, dtype))
    x = torch.randn(m, k, generator=g)
    y = native.MatmulPlan([w], [native.dense_kind(w.dtype)], ["dense"], [n], k, so=so)(x)
    ref = x.double() @ w.double().T
    scale = float((x.double().abs() @ w.double().abs().T).max()) + 1e-30
    assert float((y.double() - ref).abs().max()) <= 1e-6 * scale


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("m", [9, 17, 23])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dense_matmul_over_l2_sized_weight_chunks(isa, m, dtype):
    """More than 8 activation rows over a weight larger than one L2 chunk (several chunks per thread,
    a partial last chunk, partial row blocks): every output element still equals float64."""
    so = native.lib(isa)
    g = torch.Generator().manual_seed(m)
    n, k = 1001, 97
    w = torch.randn(n, k, generator=g).to(getattr(torch, dtype))
    x = torch.randn(m, k, generator=g)
    y = native.MatmulPlan([w], [native.dense_kind(w.dtype)], ["dense"], [n], k, so=so)(x)
    ref = x.double() @ w.double().T
    scale = float((x.double().abs() @ w.double().abs().T).max())
    assert float((y.double() - ref).abs().max()) <= 1e-6 * scale


@pytest.mark.parametrize("isa", ISAS)
def test_rmsnorm_and_glu(isa):
    so = native.lib(isa)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(7, 150, generator=g) * 3
    w = torch.randn(150, generator=g)
    out = torch.empty(7, 150)
    so.lmx_rmsnorm(x.data_ptr(), 7, 150, 150, w.data_ptr(), ctypes.c_float(1e-5), out.data_ptr(), 150)
    xd = x.double()
    ref = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    assert torch.allclose(out.double(), ref, rtol=1e-5, atol=1e-5)
    gu = torch.randn(5, 2 * 99, generator=g) * 4
    for act, fn in ((0, lambda a: torch.nn.functional.silu(a)),
                    (1, lambda a: torch.nn.functional.gelu(a, approximate="tanh"))):
        o = torch.empty(5, 99)
        so.lmx_glu(gu.data_ptr(), 5, 99, 2 * 99, act, o.data_ptr(), 99)
        gd = gu.double()
        assert torch.allclose(o.double(), fn(gd[:, :99]) * gd[:, 99:], rtol=1e-5, atol=1e-5)


def assert_paged_attention(out, q, kv, lens, lookup, offs, page, layer, group, causal, window, scale=0.25,
                           chunk=-1):
    """``out`` of a paged attention over the float64 cache ``kv`` ``[pages, 2, layers, page, hkv, d]`` equals
    a dense float64 softmax(q k^T * scale) v per query, with the causal / sliding-window / chunked mask
    (``chunk > 0``: keys of the query's own chunk of ``chunk`` positions only)."""
    h = q.shape[1]
    for b, (c, n) in enumerate(lens):
        total = c + n
        pos = torch.arange(total)
        k_ = kv[lookup[b, pos // page], 0, layer, pos % page]  # [L, hkv, d]
        v_ = kv[lookup[b, pos // page], 1, layer, pos % page]
        for i in range(n):
            qpos = c + i
            keep = torch.ones(total, dtype=torch.bool)
            if causal:
                keep &= pos <= qpos
                if window > 0:
                    keep &= pos > qpos - window
                if chunk > 0:
                    keep &= pos // chunk == qpos // chunk
            for hh in range(h):
                s = (k_[keep, hh // group] @ q[offs[b] + i, hh].double()) * scale
                ref = torch.softmax(s, 0) @ v_[keep, hh // group]
                assert torch.allclose(out[offs[b] + i, hh].double(), ref, rtol=1e-4, atol=1e-5)


def _paged_cache(rng, pages, layers, page, hkv, d, dtype):
    blocks = torch.from_numpy(rng.standard_normal((pages, 2, layers, page, hkv, d)).astype(np.float32))
    return blocks.to(dtype)


@pytest.mark.parametrize("isa", ISAS)
@settings(max_examples=40, deadline=None)
@given(lens=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 9)), min_size=1,
                                                max_size=4),
       hkv=st.sampled_from([1, 2]), group=st.sampled_from([1, 2, 3, 7]), window=st.sampled_from([-1, 5]),
       chunk=st.sampled_from([-1, -1, 4, 16]), causal=st.booleans(), bf16=st.booleans(),
       d=st.sampled_from([16, 16, 64, 12]), seed=st.integers(0, 2**31 - 1))
def test_paged_attention_matches_dense_reference(isa, lens, hkv, group, window, chunk, causal, bf16, d, seed):
    """Ragged batch (prefix in the cache + new tokens) over randomly placed pages vs a dense float64
    softmax(q k^T * scale) v with the causal / sliding-window / chunked (Llama 4) mask.  Head sizes and
    group sizes cover the SIMD tiles (keys 4 at a time for up to 3 heads, values for head pairs over 1, 2
    or 4 register-wide slices) with their partial tiles, and a head size the vector width does not divide."""
    so = native.lib(isa)
    rng = np.random.default_rng(seed)
    page, layers, layer = 8, 2, 1
    h = hkv * group
    maxp = max((c + n + page - 1) // page for c, n in lens)
    npages = len(lens) * maxp + 3
    blocks = _paged_cache(rng, npages, layers, page, hkv, d, torch.bfloat16 if bf16 else torch.float32)
    perm = rng.permutation(npages)
    lookup = torch.from_numpy(perm[:len(lens) * maxp].reshape(len(lens), maxp).astype(np.int64))
    cl = torch.tensor([c for c, _ in lens], dtype=torch.int64)
    offs = torch.tensor(np.concatenate([[0], np.cumsum([n for _, n in lens])]), dtype=torch.int64)
    t = int(offs[-1])
    q = torch.from_numpy(rng.standard_normal((t, h, d)).astype(np.float32))
    out = torch.empty_like(q)
    sp, skv, sl, sof = blocks.stride(0), blocks.stride(1), blocks.stride(2), blocks.stride(3)
    rc = so.lmx_paged_attention(q.data_ptr(), t, h, hkv, d, len(lens), offs.data_ptr(), cl.data_ptr(),
                                lookup.data_ptr(), maxp, page, blocks.data_ptr(), 30 if bf16 else 0, sp, skv, sl, sof,
                                layer, ctypes.c_float(0.25), window, chunk, int(causal), out.data_ptr())
    assert rc == 0
    assert_paged_attention(out, q, blocks.double(), lens, lookup, offs, page, layer, group, causal, window,
                           chunk=chunk)


@pytest.mark.parametrize("isa", ISAS)
@settings(max_examples=15, deadline=None)
@given(t=st.integers(1, 6), interleaved=st.booleans(), norms=st.booleans(),
       rope=st.booleans(), rot=st.sampled_from([8, 4]), bf16=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_qkv_rope_store_matches_reference(isa, t, interleaved, norms, rope, rot, bf16, seed):
    so = native.lib(isa)
    rng = np.random.default_rng(seed)
    h, hkv, d, page, layer = 4, 2, 8, 4, 1
    qkv = torch.from_numpy(rng.standard_normal((t, (h + 2 * hkv) * d)).astype(np.float32))
    pos = torch.from_numpy(rng.integers(0, 30, t)).to(torch.int64)
    ang = torch.arange(32, dtype=torch.float64)[:, None] * (1.0 / (100.0 ** (torch.arange(rot // 2) * 2 / rot)))
    freqs = torch.stack([ang.cos(), ang.sin()], -1).reshape(32, rot).float()  # partial rotary when rot < d
    qg = torch.from_numpy(rng.standard_normal(d).astype(np.float32))
    kg = torch.from_numpy(rng.standard_normal(d).astype(np.float32))
    blocks = torch.zeros(6, 2, 2, page, hkv, d, dtype=torch.bfloat16 if bf16 else torch.float32)
    slots = torch.from_numpy(rng.permutation(6 * page)[:t]).to(torch.int64)
    wp, wo = slots // page, slots % page
    q = torch.empty(t, h, d)
    rc = so.lmx_qkv_rope_store(qkv.data_ptr(), t, qkv.stride(0), h, hkv, d, pos.data_ptr(),
                               freqs.data_ptr() if rope else 0, 32, rot, int(interleaved),
                               qg.data_ptr() if norms else 0, kg.data_ptr() if norms else 0, ctypes.c_float(1e-6),
                               q.data_ptr(), blocks.data_ptr(), 30 if bf16 else 0, *blocks.stride()[:4], layer,
                               wp.data_ptr(), wo.data_ptr())
    assert rc == 0

    def ref_head(x, gamma):
        x = x.double()
        if norms:
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma.double()
        if rope:
            c, s = freqs[pos, 0::2].double()[:, None], freqs[pos, 1::2].double()[:, None]
            xr, rest = x[..., :rot], x[..., rot:]
            if interleaved:
                a, b = xr[..., 0::2], xr[..., 1::2]
                xr = torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2)
            else:
                a, b = xr[..., :rot // 2], xr[..., rot // 2:]
                xr = torch.cat((a * c - b * s, a * s + b * c), -1)
            x = torch.cat([xr, rest], -1)
        return x

    qd, kd = h * d, hkv * d
    assert torch.allclose(q.double(), ref_head(qkv[:, :qd].reshape(t, h, d), qg), atol=1e-5)
    tol = 1e-2 if bf16 else 1e-5
    k_ref = ref_head(qkv[:, qd:qd + kd].reshape(t, hkv, d), kg)
    assert torch.allclose(blocks[wp, 0, layer, wo].double(), k_ref, atol=tol, rtol=tol)
    assert torch.allclose(blocks[wp, 1, layer, wo].double(), qkv[:, qd + kd:].reshape(t, hkv, d).double(),
                          atol=tol, rtol=tol)
    assert float(blocks[:, :, 0].abs().sum()) == 0.0  # other layers untouched
    bad = torch.full((t,), 99, dtype=torch.int64)
    if rope:
        assert so.lmx_qkv_rope_store(qkv.data_ptr(), t, qkv.stride(0), h, hkv, d, bad.data_ptr(), freqs.data_ptr(),
                                     32, rot, 0, 0, 0, ctypes.c_float(1e-6), q.data_ptr(), blocks.data_ptr(), 0,
                                     *blocks.stride()[:4], layer, wp.data_ptr(), wo.data_ptr()) == -2


def _qkv_attention_case(rng, lens, hkv, group, rope, norms, cache_dtype):
    """A ragged step (prefix lengths + new tokens) over randomly placed pages: its operands for the K/V write
    and the attention (int64 indices), and a cache of random earlier positions."""
    d, page, layers = 16, 8, 2
    h = hkv * group
    maxp = max((c + n + page - 1) // page for c, n in lens)
    npages = len(lens) * maxp + 3
    blocks = _paged_cache(rng, npages, layers, page, hkv, d, torch.float32)
    if cache_dtype in (torch.int8, torch.float8_e4m3fn):
        from max.engine.kernels.ragged import kv_encode

        blocks = kv_encode(blocks, cache_dtype).view(cache_dtype)
    else:
        blocks = blocks.to(cache_dtype)
    lookup = torch.from_numpy(rng.permutation(npages)[:len(lens) * maxp].reshape(len(lens), maxp).astype(np.int64))
    cl = torch.tensor([c for c, _ in lens], dtype=torch.int64)
    offs = torch.tensor(np.concatenate([[0], np.cumsum([n for _, n in lens])]), dtype=torch.int64)
    pos = torch.cat([torch.arange(c, c + n) for c, n in lens]).to(torch.int64)
    b_of = torch.cat([torch.full((n,), b) for b, (_, n) in enumerate(lens)])
    wp, wo = lookup[b_of, pos // page].contiguous(), (pos % page).contiguous()
    t = int(offs[-1])
    qkv = torch.from_numpy(rng.standard_normal((t, (h + 2 * hkv) * d)).astype(np.float32))
    ang = torch.arange(64, dtype=torch.float64)[:, None] * (1.0 / (100.0 ** (torch.arange(d // 2) * 2 / d)))
    freqs = torch.stack([ang.cos(), ang.sin()], -1).reshape(64, d).float() if rope else None
    qg = torch.from_numpy(rng.standard_normal(d).astype(np.float32)) if norms else None
    kg = torch.from_numpy(rng.standard_normal(d).astype(np.float32)) if norms else None
    return dict(qkv=qkv, blocks=blocks, pos=pos, wp=wp, wo=wo, offs=offs, cl=cl, lookup=lookup, freqs=freqs, qg=qg,
                kg=kg, h=h, hkv=hkv, d=d, page=page, maxp=maxp, t=t)


@pytest.mark.parametrize("isa", ISAS)
@settings(max_examples=20, deadline=None)
@given(lens=st.lists(st.tuples(st.integers(0, 30), st.integers(1, 6)), min_size=1, max_size=3),
       hkv=st.sampled_from([1, 2]), group=st.sampled_from([1, 3]), rope=st.booleans(), norms=st.booleans(),
       window=st.sampled_from([-1, 5]), chunk=st.sampled_from([-1, 8]), causal=st.booleans(),
       cache=st.sampled_from([torch.float32, torch.bfloat16, torch.int8]), seed=st.integers(0, 2**31 - 1))
def test_qkv_attention_is_the_store_then_the_paged_attention(isa, lens, hkv, group, rope, norms, window, chunk,
                                                             causal, cache, seed):
    """lmx_qkv_attention (one call: the K/V write, then the attention of its queries) leaves the same cache and
    returns the same output, bit for bit, as lmx_qkv_rope_store followed by lmx_paged_attention; and that
    output is a float64 softmax(q k^T * scale) v over the cache it wrote."""
    from max.engine.kernels.ragged import KV_KINDS, kv_decode

    so = native.lib(isa)
    c = _qkv_attention_case(np.random.default_rng(seed), lens, hkv, group, rope, norms, cache)
    h, d, t, layer, kind = c["h"], c["d"], c["t"], 1, KV_KINDS[cache]
    blocks2 = c["blocks"].clone()
    ptr = lambda x: 0 if x is None else x.data_ptr()  # noqa: E731
    strides = c["blocks"].stride()[:4]
    p = native.QkvAttention(H=h, Hkv=hkv, D=d, freqs=ptr(c["freqs"]), max_pos=64, R=d if rope else 0, interleaved=1,
                            q_gamma=ptr(c["qg"]), k_gamma=ptr(c["kg"]), eps=1e-6, scale=0.25, kv_kind=kind,
                            s_page=strides[0], s_kv=strides[1], s_layer=strides[2], s_off=strides[3], layer=layer,
                            page_size=c["page"], window=window, chunk=chunk, causal=int(causal))
    out = torch.empty(t, h, d)
    assert so.lmx_qkv_attention(ctypes.byref(p), c["qkv"].data_ptr(), t, c["qkv"].stride(0), c["pos"].data_ptr(),
                                c["wp"].data_ptr(), c["wo"].data_ptr(), len(lens), c["offs"].data_ptr(),
                                c["cl"].data_ptr(), c["lookup"].data_ptr(), c["maxp"], c["blocks"].data_ptr(),
                                out.data_ptr()) == 0
    q = torch.empty(t, h, d)
    assert so.lmx_qkv_rope_store(c["qkv"].data_ptr(), t, c["qkv"].stride(0), h, hkv, d, c["pos"].data_ptr(),
                                 ptr(c["freqs"]), 64, d if rope else 0, 1, ptr(c["qg"]), ptr(c["kg"]),
                                 ctypes.c_float(1e-6), q.data_ptr(), blocks2.data_ptr(), kind, *strides, layer,
                                 c["wp"].data_ptr(), c["wo"].data_ptr()) == 0
    out2 = torch.empty(t, h, d)
    assert so.lmx_paged_attention(q.data_ptr(), t, h, hkv, d, len(lens), c["offs"].data_ptr(), c["cl"].data_ptr(),
                                  c["lookup"].data_ptr(), c["maxp"], c["page"], blocks2.data_ptr(), kind, *strides,
                                  layer, ctypes.c_float(0.25), window, chunk, int(causal), out2.data_ptr()) == 0
    assert torch.equal(c["blocks"].view(torch.uint8), blocks2.view(torch.uint8))
    assert torch.equal(out, out2)
    kv = kv_decode(c["blocks"].view(torch.uint8), cache).double() if cache == torch.int8 else c["blocks"].double()
    assert_paged_attention(out, q, kv, lens, c["lookup"], c["offs"], c["page"], layer, group, causal, window,
                           chunk=chunk)


@pytest.mark.parametrize("flat", [False, True])
@pytest.mark.parametrize("cache", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_prepared_qkv_attention_equals_the_unfused_kernels(flat, cache):
    """The prepared qkv_attention_native (layer settings bound once, one native call per step) returns and
    writes exactly what ragged_qkv_store then flash_attention_ragged_native do, step after step on one cache;
    operands it does not take (an int32 index) go through the unprepared kernel with the same result."""
    from max.engine.kernels.ragged import (flash_attention_ragged_native, prepare_qkv_attention_native,
                                           ragged_qkv_store)

    rng = np.random.default_rng(7)
    attrs = dict(layer=1, n_heads=6, n_kv_heads=2, head_dim=16, interleaved=False, eps=1e-6, has_rope=True,
                 has_q_norm=True, has_k_norm=False, native=native.isa())
    att = dict(scale=0.25, causal=True, window=-1, chunk=-1)
    c = _qkv_attention_case(rng, [(3, 4), (9, 1)], 2, 3, True, True, cache)
    run = prepare_qkv_attention_native([None, c["freqs"], c["qg"], *[None] * 7], **attrs, **att, flat=flat)
    assert run is not None
    blocks2 = c["blocks"].clone()
    for step in range(3):
        qkv = torch.from_numpy(rng.standard_normal(c["qkv"].shape).astype(np.float32))
        idx = (c["pos"], c["wp"], c["wo"], c["offs"], c["cl"], c["lookup"])
        if step == 2:
            idx = (c["pos"].to(torch.int32), *idx[1:])
        got = run(qkv, c["blocks"], *idx)
        q = ragged_qkv_store(qkv, c["freqs"], c["qg"], blocks2, c["pos"], c["wp"], c["wo"], **attrs)
        want = flash_attention_ragged_native(q, blocks2, c["offs"], c["cl"], c["lookup"], layer=1, head_dim=16,
                                             native=native.isa(), **att)
        assert got.shape == ((c["t"], 96) if flat else (c["t"], 6, 16))
        assert torch.equal(got.reshape(want.shape), want)
        assert torch.equal(c["blocks"].view(torch.uint8), blocks2.view(torch.uint8))
        c["pos"] = c["pos"] + 0  # a new tensor every step, as the graph's inputs are


def test_one_thread_pool_shared_with_torch():
    """The native library reuses torch's libgomp: one OpenMP runtime in the process."""
    import re

    maps = open("/proc/self/maps").read()
    gomps = set(re.findall(r"\S*libgomp[^/\s]*\.so\S*", maps))
    assert len(gomps) <= 1, gomps


def test_build_errors_are_clear(monkeypatch, tmp_path):
    from max.engine.native import build

    monkeypatch.setenv("LIBREMAX_NATIVE_ISA", "sse9")
    with pytest.raises(build.NativeBuildError, match="not a kernel variant: choose one of avx512, .*generic"):
        build.library_path()
    other = "neon" if build.X86 else "avx2"  # a variant of the other architecture
    monkeypatch.setenv("LIBREMAX_NATIVE_ISA", other)
    with pytest.raises(build.NativeBuildError, match=f"cannot run the {other} kernels; it can run: .*generic"):
        build.library_path()
    monkeypatch.setenv("LIBREMAX_NATIVE_ISA", "native")
    monkeypatch.setenv("CC", "definitely-not-a-compiler")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(build.NativeBuildError, match="no C compiler"):
        build.library_path()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", PACKABLE)
def test_refined_codes_approach_float_activations(isa, kind, act_refine):
    """Refining every block gives ~16-bit activation codes: the packed kernels then agree with the float64
    product of the float32 activations to ~1e-4 of its scale; with the 8-bit codes alone the error is ~50x
    larger, and the default refinement (the blocks with the largest scales) sits in between -- on
    heavy-tailed activations, where the largest blocks carry most of the error."""
    so = native.lib(isa)
    n, k, m = 40, kdim(kind, 4), 6
    b = blocks(kind, n, k, 7)
    w = deq(kind, b, n, k).astype(np.float64)
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((m, k)) * np.exp(1.5 * rng.standard_normal((m, k)))).astype(np.float32)
    code = native.GGML_KINDS[kind]
    plan = native.MatmulPlan([native.pack(torch.from_numpy(b), code, n, k)], [code], ["packed"], [n], k, so=so)
    exact = x.astype(np.float64) @ w.T
    err = {}
    for frac in (0, native.ACT_REFINE_DEFAULT, 1):
        act_refine(frac)
        y = plan(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(y, q8_ref(x, w, kind), rtol=2e-5, atol=2e-5 * np.abs(exact).max())
        err[frac] = float(np.sqrt(((y - exact) ** 2).mean()) / np.abs(exact).max())
    assert err[1] < 2e-4 and err[1] * 20 < err[0], err
    assert err[1] < err[native.ACT_REFINE_DEFAULT] < err[0], err


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", PACKABLE)
def test_refined_rows_do_not_depend_on_the_batch(isa, kind, act_refine):
    """With refinement on (the default fraction and threshold) and heavy-tailed activations, a row's result is
    still bit-identical alone (a decode step, where the AVX2 kernels sum a refined block's residual codes in the
    same pass as its 8-bit codes) and among others (register tiles, weight-stationary order)."""
    so = native.lib(isa)
    n, k, m = 37, kdim(kind, 8), 9
    rng = np.random.default_rng(12)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[np.arange(m), rng.integers(0, k, m)] = rng.uniform(20, 60, m)  # one outlier per row: its block refines
    code = native.GGML_KINDS[kind]
    plan = native.MatmulPlan([native.pack(torch.from_numpy(blocks(kind, n, k, 6)), code, n, k)], [code], ["packed"],
                             [n], k, so=so)
    act_refine(native.ACT_REFINE_DEFAULT)
    full = plan(torch.from_numpy(x)).numpy()
    for i in range(m):
        np.testing.assert_array_equal(plan(torch.from_numpy(x[i:i + 1])).numpy()[0].view(np.uint32),
                                      full[i].view(np.uint32), err_msg=f"row {i}")
    act_refine(0)
    plain = plan(torch.from_numpy(x[:1])).numpy()[0]
    assert not np.array_equal(plain, full[0])  # the outlier's block was refined


@pytest.fixture
def act_refine_threshold():
    """``native.set_act_refine_threshold`` for one test; the setting before it is restored after it."""
    before = native.act_refine_threshold()
    yield native.set_act_refine_threshold
    native.set_act_refine_threshold(before)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q4_0", "Q8_0"])
def test_refinement_threshold_refines_the_outlier_blocks(isa, kind, act_refine, act_refine_threshold):
    """With a threshold t a row refines only the blocks whose squared scale is >= t x its mean (at most the
    fraction, the largest): rows with a few outlier blocks refine those (the result is the reference's with
    exactly those blocks refined), flat rows refine none (the 8-bit result, bit for bit), and fraction 1
    still refines every block; act_refine_stats counts what was refined."""
    so = native.lib(isa)
    n, k = 40, 2048  # 64 blocks: the outliers stay below the fraction's cap of 16
    b = blocks(kind, n, k, 3)
    w = deq(kind, b, n, k).astype(np.float64)
    rng = np.random.default_rng(4)
    flat = rng.uniform(-1, 1, (2, k)).astype(np.float32)
    flat[:, ::32] = 1.0  # every block's max |x| is 1: equal scales, none above 2x the mean
    spiky = rng.standard_normal((3, k)).astype(np.float32)
    spiky[0, 5] = 40.0
    spiky[1, [3, 70, 200]] = [-25.0, 30.0, 60.0]
    spiky[2, 33] = 9.0
    x = np.concatenate([flat, spiky])
    code = native.GGML_KINDS[kind]
    plan = native.MatmulPlan([native.pack(torch.from_numpy(b), code, n, k)], [code], ["packed"], [n], k, so=so)
    exact = x.astype(np.float64) @ w.T
    act_refine(native.ACT_REFINE_DEFAULT)
    act_refine_threshold(2.0)
    native.act_refine_stats(reset=True)
    if so is not native.lib():  # the stats are the default variant's
        so.lmx_act_refine_stats((ctypes.c_int64 * 2)(), 1)
    y = plan(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(y, q8_activation_reference(x, w, native.ACT_REFINE_DEFAULT, 2.0), rtol=2e-5,
                               atol=2e-5 * np.abs(exact).max())
    if so is native.lib():
        refined, seen = native.act_refine_stats()
        assert seen == x.shape[0] * (k // 32)
        # the outlier blocks (row 0: one, row 1: three, row 2: one) and few others; the flat rows none
        d = np.abs(x.reshape(x.shape[0], -1, 32)).max(-1) / 127
        sel = [np.flatnonzero((r ** 2) >= 2 * (r ** 2).mean()) for r in d]
        assert refined == sum(len(v) for v in sel) and len(sel[0]) == len(sel[1]) == 0, (refined, sel)
        assert {0} <= set(sel[2]) and {0, 2, 6} <= set(sel[3]) and {1} <= set(sel[4]) and refined <= 8, sel
    y_flat = plan(torch.from_numpy(flat)).numpy()
    act_refine(0)
    assert np.array_equal(y_flat, plan(torch.from_numpy(flat)).numpy())  # flat rows: nothing refined
    act_refine(1)
    full = plan(torch.from_numpy(x)).numpy()
    act_refine_threshold(0)
    assert np.array_equal(full, plan(torch.from_numpy(x)).numpy())  # fraction 1: every block, whatever t


def test_act_refine_threshold_setting(act_refine_threshold):
    """LIBREMAX_ACT_REFINE_THRESHOLD / native.set_act_refine_threshold: a number >= 0, applied to every loaded
    variant; anything else is refused naming the variable."""
    for value, want in (("2", 2.0), (" 1.5 ", 1.5), (0, 0.0), ("0", 0.0)):
        act_refine_threshold(value)
        assert native.act_refine_threshold() == want
        assert native.lib().lmx_act_refine_threshold() == want
    for bad in ("lots", "-1", "inf", "nan", ""):
        with pytest.raises(ValueError, match="LIBREMAX_ACT_REFINE_THRESHOLD.*>= 0"):
            act_refine_threshold(bad)
    assert native.act_refine_threshold() == 0.0


def test_act_refine_threshold_environment():
    import os
    import subprocess
    import sys

    code = "from max.engine import native; so = native.lib(); print(native.act_refine_threshold(), so.lmx_act_refine_threshold())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "LIBREMAX_ACT_REFINE_THRESHOLD": "3"})
    assert r.returncode == 0 and r.stdout.split() == ["3.0", "3.0"], r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={k: v for k, v in os.environ.items() if k != "LIBREMAX_ACT_REFINE_THRESHOLD"})
    assert r.returncode == 0 and r.stdout.split() == [str(native.ACT_REFINE_THRESHOLD_DEFAULT)] * 2, r.stderr[-2000:]


def test_act_refine_setting(act_refine):
    """LIBREMAX_ACT_REFINE / native.set_act_refine: a fraction in [0, 1] (decimal or a/b), applied to every
    loaded variant; anything else is refused naming the variable and the range."""
    from fractions import Fraction

    for value, want in (("1/8", Fraction(1, 8)), ("0.25", Fraction(1, 4)), (" 0 ", Fraction(0)), (1, Fraction(1))):
        act_refine(value)
        assert native.act_refine() == want
        assert native.lib().lmx_act_refine_fraction() == float(want)
    for bad in ("lots", "2", "-0.1", "1/0", ""):
        with pytest.raises(ValueError, match="LIBREMAX_ACT_REFINE.*between 0"):
            act_refine(bad)
    assert native.act_refine() == 1  # unchanged by the refused values


@pytest.mark.parametrize("value,ok", [("1/8", True), ("bogus", False)])
def test_act_refine_environment(value, ok):
    import subprocess
    import sys

    code = ("from max.engine import native; so = native.lib(); "
            "print(native.act_refine(), so.lmx_act_refine_fraction())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "LIBREMAX_ACT_REFINE": value})
    if ok:
        assert r.returncode == 0 and r.stdout.split() == ["1/8", "0.125"], r.stderr[-2000:]
    else:
        assert r.returncode != 0 and "LIBREMAX_ACT_REFINE='bogus'" in r.stderr, r.stderr[-2000:]
