"""The prefix cache's spill tier: pages evicted from the pool go to a bounded host-memory or disk store
(``PageSpillStore``) and come back, byte for byte, on a later prefix hit; its figures reach /metrics."""

from __future__ import annotations

import numpy as np
import pytest

from max.driver import CPU
from max.dtype import DType
from max.nn.kv_cache import KVCacheParams, PagedKVCacheManager
from max.nn.kv_cache.spill import PageSpillStore
from test_kv_cache_context import FakeContext

P = 4


def manager(pages=8, spill_gb=1.0, spill_dir=None, dtype=DType.float32, swap=True) -> PagedKVCacheManager:
    params = KVCacheParams(dtype=dtype, n_kv_heads=2, head_dim=8, page_size=P, enable_prefix_caching=True,
                           enable_kvcache_swapping_to_host=swap, host_kvcache_swap_space_gb=spill_gb if swap else None,
                           host_kvcache_spill_dir=str(spill_dir) if spill_dir is not None else None)
    return PagedKVCacheManager(params, 4, 16, 2, [CPU()], total_num_pages=pages)


def prefill(m: PagedKVCacheManager, rid: str, tokens, rng) -> tuple[FakeContext, list[int]]:
    """Claim, fetch, 'compute' (random K/V bytes into the request's new positions), commit."""
    ctx = FakeContext(rid, tokens)
    m.claim(rid)
    m.fetch([ctx])
    pages = m.get_req_blocks(rid)
    blocks = m.device_buffers[0]._torch()
    for pos in range(int(ctx.start_idx), int(ctx.active_idx)):
        page = pages[pos // P]
        blocks[page, :, :, pos % P] = blocks.new_tensor(rng.standard_normal(blocks[page, :, :, 0].shape))
    ctx.update(7)
    m.step([ctx])
    return ctx, pages


def page_bytes(m: PagedKVCacheManager, page: int) -> np.ndarray:
    return m.device_buffers[0]._torch()[page].clone().numpy()


@pytest.mark.parametrize("where", ["host", "disk"])
def test_evicted_pages_come_back_from_the_spill_tier(where, tmp_path):
    rng = np.random.default_rng(0)
    m = manager(spill_dir=tmp_path / "spill" if where == "disk" else None)
    assert m.spill is not None and m.spill.kind == where
    assert "spill tier: up to 1.0 GiB in " + (str(tmp_path / "spill") if where == "disk" else "host memory") \
        in m.describe()
    prefix = list(range(100, 112))  # 3 full pages
    _, pa = prefill(m, "a", prefix + [1], rng)
    saved = [page_bytes(m, p) for p in pa[:3]]
    m.release("a")
    assert m.num_cached_pages == 3
    # two other requests take every page of the pool: a's cached pages are evicted into the tier
    prefill(m, "b", list(range(200, 215)), rng)
    prefill(m, "c", list(range(300, 315)), rng)
    assert m.num_cached_pages == 6 and m.spill.stored_pages == 3 and len(m.spill) == 3
    if where == "disk":
        assert len(list((tmp_path / "spill").glob("*.kvpage"))) == 3
    m.release("b")
    m.release("c")
    d = FakeContext("d", prefix + [5, 6])
    m.claim("d")
    m.fetch([d])
    assert d.start_idx == 12  # the 3 pages were not recomputed
    pd = m.get_req_blocks("d")
    for p, want in zip(pd[:3], saved):
        np.testing.assert_array_equal(page_bytes(m, p), want)
    assert m.spill_hit_tokens == 12 and m.prefix_cache_hit_tokens == 12 and m.spill.hit_pages == 3
    # a's pages left the tier; d's 4 pages took the pool's 2 never-cached pages and evicted 2 of b's / c's
    assert len(m.spill) == 2 and m.spill.stored_pages == 5
    m.check_invariants()
    # the restored pages are in the pool's index again: a next request shares them without the tier
    e = FakeContext("e", prefix + [9])
    m.claim("e")
    m.fetch([e])
    assert m.get_req_blocks("e")[:3] == pd[:3] and m.spill.hit_pages == 3
    m.check_invariants()
    m.reset_prefix_cache()
    assert len(m.spill) == 0 and m.spill.bytes_used == 0
    if where == "disk":
        assert not list((tmp_path / "spill").glob("*.kvpage"))


def test_without_the_tier_an_evicted_prefix_is_recomputed():
    rng = np.random.default_rng(1)
    m = manager(swap=False)
    assert m.spill is None
    prefix = list(range(100, 112))
    prefill(m, "a", prefix + [1], rng)
    m.release("a")
    prefill(m, "b", list(range(200, 215)), rng)
    prefill(m, "c", list(range(300, 315)), rng)
    m.release("b")
    m.release("c")
    d = FakeContext("d", prefix + [5])
    m.claim("d")
    m.fetch([d])
    assert d.start_idx == 0 and m.prefix_cache_hit_tokens == 0


def test_quantised_pages_spill_and_return_bit_exact():
    rng = np.random.default_rng(2)
    m = manager(dtype=DType.int8)
    assert m.device_buffers[0]._torch().shape[-1] == 8 + 4  # codes + float32 scale
    prefix = list(range(100, 112))
    _, pa = prefill(m, "a", prefix + [1], rng)
    saved = [page_bytes(m, p) for p in pa[:3]]
    m.release("a")
    prefill(m, "b", list(range(200, 215)), rng)
    prefill(m, "c", list(range(300, 315)), rng)
    m.release("b")
    m.release("c")
    d = FakeContext("d", prefix + [5])
    m.claim("d")
    m.fetch([d])
    assert d.start_idx == 12
    for p, want in zip(m.get_req_blocks("d")[:3], saved):
        np.testing.assert_array_equal(page_bytes(m, p), want)


def test_a_batch_restoring_the_same_page_twice_shares_it():
    rng = np.random.default_rng(3)
    m = manager(pages=8)
    prefix = list(range(100, 108))  # 2 full pages
    prefill(m, "a", prefix + [1], rng)
    m.release("a")
    prefill(m, "b", list(range(200, 215)), rng)
    prefill(m, "c", list(range(300, 315)), rng)
    m.release("b")
    m.release("c")
    assert m.spill.stored_pages == 2  # a's two cached pages
    x, y = FakeContext("x", prefix + [5]), FakeContext("y", prefix + [6, 7])
    m.claim("x")
    m.claim("y")
    m.fetch([x, y])
    assert x.start_idx == y.start_idx == 8
    assert m.get_req_blocks("x")[:2] == m.get_req_blocks("y")[:2]
    assert m.spill.hit_pages == 2
    m.check_invariants()


def test_restoring_into_a_full_tier_keeps_the_pages_being_restored():
    """The tier holds exactly a's 3 pages and the pool has no never-cached page: each restore evicts one of
    c's cached pages into the full tier, which drops its least recently used page -- one of a's pages not
    restored yet, whose contents must already be in hand."""
    rng = np.random.default_rng(5)
    page_bytes = 2 * 2 * P * 2 * 8 * 4
    m = manager(spill_gb=3 * page_bytes / (1 << 30))
    assert m.spill.capacity_bytes == 3 * page_bytes
    prefix = list(range(100, 112))
    _, pa = prefill(m, "a", prefix + [1], rng)
    saved = [page_bytes_of(m, p) for p in pa[:3]]
    m.release("a")
    prefill(m, "b", list(range(200, 215)), rng)  # held throughout
    prefill(m, "c", list(range(300, 316)), rng)  # 4 full pages, all cached once released
    m.release("c")
    assert len(m.spill) == 3 and m.pool.num_free == 4 and not m.pool._free
    d = FakeContext("d", prefix + [5, 6])
    m.claim("d")
    m.fetch([d])
    assert d.start_idx == 12 and m.spill.dropped_pages >= 1
    for p, want in zip(m.get_req_blocks("d")[:3], saved):
        np.testing.assert_array_equal(page_bytes_of(m, p), want)
    m.check_invariants()


def test_chunked_prefill_lookup_restores_only_while_pages_are_free():
    """``reuse_cached_prefix`` (called before chunking a long prompt) brings spilled pages back only while
    free pages last; the rest of the prompt is computed."""
    rng = np.random.default_rng(6)
    m = manager(pages=8)
    prefix = list(range(100, 112))
    prefill(m, "a", prefix + [1], rng)
    m.release("a")
    prefill(m, "b", list(range(200, 215)), rng)
    prefill(m, "c", list(range(300, 315)), rng)  # a's 3 pages are in the tier, the pool is full
    m.release("c")
    m.release("b")
    prefill(m, "h1", list(range(400, 415)), rng)  # 4 more pages held: 4 pages (b's / c's cached) free
    prefill(m, "h2", list(range(500, 506)), rng)  # 2 more held: 2 free
    assert m.pool.num_free == 2
    d = FakeContext("d", prefix + [5])
    m.claim("d")
    assert m.reuse_cached_prefix(d) == 2 * P  # 2 of a's 3 pages came back, in order
    assert d.start_idx == 8 and m.spill_hit_tokens == 8
    m.check_invariants()


def page_bytes_of(m: PagedKVCacheManager, page: int) -> np.ndarray:
    return page_bytes(m, page)


def test_store_is_bounded_lru_and_validates():
    s = PageSpillStore(100)
    a = [np.zeros(40, np.uint8)]
    assert s.put(b"1", a) and s.put(b"2", a)
    assert s.get(b"1") is not None  # 1 is now the most recently used
    assert s.put(b"3", a)  # 120 > 100 bytes: the least recently used (2) is dropped
    assert b"2" not in s and b"1" in s and b"3" in s and s.dropped_pages == 1 and s.bytes_used == 80
    assert not PageSpillStore(100).put(b"big", [np.zeros(101, np.uint8)])  # larger than the whole store
    with pytest.raises(ValueError, match="same shapes"):
        s.put(b"4", [np.zeros(8, np.float32)])
    with pytest.raises(ValueError, match="capacity_bytes"):
        PageSpillStore(0)
    with pytest.raises(ValueError, match="host_kvcache_spill_dir requires"):
        KVCacheParams(dtype=DType.float32, n_kv_heads=1, head_dim=4, host_kvcache_spill_dir="/tmp/x")


def test_disk_store_round_trip(tmp_path):
    s = PageSpillStore(1 << 20, tmp_path)
    arrays = [np.arange(24, dtype=np.uint8).reshape(2, 12), np.arange(24, 48, dtype=np.uint8).reshape(2, 12)]
    s.put(bytes(range(16)), arrays)
    got = s.get(bytes(range(16)))
    for g, w in zip(got, arrays):
        np.testing.assert_array_equal(g, w)
    s.close()
    assert not list(tmp_path.iterdir())


def test_metrics_report_prefix_and_spill_hits():
    pytest.importorskip("prometheus_client")
    from max.serve.metrics import ServeMetrics

    rng = np.random.default_rng(4)
    m = manager()
    metrics = ServeMetrics()
    metrics.bind(None, m)
    prefix = list(range(100, 112))
    prefill(m, "a", prefix + [1], rng)
    m.release("a")
    prefill(m, "b", list(range(200, 215)), rng)
    prefill(m, "c", list(range(300, 315)), rng)
    m.release("b")
    m.release("c")
    d = FakeContext("d", prefix + [5, 6])
    m.claim("d")
    m.fetch([d])
    text = metrics.render()[0].decode()

    def value(name: str) -> float:
        line = next(ln for ln in text.splitlines() if ln.startswith(f"maxserve_{name} "))
        return float(line.split()[1])

    queried = 13 + 15 + 15 + 14
    assert value("prefix_cache_queried_tokens") == queried
    assert value("prefix_cache_hit_tokens") == 12 and value("prefix_cache_spill_hit_tokens") == 12
    assert value("prefix_cache_hit_ratio") == pytest.approx(12 / queried)
    assert value("prefix_cache_spill_hit_ratio") == pytest.approx(12 / queried)
    assert value("kv_spill_hit_pages") == 3 and value("kv_spill_stored_pages") == m.spill.stored_pages
    assert value("kv_spill_pages") == len(m.spill) and value("kv_spill_bytes") == m.spill.bytes_used > 0
    metrics.bind(None, m)  # binding again is harmless


# ------------------------------------------------------------------ random sequences, contents checked
from hypothesis import settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule  # noqa: E402

from max.nn.kv_cache import InsufficientPagesError  # noqa: E402

RP, RMAX = 3, 15


def _value(tokens) -> float:
    """What the 'model' writes at a position: a function of the tokens up to it (as K/V are)."""
    return float(hash(tuple(int(t) for t in tokens)) % 100003)


class SpillMachine(RuleBasedStateMachine):
    """Claim / forward / release over a small pool and a 4-page spill tier, prompts sharing prefixes: every
    position a request reads (reused, restored or computed) holds what its tokens would have computed."""

    pages = 6

    def __init__(self) -> None:
        super().__init__()
        p = KVCacheParams(DType.float32, 1, 1, page_size=RP, enable_prefix_caching=True,
                          enable_kvcache_swapping_to_host=True, host_kvcache_swap_space_gb=4 * RP * 8 / (1 << 30))
        self.m = PagedKVCacheManager(p, 4, RMAX, 1, [CPU()], total_num_pages=self.pages)
        self.blocks = self.m.device_buffers[0]._torch()
        self.live: dict[str, FakeContext] = {}
        self.n = 0
        self.prefixes = [[1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 9, 9, 9], [8, 8, 8, 8, 8, 8, 8, 8]]

    @precondition(lambda self: len(self.live) < 3)
    @rule(which=st.integers(0, 2), cut=st.integers(1, 8), tail=st.lists(st.integers(0, 9), max_size=4))
    def claim(self, which, cut, tail):
        rid = f"r{self.n}"
        self.n += 1
        self.m.claim(rid)
        self.live[rid] = FakeContext(rid, self.prefixes[which][:cut] + tail)

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data(), tok=st.integers(0, 9))
    def forward(self, data, tok):
        chosen = data.draw(st.lists(st.sampled_from(sorted(self.live)), min_size=1, unique=True))
        batch = [self.live[r] for r in chosen if self.live[r].current_length < RMAX]
        if not batch:
            return
        try:
            self.m.fetch(batch)
        except InsufficientPagesError:
            return
        for c in batch:
            pages, toks = self.m.get_req_blocks(c.request_id), c.tokens
            for pos in range(int(c.active_idx)):
                cell = self.blocks[pages[pos // RP], :, 0, pos % RP, 0, 0]
                if pos < int(c.start_idx):  # in the cache: reused, restored or computed earlier
                    assert float(cell[0]) == float(cell[1]) == _value(toks[:pos + 1]), (c.request_id, pos)
                else:
                    cell[:] = _value(toks[:pos + 1])
            c.update(tok)
        self.m.step(batch)

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def release(self, data):
        rid = data.draw(st.sampled_from(sorted(self.live)))
        del self.live[rid]
        self.m.release(rid)

    @invariant()
    def accounting(self):
        self.m.check_invariants()
        assert self.m.spill.bytes_used <= self.m.spill.capacity_bytes

    def teardown(self):
        for rid in list(self.live):
            self.m.release(rid)
        assert self.m.num_free_pages == self.m.total_num_pages


SpillMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
TestSpillMachine = SpillMachine.TestCase


def test_the_random_sequences_do_hit_the_spill_tier():
    """The machine above is not vacuous: a fixed sequence of its kind restores pages."""
    SpillMachine.pages = 8
    try:
        m = SpillMachine()
    finally:
        SpillMachine.pages = 6

    class Draw:
        def __init__(self, ids):
            self.ids = ids

        def draw(self, _):
            return self.ids

    m.claim(which=0, cut=7, tail=[1] * 5)  # r0: 12 tokens, 4 full pages
    m.forward(data=Draw(["r0"]), tok=4)
    m.release(data=Draw("r0"))
    m.claim(which=2, cut=8, tail=[2] * 4)  # r1 takes the 4 never-used pages
    m.forward(data=Draw(["r1"]), tok=4)
    m.claim(which=1, cut=6, tail=[3] * 6)  # r2 shares r0's first page and evicts its other 3 into the tier
    m.forward(data=Draw(["r2"]), tok=4)
    assert m.m.spill.stored_pages == 3
    m.release(data=Draw("r1"))
    m.release(data=Draw("r2"))
    m.claim(which=0, cut=7, tail=[1] * 5)  # r0's prompt again
    m.forward(data=Draw(["r3"]), tok=4)  # checks every position it reads
    assert m.m.spill_hit_tokens == 2 * RP and m.m.prefix_cache_hit_tokens == RP + 3 * RP  # r2: 1 page, r3: 3
    m.teardown()


def test_random_loop_restores_pages_with_the_right_contents():
    """A plain randomized scheduler loop over the machine's rules (each forward checks every position it
    reads): across these seeds pages do come back from the tier, with the right contents."""

    class Draw:
        def __init__(self, v):
            self.v = v

        def draw(self, _):
            return self.v

    rng = np.random.default_rng(0)
    restored = 0
    for _ in range(30):
        m = SpillMachine()
        for _ in range(60):
            op = rng.integers(0, 3)
            if op == 0 and len(m.live) < 3:
                m.claim(which=int(rng.integers(0, 3)), cut=int(rng.integers(1, 9)),
                        tail=[int(t) for t in rng.integers(0, 10, rng.integers(0, 5))])
            elif op == 1 and m.live:
                ids = sorted(m.live)
                chosen = [str(r) for r in rng.choice(ids, rng.integers(1, len(ids) + 1), replace=False)]
                m.forward(data=Draw(chosen), tok=int(rng.integers(0, 10)))
            elif op == 2 and m.live:
                m.release(data=Draw(sorted(m.live)[rng.integers(0, len(m.live))]))
            m.accounting()
        restored += m.m.spill.hit_pages
        m.teardown()
    assert restored >= 5


def test_a_plan_allocating_never_takes_a_cached_page_another_plan_of_the_batch_hits():
    """Free pages are all cached (a's prefix page least recently freed): x, first in the batch, needs a new
    page and y hits a's page.  Every hit is held before any allocation, so x gets another page (allocating
    first handed x the page y then shared, and x's tokens overwrote y's prefix)."""
    rng = np.random.default_rng(7)
    m = PagedKVCacheManager(KVCacheParams(dtype=DType.float32, n_kv_heads=1, head_dim=2, page_size=P,
                                          enable_prefix_caching=True), 4, 16, 1, [CPU()], total_num_pages=5)
    prefill(m, "a", [1, 2, 3, 4, 7], rng)
    m.release("a")
    prefill(m, "z", list(range(50, 59)), rng)
    m.release("z")
    prefill(m, "w", list(range(60, 65)), rng)  # held: no never-cached page is left
    assert not m.pool._free and m.pool.num_free == 3
    x, y = FakeContext("x", [99]), FakeContext("y", [1, 2, 3, 4, 5])
    m.claim("x")
    m.claim("y")
    m.fetch([x, y])
    assert y.start_idx == 4
    assert not set(m.get_req_blocks("x")) & set(m.get_req_blocks("y"))
    m.check_invariants()
