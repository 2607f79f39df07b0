"""The ARM (AArch64) variants of the native kernels, checked on any Linux host under qemu-user.

Each AArch64 variant of ``build.VARIANTS`` (neondot: NEON + SDOT, neon: NEON with widening
multiplies, generic: portable C) is cross-compiled with its flags (``build.build_program``) together
with a small C driver (``native_harness.c``), statically linked, and run under ``qemu-aarch64``: one
run per variant executes every case of this module from one request file.  The results are checked
against the same independent references as the native tests (``test_native_kernels.py``): gguf's
dequantizer with ``support.q8_activation_reference``, float64 numpy/torch for dense matmuls, norms,
gated activations and attention; rows computed alone or among others must be bit-identical.

The neon and generic variants run on an emulated Cortex-A72 (ARMv8.0: no dot-product instructions),
so neither can use SDOT by accident.  Needs ``aarch64-linux-gnu-gcc`` (with the AArch64 C library)
and ``qemu-aarch64``; as root they are installed with apt-get when missing, otherwise the module is
skipped with the reason.  Emulation is slow: the shapes are small, and nothing here measures speed.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from max.engine import native  # noqa: E402
from max.engine.native import build  # noqa: E402
from support import apt_install  # noqa: E402
from support import q8_activation_reference  # noqa: E402
from test_native_kernels import ALL_KINDS, PACKABLE, blocks, deq, kdim  # noqa: E402

CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
PACKAGES = ("gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross", "qemu-user")
HARNESS = Path(__file__).with_name("native_harness.c")
ARM_VARIANTS = [v for v, (arch, _, _) in build.VARIANTS.items() if arch in ("aarch64", "any")]
# the emulated CPU of each variant: only neondot's has the dot-product extension
QEMU_CPU = {"neondot": "max", "neon": "cortex-a72", "generic": "cortex-a72"}
SIMD = {"neondot": "neon+dotprod", "neon": "neon", "generic": "generic"}
GGML = {"F32": 0, "F16": 1, "BF16": 30, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q2_K": 10,
        "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
OP_SIMD, OP_PACKED, OP_GGML, OP_DENSE, OP_RMSNORM, OP_GLU, OP_ATTN, OP_ACT = range(8)


# ---------------------------------------------------------------- tools


def _toolchain_ok() -> str | None:
    """None when the cross compiler (with its C library) and qemu are there, else what is missing."""
    missing = [t for t in (CC, QEMU) if shutil.which(t) is None]
    if missing:
        return f"{' and '.join(missing)} not found"
    r = subprocess.run([CC, "-print-file-name=libc.a"], capture_output=True, text=True)
    if r.returncode != 0 or not os.path.isabs(r.stdout.strip()):
        return f"{CC} has no AArch64 C library (libc6-dev-arm64-cross)"
    return None


def _install_toolchain() -> str | None:
    """apt-get install the cross toolchain and qemu-user (as root); None on success, else why not."""
    return apt_install(*PACKAGES)


@pytest.fixture(scope="module")
def toolchain():
    why = _toolchain_ok()
    if why is not None:
        err = _install_toolchain()
        why = _toolchain_ok()
        if why is not None:
            pytest.skip(f"cannot test the ARM kernels under qemu: {why}" + (f" ({err})" if err else ""))


# ---------------------------------------------------------------- request / result files


class Case:
    def __init__(self, op: int, ints=(), flts=(), bufs=()) -> None:
        self.op, self.ints, self.flts = op, [int(i) for i in ints], [float(f) for f in flts]
        self.bufs = [np.ascontiguousarray(b).tobytes() for b in bufs]
        self.index = -1


CASES: list[Case] = []


def case(op: int, ints=(), flts=(), bufs=()) -> Case:
    c = Case(op, ints, flts, bufs)
    c.index = len(CASES)
    CASES.append(c)
    return c


def _pad(b: bytes) -> bytes:
    return b + bytes(-len(b) % 8)


def _request(cases: list[Case]) -> bytes:
    out = [b"LMXH", struct.pack("<i", len(cases))]
    for c in cases:
        out.append(struct.pack("<4i", c.op, len(c.ints), len(c.flts), len(c.bufs)))
        out.append(struct.pack(f"<{len(c.ints)}q", *c.ints))
        out.append(struct.pack(f"<{len(c.flts)}d", *c.flts))
        for b in c.bufs:
            out += [struct.pack("<q", len(b)), _pad(b)]
    return b"".join(out)


def _results(data: bytes) -> list[tuple[int, list[bytes]]]:
    assert data[:4] == b"LMXR", data[:16]
    (n,), pos, res = struct.unpack_from("<i", data, 4), 8, []
    for _ in range(n):
        rc, nout = struct.unpack_from("<2i", data, pos)
        pos += 8
        outs = []
        for _ in range(nout):
            (nb,) = struct.unpack_from("<q", data, pos)
            outs.append(data[pos + 8:pos + 8 + nb])
            pos += 8 + nb + (-nb % 8)
        res.append((rc, outs))
    return res


def _run_variant(variant: str, request: bytes, out_dir: Path) -> list[tuple[int, list[bytes]]]:
    exe = build.build_program(variant, HARNESS, CC, ("-static",), out_dir=build.cache_dir() / "native-arm")
    req, res = out_dir / f"{variant}.req", out_dir / f"{variant}.res"
    req.write_bytes(request)
    env = dict(os.environ, OMP_NUM_THREADS="2")
    r = subprocess.run([QEMU, "-cpu", QEMU_CPU[variant], str(exe), str(req), str(res)], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, f"{variant} harness under qemu failed ({r.returncode}): {r.stderr[-2000:]}"
    return _results(res.read_bytes())


@pytest.fixture(scope="module")
def results(toolchain):
    """variant -> [(rc, outputs)] of every case, one qemu run per variant (the three in parallel)."""
    request = _request(CASES)
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(len(ARM_VARIANTS)) as ex:
        futs = {v: ex.submit(_run_variant, v, request, Path(tmp)) for v in ARM_VARIANTS}
        out = {v: f.result() for v, f in futs.items()}
    for v, res in out.items():
        assert len(res) == len(CASES), v
    return out


def got(results, variant: str, c: Case, dtype=np.float32, i: int = 0) -> np.ndarray:
    rc, outs = results[variant][c.index]
    assert rc == 0, f"{variant}: case {c.index} returned {rc}"
    return np.frombuffer(outs[i], dtype=dtype)


# ---------------------------------------------------------------- the cases (built at import, deterministic)

SIMD_CASE = case(OP_SIMD)

# activation quantisation: random rows plus exact ties (x * 127 / amax = k + 1/2) and an all-zero block
_rng = np.random.default_rng(100)
ACT_X = (_rng.standard_normal((3, 128)) * _rng.uniform(0.1, 10, (3, 1))).astype(np.float32)
ACT_X[0, :32] = (np.arange(32) - 15.5).astype(np.float32)
ACT_X[0, 31] = 127.0  # amax 127: scale 1, codes of the .5 values are ties
ACT_X[1, 32:64] = 0.0
ACT_CASE = case(OP_ACT, (3, 128), (), (ACT_X,))

# quantised matmuls: N = 37 (a partial group of 16 rows), M = 17 plus sub-batches of its rows
N_Q, M_Q = 37, 17
SUBSETS = [(0, 1), (0, 3), (0, 8), (13, 14), (5, 8)]  # row ranges [a, b) of the 17 computed on their own


def _qcases(op: int, kinds: list[str], kmult) -> dict:
    out = {}
    for j, kind in enumerate(kinds):
        k = kdim(kind, kmult(kind))
        b = blocks(kind, N_Q, k, 200 + j)
        rng = np.random.default_rng(300 + j)
        x = (rng.standard_normal((M_Q, k)) * rng.uniform(0.1, 10)).astype(np.float32)
        full = case(op, (GGML[kind], M_Q, N_Q, k, 0), (), (b, x))
        subs = {s: case(op, (GGML[kind], s[1] - s[0], N_Q, k, 0), (), (b, x[s[0]:s[1]])) for s in SUBSETS}
        out[kind] = (b, x, k, full, subs)
    return out


# packed: 32-value kinds over 3 blocks; ggml: 9 blocks (a 256-value chunk + a partial one), K-quants 2
PACKED = _qcases(OP_PACKED, PACKABLE, lambda kind: 2 if kind.endswith("_K") else 3)
GGMLC = _qcases(OP_GGML, ALL_KINDS, lambda kind: 2 if kind.endswith("_K") else 9)

# one packed weight with a bias
_rng = np.random.default_rng(400)
BIAS = _rng.standard_normal(N_Q).astype(np.float32)
BIAS_CASE = case(OP_PACKED, (GGML["Q4_K"], 5, N_Q, 256, 0), (),
                 (PACKED["Q4_K"][0][:, :144], PACKED["Q4_K"][1][:5, :256], BIAS))

# dense: K = 83 (not a multiple of the vector width), M = 9 and its sub-batches (each tile shape of the NEON
# kernel: the M = 1 tile, one and several blocks of 2 activation rows, the half weights' widened panel)
DENSE = {}
for _j, _dt in enumerate(("float32", "bfloat16", "float16")):
    _g = torch.Generator().manual_seed(500 + _j)
    _w = torch.randn(21, 83, generator=_g).to(getattr(torch, _dt))
    _x = torch.randn(9, 83, generator=_g)
    _wb = _w.view(torch.int16).numpy() if _dt != "float32" else _w.numpy()
    _kind = {"float32": 0, "bfloat16": 30, "float16": 1}[_dt]
    DENSE[_dt] = (_w, _x, case(OP_DENSE, (_kind, 9, 21, 83, 0), (), (_wb, _x.numpy())),
                  {s: case(OP_DENSE, (_kind, s[1] - s[0], 21, 83, 0), (), (_wb, _x[s[0]:s[1]].numpy()))
                   for s in [(0, 1), (0, 2), (0, 3), (4, 5), (2, 7), (1, 9)]})

# rmsnorm (with and without a weight) and the gated activations
_g = torch.Generator().manual_seed(600)
NORM_X = torch.randn(3, 150, generator=_g) * 3
NORM_W = torch.randn(150, generator=_g)
NORM_CASES = (case(OP_RMSNORM, (3, 150, 1), (1e-5,), (NORM_X.numpy(), NORM_W.numpy())),
              case(OP_RMSNORM, (3, 150, 0), (1e-5,), (NORM_X.numpy(),)))
GU = torch.randn(3, 2 * 99, generator=_g) * 4
GU[0, :8] = torch.tensor([-100.0, -30.0, -9.0, 0.0, 1e-3, 9.0, 30.0, 100.0])  # the clamped exponent range
GLU_CASES = {act: case(OP_GLU, (3, 99, act), (), (GU.numpy(),)) for act in (0, 1)}


# paged attention: ragged batch, GQA (2 kv heads x 3), a sliding window, float32 and bfloat16 caches
def _attn_case(seed: int, bf16: bool, window: int, causal: bool, chunk: int = -1):
    rng = np.random.default_rng(seed)
    lens, hkv, group, d, page, layers, layer = [(5, 3), (12, 1), (0, 4)], 2, 3, 16, 8, 2, 1
    h = hkv * group
    maxp = max((c + n + page - 1) // page for c, n in lens)
    npages = len(lens) * maxp + 3
    cache = torch.from_numpy(rng.standard_normal((npages, 2, layers, page, hkv, d)).astype(np.float32))
    cache = cache.to(torch.bfloat16 if bf16 else torch.float32)
    lookup = rng.permutation(npages)[:len(lens) * maxp].reshape(len(lens), maxp).astype(np.int64)
    cl = np.array([c for c, _ in lens], dtype=np.int64)
    offs = np.concatenate([[0], np.cumsum([n for _, n in lens])]).astype(np.int64)
    t = int(offs[-1])
    q = rng.standard_normal((t, h, d)).astype(np.float32)
    raw = cache.view(torch.int16).numpy() if bf16 else cache.numpy()
    c = case(OP_ATTN, (t, h, hkv, d, len(lens), maxp, page, 30 if bf16 else 0, *cache.stride()[:4], layer, window,
                       chunk, int(causal)), (0.25,), (q, offs, cl, lookup, raw))
    return dict(case=c, lens=lens, cache=cache, lookup=torch.from_numpy(lookup), q=torch.from_numpy(q), offs=offs,
                group=group, page=page, layer=layer, window=window, chunk=chunk, causal=causal, h=h)


ATTN = [_attn_case(700, False, 5, True), _attn_case(701, True, -1, True), _attn_case(702, True, 4, False),
        _attn_case(703, False, -1, False),
        # chunked local attention (Llama 4): alone, and intersected with a sliding window
        _attn_case(704, False, -1, True, chunk=4), _attn_case(705, True, 6, True, chunk=8)]


# paged attention over int8 / fp8 e4m3 pages (codes + a float32 scale per row, --kv-cache-dtype), d = 24:
# the NEON 8-wide dequantisation plus a tail
def _qattn_case(seed: int, dtype: torch.dtype, window: int, causal: bool):
    from max.engine.kernels.ragged import KV_KINDS, kv_decode, kv_encode

    rng = np.random.default_rng(seed)
    lens, hkv, group, d, page, layers, layer = [(5, 3), (12, 1), (0, 4)], 2, 3, 24, 8, 2, 1
    h = hkv * group
    maxp = max((c + n + page - 1) // page for c, n in lens)
    npages = len(lens) * maxp + 3
    x = torch.from_numpy(rng.standard_normal((npages, 2, layers, page, hkv, d)).astype(np.float32))
    raw = kv_encode(x, dtype)
    lookup = rng.permutation(npages)[:len(lens) * maxp].reshape(len(lens), maxp).astype(np.int64)
    cl = np.array([c for c, _ in lens], dtype=np.int64)
    offs = np.concatenate([[0], np.cumsum([n for _, n in lens])]).astype(np.int64)
    t = int(offs[-1])
    q = rng.standard_normal((t, h, d)).astype(np.float32)
    c = case(OP_ATTN, (t, h, hkv, d, len(lens), maxp, page, KV_KINDS[dtype], *raw.stride()[:4], layer, window,
                       -1, int(causal)), (0.25,), (q, offs, cl, lookup, raw.numpy()))
    return dict(case=c, lens=lens, cache=kv_decode(raw, dtype), lookup=torch.from_numpy(lookup),
                q=torch.from_numpy(q), offs=offs, group=group, page=page, layer=layer, window=window, chunk=-1,
                causal=causal, h=h)


ATTN += [_qattn_case(710, torch.int8, 5, True), _qattn_case(711, torch.int8, -1, False),
         _qattn_case(712, torch.float8_e4m3fn, -1, True)]

# ---------------------------------------------------------------- the tests

pytestmark = pytest.mark.parametrize("variant", ARM_VARIANTS)


def test_harness_runs_the_intended_simd_path(results, variant):
    rc, (s,) = results[variant][SIMD_CASE.index]
    assert rc == 0 and s.decode() == SIMD[variant]


def test_activation_quantisation_is_exact(results, variant):
    """Codes round half to even and clip to [-127, 127]; scale amax / 127; the per-16 sums d * sum(q) and the
    integer sums -- bit for bit what the scalar path (and the float32 reference) computes."""
    codes = got(results, variant, ACT_CASE, np.int8, 0).reshape(3, 128)
    dxb = got(results, variant, ACT_CASE, np.float32, 1).reshape(3, 4)
    sx16 = got(results, variant, ACT_CASE, np.float32, 2).reshape(3, 8)
    xb = ACT_X.reshape(3, 4, 32)
    amax = np.abs(xb).max(-1)
    d = amax / np.float32(127)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.clip(np.rint(xb * inv[..., None]), -127, 127).astype(np.int32)
    np.testing.assert_array_equal(codes.reshape(3, 4, 32), q)
    assert codes[0, :3].tolist() == [-16, -14, -14]  # -15.5 -> -16, -14.5 -> -14, -13.5 -> -14
    np.testing.assert_array_equal(dxb.view(np.uint32), d.astype(np.float32).view(np.uint32))
    s16 = q.reshape(3, 8, 16).sum(-1).astype(np.float32)
    np.testing.assert_array_equal(sx16.view(np.uint32), (np.repeat(d, 2, axis=1) * s16).view(np.uint32))
    # the integer sums of each 32 values' halves as one int16 pair (low: values 0-15), for the integer-scaled kernels
    ixp = got(results, variant, ACT_CASE, np.int32, 3).reshape(3, 4)
    pair = q.reshape(3, 4, 2, 16).sum(-1)
    np.testing.assert_array_equal(ixp.view(np.uint32), (pair[..., 0] & 0xFFFF) | ((pair[..., 1] & 0xFFFF) << 16))


def _check_quantised(results, variant, table, kind):
    b, x, k, full, subs = table[kind]
    w = deq(kind, b, N_Q, k)
    y = got(results, variant, full).reshape(M_Q, N_Q)
    # the harness runs the C library's default refinement (native.ACT_REFINE_DEFAULT) in the packed kernels
    ref = q8_activation_reference(x, w, refine=native.ACT_REFINE_DEFAULT if table is PACKED else 0)
    np.testing.assert_allclose(y, ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max(), err_msg=f"{variant} {kind}")
    for (a, e), c in subs.items():  # the same rows alone or in smaller batches: the same bits
        ys = got(results, variant, c).reshape(e - a, N_Q)
        np.testing.assert_array_equal(ys.view(np.uint32), y[a:e].view(np.uint32), err_msg=f"rows {a}:{e}")


@pytest.mark.parametrize("kind", PACKABLE)
def test_packed_matmul(results, variant, kind):
    _check_quantised(results, variant, PACKED, kind)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_ggml_layout_matmul(results, variant, kind):
    _check_quantised(results, variant, GGMLC, kind)


def test_packed_matmul_with_bias(results, variant):
    b, x = PACKED["Q4_K"][0][:, :144], PACKED["Q4_K"][1][:5, :256]
    y = got(results, variant, BIAS_CASE).reshape(5, N_Q)
    ref = q8_activation_reference(x, deq("Q4_K", b, N_Q, 256), refine=native.ACT_REFINE_DEFAULT) + BIAS
    np.testing.assert_allclose(y, ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_dense_matmul(results, variant, dtype):
    w, x, full, subs = DENSE[dtype]
    y = got(results, variant, full).reshape(9, 21)
    ref = x.double() @ w.double().T
    scale = float((x.double().abs() @ w.double().abs().T).max())
    assert float((torch.from_numpy(y.copy()).double() - ref).abs().max()) <= 1e-6 * scale
    for (a, e), c in subs.items():
        ys = got(results, variant, c).reshape(e - a, 21)
        np.testing.assert_array_equal(ys.view(np.uint32), y[a:e].view(np.uint32), err_msg=f"rows {a}:{e}")


def test_rmsnorm_and_glu(results, variant):
    xd = NORM_X.double()
    base = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5)
    for c, ref in zip(NORM_CASES, (base * NORM_W.double(), base)):
        out = torch.from_numpy(got(results, variant, c).reshape(3, 150).copy()).double()
        assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5)
    gd = GU.double()
    for act, fn in ((0, torch.nn.functional.silu), (1, lambda a: torch.nn.functional.gelu(a, approximate="tanh"))):
        out = torch.from_numpy(got(results, variant, GLU_CASES[act]).reshape(3, 99).copy()).double()
        assert torch.allclose(out, fn(gd[:, :99]) * gd[:, 99:], rtol=1e-5, atol=1e-5), f"act {act}"


@pytest.mark.parametrize("which", range(len(ATTN)))
def test_paged_attention(results, variant, which):
    a = ATTN[which]
    out = torch.from_numpy(got(results, variant, a["case"]).reshape(a["q"].shape).copy())
    kv, lookup, page, layer, group = a["cache"].double(), a["lookup"], a["page"], a["layer"], a["group"]
    for b, (c, n) in enumerate(a["lens"]):
        total = c + n
        pos = torch.arange(total)
        k_ = kv[lookup[b, pos // page], 0, layer, pos % page]
        v_ = kv[lookup[b, pos // page], 1, layer, pos % page]
        for i in range(n):
            qpos, t = c + i, int(a["offs"][b]) + i
            keep = torch.ones(total, dtype=torch.bool)
            if a["causal"]:
                keep &= pos <= qpos
                if a["window"] > 0:
                    keep &= pos > qpos - a["window"]
                if a["chunk"] > 0:
                    keep &= pos // a["chunk"] == qpos // a["chunk"]
            for hh in range(a["h"]):
                s = (k_[keep, hh // group] @ a["q"][t, hh].double()) * 0.25
                ref = torch.softmax(s, 0) @ v_[keep, hh // group]
                assert torch.allclose(out[t, hh].double(), ref, rtol=1e-4, atol=1e-5), (b, i, hh)
