"""The packed-weight cache (``max.engine.native.pack_cache``): a second load maps what the first packed,
bit-identical to packing afresh; a modified file, a damaged entry or another layout is never served."""

from __future__ import annotations

import hashlib
import os
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402

from max.engine import native  # noqa: E402
from max.engine.native import pack_cache  # noqa: E402
from max.graph.weights.gguf import GGUFWeights  # noqa: E402

if native.lib() is None:  # pragma: no cover - no C compiler
    pytest.skip("native kernels unavailable", allow_module_level=True)

# name -> (kind, rows, K): one tensor per family of the packed layout (32-blocks, Q5's high bits, K-quants)
TENSORS = {"a.weight": ("Q4_0", 40, 64), "b.weight": ("Q5_1", 16, 96), "c.weight": ("Q4_K", 33, 512),
           "d.weight": ("Q6_K", 20, 256), "e.weight": ("Q8_0", 17, 64)}


def _blocks(kind: str, n: int, k: int, seed: int) -> np.ndarray:
    """Random GGML blocks of ``kind`` (gguf's quantizer for the legacy kinds; random bytes with finite fp16
    scales for K-quants, which gguf-py cannot make): packing only moves bytes, any values do."""
    rng = np.random.default_rng(seed)
    if kind in ("Q4_K", "Q6_K"):
        epb, bs = gguf.GGML_QUANT_SIZES[T[kind]]
        b = rng.integers(0, 256, (n, k // epb, bs), dtype=np.uint8)
        for o in ((0, 2) if kind == "Q4_K" else (208,)):
            b[:, :, o:o + 2] = np.float16(rng.uniform(1e-3, 1e-2, (n, k // epb))).view(np.uint8).reshape(n, -1, 2)
        return b.reshape(n, -1)
    return gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), T[kind])


def _write(path, seed: int = 0) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    for i, (name, (kind, n, k)) in enumerate(TENSORS.items()):
        w.add_tensor(name, _blocks(kind, n, k, seed * 100 + i), raw_dtype=T[kind])
    w.add_tensor("norm.weight", np.ones(64, np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()


def _pack_all(path) -> dict:
    """What a model load does per weight: pack the GGML blocks viewing the file's mapping."""
    w = GGUFWeights(str(path))
    st = w._store
    out = {}
    for name, (kind, n, k) in TENSORS.items():
        blocks = st.tensor(name)
        assert native.packed_nbytes(native.GGML_KINDS[kind], n, k) > 0
        out[name] = native.pack(blocks, native.GGML_KINDS[kind], n, k)
    return out


def _fresh(path) -> dict:
    """The same packing with the cache off (the reference)."""
    old = os.environ.get("LIBREMAX_PACK_CACHE")
    os.environ["LIBREMAX_PACK_CACHE"] = "0"
    try:
        return {n: t.clone() for n, t in _pack_all(path).items()}
    finally:
        if old is None:
            del os.environ["LIBREMAX_PACK_CACHE"]
        else:
            os.environ["LIBREMAX_PACK_CACHE"] = old


def _load(path) -> tuple[dict, dict]:
    """One load as a new process would do it (no remembered file states); the results and the stats delta."""
    pack_cache._forget()
    before = pack_cache.stats()
    got = _pack_all(path)
    pack_cache.flush()
    after = pack_cache.stats()
    return got, {k: after[k] - before[k] for k in after}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "packed"
    monkeypatch.setenv("LIBREMAX_PACK_CACHE", str(root))
    yield root
    pack_cache._forget()


def _assert_same(got: dict, want: dict) -> None:
    """Every tensor of the file packed to the same bytes."""
    for name in TENSORS:
        assert torch.equal(got[name], want[name]), name


def _entries(root) -> list:
    return sorted(p for p in root.rglob("*.lmxp"))


def test_second_load_maps_the_first_ones_packing(tmp_path, cache):
    path = tmp_path / "m.gguf"
    _write(path)
    want = _fresh(path)
    got1, s1 = _load(path)
    assert s1["misses"] == len(TENSORS) and s1["hits"] == 0 and s1["hashed"] == 1 and s1["stored"] == len(TENSORS)
    assert len(_entries(cache)) == len(TENSORS)
    got2, s2 = _load(path)
    assert s2["hits"] == len(TENSORS) and s2["misses"] == 0
    assert s2["hashed"] == 0  # the sidecar remembered the file's sha256: the file was not read again
    for name in TENSORS:
        assert torch.equal(got1[name], want[name]) and torch.equal(got2[name], want[name]), name
    # the sidecar holds the file's real sha256, and the entries live under it
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    assert all(sha in str(p) for p in _entries(cache))


def test_blocks_not_viewing_a_file_are_not_cached(cache):
    kind, n, k = TENSORS["c.weight"]
    blocks = torch.from_numpy(_blocks(kind, n, k, 5))
    before = pack_cache.stats()
    out = native.pack(blocks, native.GGML_KINDS[kind], n, k)
    pack_cache.flush()
    assert pack_cache.stats() == before and not cache.exists()
    assert out.numel() == native.packed_nbytes(native.GGML_KINDS[kind], n, k)


def test_a_modified_file_is_never_served_stale(tmp_path, cache):
    """Same path, same size, same modification time, other bytes: hashed again, every weight packed afresh."""
    path = tmp_path / "m.gguf"
    _write(path, seed=0)
    _load(path)
    st = os.stat(path)
    _write(path, seed=1)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.path.getsize(path) == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns
    want = _fresh(path)
    got, s = _load(path)
    assert s["hashed"] == 1 and s["hits"] == 0
    _assert_same(got, want)
    got, s = _load(path)  # and the new version is cached in its turn
    assert s["hits"] == len(TENSORS)
    _assert_same(got, want)


def test_damaged_entries_are_rebuilt_with_a_warning(tmp_path, cache):
    path = tmp_path / "m.gguf"
    _write(path)
    want = _fresh(path)
    _load(path)
    files = _entries(cache)
    flipped, cut, header = files[0], files[1], files[2]
    data = bytearray(flipped.read_bytes())
    data[pack_cache.HEADER + 7] ^= 0x10  # one bit of the packed bytes
    flipped.write_bytes(bytes(data))
    cut.write_bytes(cut.read_bytes()[:-100])  # truncated
    header.write_bytes(b"garbage" + header.read_bytes()[7:])  # not an entry any more
    with pytest.warns(RuntimeWarning, match="damaged") as rec:
        got, s = _load(path)
    reasons = " | ".join(str(r.message) for r in rec)
    assert "checksum" in reasons and "truncated" in reasons and "not a packed-weight file" in reasons, reasons
    assert s["rebuilt"] == 3 and s["hits"] == len(TENSORS) - 3
    _assert_same(got, want)
    with warnings.catch_warnings():  # rebuilt: the next load maps them all, silently
        warnings.simplefilter("error")
        got, s = _load(path)
    assert s["hits"] == len(TENSORS)
    _assert_same(got, want)


def test_an_entry_of_another_key_is_not_served(tmp_path, cache):
    """An entry file whose header names another layout (or tensor) is a damaged entry, not a hit."""
    path = tmp_path / "m.gguf"
    _write(path)
    _load(path)
    f = _entries(cache)[0]
    data = f.read_bytes()
    f.write_bytes(data.replace(b'"layout": "', b'"layout": "X', 1))
    with pytest.warns(RuntimeWarning, match="key does not match"):
        _, s = _load(path)
    assert s["rebuilt"] == 1


def test_the_cache_can_be_turned_off(tmp_path, cache, monkeypatch):
    path = tmp_path / "m.gguf"
    _write(path)
    monkeypatch.setenv("LIBREMAX_PACK_CACHE", "0")
    _, s = _load(path)
    assert s == {k: 0 for k in s} and not cache.exists()


def test_checksum_sees_changes_anywhere():
    """lmx_checksum (the entries' integrity check) changes with any one flipped bit, swapped words or a
    shorter length, and does not depend on the thread count."""
    so = native.lib()
    x = torch.from_numpy(np.random.default_rng(0).integers(0, 256, 3 * (1 << 20) + 77, dtype=np.uint8))
    h = so.lmx_checksum(x.data_ptr(), x.numel())
    for i in (0, 63, 64, 1 << 20, x.numel() - 1):
        y = x.clone()
        y[i] ^= 1
        assert so.lmx_checksum(y.data_ptr(), y.numel()) != h, i
    y = x.clone()
    y[0:8], y[8:16] = x[8:16].clone(), x[0:8].clone()
    assert not torch.equal(x, y) and so.lmx_checksum(y.data_ptr(), y.numel()) != h
    assert so.lmx_checksum(x.data_ptr(), x.numel() - 1) != h
    old = torch.get_num_threads()
    try:
        from max.engine import threads

        threads.apply(1)
        assert so.lmx_checksum(x.data_ptr(), x.numel()) == h
    finally:
        threads.apply(old)


# sha256 of the packed bytes of one fixed weight per kind: the layout lmx_pack writes.  When one of these
# changes, the layout changed: bump LMX_PACK_LAYOUT in csrc/qpacked.c (so no cache serves the old one), then
# update the values here.
PINNED = {
    "Q4_0": "03273543b0d70d0591a8fb53fb6d83ca9d4fd3acff93dbf9b86fafd2d25be5aa",
    "Q4_1": "41997460126d5c643410312a63c858d844bcd54fd88497a71c773a022faf3361",
    "Q5_0": "536ab6acb11aa3fb2f5355a52a6d7e298e26560b79a0ee2494cfedf9ba302d25",
    "Q5_1": "df8275bd8f62c519380fe38ee70d8ac9288ad7e756ca514af9858d6be7f6330d",
    "Q8_0": "79aef700f0362f87884ba89fcf7b8cd48c3e524f1258390cb6345b543277cac0",
    "Q4_K": "f4cc723f3e5a92a2fb0dd817b1e713efc95051cd7bc358f628738b58c1cc2de0",
    "Q5_K": "464852461730b522683196c6311eda717a36b2f910d5b6831fd61ac83a6e3ece",
    "Q6_K": "5dde724b447aa05cde823c249d60acb087e3d026ed3605d08e1467409f8c9628",
}


@pytest.mark.parametrize("kind", sorted(PINNED))
def test_the_packed_layout_is_pinned(kind):
    code = native.GGML_KINDS[kind]
    epb, bs = gguf.GGML_QUANT_SIZES[T[kind]]
    n, k = 19, 512
    blocks = torch.from_numpy(((np.arange(n * k // epb * bs, dtype=np.int64) * 131 + 7) % 251).astype(np.uint8)
                              .reshape(n, -1))
    got = hashlib.sha256(native.pack(blocks, code, n, k).numpy().tobytes()).hexdigest()
    assert native.lib().lmx_pack_layout() == b"g16-1"
    assert got == PINNED[kind], f"{kind}: the packed layout changed ({got}): bump LMX_PACK_LAYOUT"
