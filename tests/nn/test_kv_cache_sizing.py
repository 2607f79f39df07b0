"""max.nn.kv_cache sizing (``kv_cache_budget``, ``parse_memory_size``) and page reuse order."""

from __future__ import annotations

import logging

import pytest

from max.driver import CPU
from max.dtype import DType
from max.nn.kv_cache import KVCacheParams, PagedKVCacheManager, format_bytes, kv_cache_budget, parse_memory_size
from max.nn.kv_cache import sizing
from test_kv_cache_context import FakeContext

P = 4


def params(**kw) -> KVCacheParams:
    base = dict(dtype=DType.bfloat16, n_kv_heads=3, head_dim=8, page_size=P)
    base.update(kw)
    return KVCacheParams(**base)


@pytest.mark.parametrize("text,want", [
    ("1073741824", 1 << 30), (4096, 4096), ("512MiB", 512 << 20), ("512M", 512 << 20), ("512m", 512 << 20),
    ("2GiB", 2 << 30), ("2G", 2 << 30), ("1.5GB", 1_500_000_000), ("800MB", 800_000_000), ("64 KiB", 64 << 10),
    ("1TiB", 1 << 40), ("10kB", 10_000),
])
def test_parse_memory_size(text, want):
    assert parse_memory_size(text) == want


@pytest.mark.parametrize("bad", ["", "lots", "-1G", "0", "0.1", "1 GiBB", "G", True, float("inf")])
def test_parse_memory_size_rejects(bad):
    with pytest.raises(ValueError, match="memory size|at least 1 byte"):
        parse_memory_size(bad)


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(3 << 30) == "3.0 GiB"
    assert format_bytes(1536 << 10) == "1.5 MiB"


def _budget(monkeypatch, free, **kw):
    monkeypatch.setattr(sizing, "available_memory", lambda d: free)
    p = kw.pop("p", params())
    return kv_cache_budget(p, 2, kw.pop("batch", 4), kw.pop("seq", 30), [CPU()], **kw)


def test_default_budget_is_full_batch_at_max_length(monkeypatch):
    p = params()
    page_bytes = p.bytes_per_page(2)
    assert page_bytes == 2 * 2 * 3 * 8 * 2 * P  # K and V, 2 layers, 3 heads, head_dim 8, bf16, 4 tokens
    # 4 sequences of 30 tokens = 4 x 8 pages, whatever the memory (plenty free)
    assert _budget(monkeypatch, 1 << 40) == 4 * 8 * page_bytes
    assert _budget(monkeypatch, None) == 4 * 8 * page_bytes  # free memory unknown: no cap
    assert _budget(monkeypatch, 1 << 40, batch=1, seq=4) == page_bytes
    # the dtype counts: float32 doubles the bytes of the same pool
    assert _budget(monkeypatch, 1 << 40, p=params(dtype=DType.float32)) == 2 * 4 * 8 * page_bytes


def test_default_budget_is_capped_by_free_memory(monkeypatch, caplog):
    page_bytes = params().bytes_per_page(2)
    free = 20 * page_bytes
    with caplog.at_level(logging.WARNING, logger="max.nn.kv_cache"):
        got = _budget(monkeypatch, free, device_memory_utilization=0.5)
    assert got == 10 * page_bytes  # half of the free memory, whole pages
    assert "capped" in caplog.text and "--kv-cache-memory" in caplog.text
    with pytest.raises(ValueError, match="not enough free memory.*--max-length"):
        _budget(monkeypatch, 10 * page_bytes, device_memory_utilization=0.5)  # 5 pages < 8 for one sequence
    with pytest.raises(ValueError, match="device_memory_utilization"):
        _budget(monkeypatch, free, device_memory_utilization=1.5)


def test_default_budget_is_bounded_by_the_default_token_count(monkeypatch):
    """A long context times a big batch (SmolLM2-135M: 16 x 8192 tokens, 5.6 GiB of float32 K/V) is
    not reserved by default: the pool holds DEFAULT_KV_CACHE_TOKENS tokens, and never less than one
    sequence of max_length."""
    p = params()
    page_bytes = p.bytes_per_page(2)
    cap = sizing.DEFAULT_KV_CACHE_TOKENS
    assert _budget(monkeypatch, 1 << 40, batch=16, seq=8192) == (cap // P) * page_bytes
    assert _budget(monkeypatch, 1 << 40, batch=2, seq=8192) == 2 * (8192 // P) * page_bytes  # below the cap
    assert _budget(monkeypatch, 1 << 40, batch=4, seq=2 * cap) == (2 * cap // P) * page_bytes  # one sequence
    # an explicit size is not bounded by it
    assert _budget(monkeypatch, 1 << 40, batch=16, seq=8192, kv_cache_memory=16 * 8192 // P * page_bytes) == \
        16 * 8192 // P * page_bytes


def test_describe_says_when_a_full_batch_does_not_fit():
    m = PagedKVCacheManager(params(), 16, 64, 2, [CPU()], total_num_pages=32)  # 2 sequences of 16 pages
    d = m.describe()
    assert "(2 sequences of 64 tokens; a full batch, 16 x 64 tokens, would take" in d
    assert "--kv-cache-memory" in d
    full = PagedKVCacheManager(params(), 2, 64, 2, [CPU()], total_num_pages=32)
    assert "full batch" not in full.describe()


def test_explicit_kv_cache_memory(monkeypatch):
    page_bytes = params().bytes_per_page(2)
    # exactly what was asked (whole pages), even beyond the default and the free memory
    assert _budget(monkeypatch, page_bytes, kv_cache_memory=100 * page_bytes + 7) == 100 * page_bytes
    assert _budget(monkeypatch, 1 << 40, kv_cache_memory=9 * page_bytes) == 9 * page_bytes
    with pytest.raises(ValueError, match="--kv-cache-memory .* too small.*one sequence of max_length 30"):
        _budget(monkeypatch, 1 << 40, kv_cache_memory=7 * page_bytes)


def test_available_memory_of_the_host_is_positive():
    free = sizing.available_memory(CPU())
    assert free is None or free > 0


def test_manager_from_budget_describes_itself(monkeypatch, caplog):
    p = params(enable_prefix_caching=True)
    budget = _budget(monkeypatch, 1 << 40, p=p)
    with caplog.at_level(logging.DEBUG, logger="max.nn.kv_cache"):
        m = PagedKVCacheManager(p, 4, 30, 2, [CPU()], available_cache_memory=budget)
    assert m.total_num_pages == 32 and m.capacity_tokens == 128
    assert m.memory_bytes == budget
    d = m.describe()
    assert "32 pages x 4 tokens = 128 tokens" in d and "bf16" in d and "4 sequences of 30 tokens" in d
    assert d in caplog.text  # logged once the pool exists


# ---------------------------------------------------------------- page reuse order


def _serve_one(m: PagedKVCacheManager, rid: str, prompt: list[int], new_tokens: int) -> list[int]:
    ctx = FakeContext(rid, prompt)
    m.external_claim(rid)
    for _ in range(new_tokens):
        m.fetch([ctx], 1)
        ctx.update(1000 + ctx.active_idx)
        m.step([ctx])
    pages = m.get_req_blocks(rid)
    m.release(rid)
    return pages


def test_sequential_requests_reuse_the_same_pages():
    """Most-recently-freed first: a steady stream of short requests keeps touching the same few pages
    (a first-in-first-out free list would walk through the whole pool, committing all of its memory)."""
    m = PagedKVCacheManager(params(), 8, 64, 2, [CPU()], total_num_pages=64)
    touched: set[int] = set()
    for i in range(40):
        touched.update(_serve_one(m, f"r{i}", [i, i + 1, 7 * i], 4))  # 3 + 4 tokens: 2 pages
        m.check_invariants()
    assert touched == {0, 1}
    assert m.num_free_pages == 64


def test_prefix_cache_keeps_lru_order_and_uncached_pages_are_reused_first():
    m = PagedKVCacheManager(params(enable_prefix_caching=True), 8, 32, 2, [CPU()], total_num_pages=8)
    # 8 prompt tokens + 2 new: two full (cached) pages and an uncached tail page each
    a = _serve_one(m, "a", list(range(8)), 2)
    assert a == [0, 1, 2]
    b = _serve_one(m, "b", list(range(100, 108)), 2)
    assert b == [2, 3, 4]  # a's freed tail page first, then pages never used
    assert m.num_cached_pages == 4 and all(m.pool.is_cached(p) for p in (0, 1, 2, 3))
    assert _serve_one(m, "c", [50], 1) == [4]  # the most recently freed uncached page
    # 5 new pages: the 4 never-cached free pages (the most recently freed one first), then the least
    # recently used cached page: a's tail (released before its head)
    ctx = FakeContext("big", list(range(200, 220)))
    m.external_claim("big")
    m.fetch([ctx], 1)
    assert m.get_req_blocks("big") == [4, 5, 6, 7, 1]
    assert not m.pool.is_cached(1) and all(m.pool.is_cached(p) for p in (0, 2, 3))
    m.release("big")
    m.check_invariants()
    # a's head page still serves a's prefix
    ctx = FakeContext("a2", list(range(8)) + [9])
    m.external_claim("a2")
    m.fetch([ctx], 1)
    assert m.get_req_blocks("a2")[0] == 0 and ctx.start_idx == 4
