"""Page accounting of PagedKVCacheManager under random claim/fetch/step/release sequences."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from max.driver import CPU
from max.dtype import DType
from max.nn.kv_cache import InsufficientPagesError, KVCacheParams, PagedKVCacheManager
from test_kv_cache_context import FakeContext

PAGE = 3
MAX_SEQ = 24


def _make(prefix: bool, pages: int) -> PagedKVCacheManager:
    p = KVCacheParams(DType.float32, 1, 1, page_size=PAGE, enable_prefix_caching=prefix)
    return PagedKVCacheManager(p, 4, MAX_SEQ, 1, [CPU()], total_num_pages=pages)


class PagedCacheMachine(RuleBasedStateMachine):
    """Prompts come from a few shared prefixes so the prefix cache gets hits."""

    def __init__(self) -> None:
        super().__init__()
        self.m = _make(True, 20)
        self.live: dict[str, FakeContext] = {}
        self.n = 0
        self.prefixes = [[1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 9, 9, 9], [8, 8, 8, 8, 8, 8, 8, 8]]

    @precondition(lambda self: len(self.live) < 4)
    @rule(which=st.integers(0, 2), cut=st.integers(1, 8), tail=st.lists(st.integers(0, 9), max_size=5))
    def claim(self, which, cut, tail):
        prompt = self.prefixes[which][:cut] + tail
        rid = f"r{self.n}"
        self.n += 1
        self.m.claim(rid)
        self.live[rid] = FakeContext(rid, prompt)

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data(), num_steps=st.integers(1, 3), tok=st.integers(0, 9))
    def forward(self, data, num_steps, tok):
        ids = sorted(self.live)
        chosen = data.draw(st.lists(st.sampled_from(ids), min_size=1, unique=True))
        batch = [self.live[r] for r in chosen]
        batch = [c for c in batch if c.current_length + num_steps - 1 <= MAX_SEQ]
        if not batch:
            return
        free_before = self.m.num_free_pages
        blocks_before = {c.request_id: self.m.get_req_blocks(c.request_id) for c in batch}
        starts_before = [c.start_idx for c in batch]
        ok = self.m.can_fetch(batch, num_steps)
        try:
            self.m.fetch(batch, num_steps)
        except InsufficientPagesError:
            assert not ok
            assert self.m.num_free_pages == free_before
            assert [c.start_idx for c in batch] == starts_before
            assert {c.request_id: self.m.get_req_blocks(c.request_id) for c in batch} == blocks_before
            return
        assert ok
        for c in batch:
            pages = self.m.get_req_blocks(c.request_id)
            assert len(pages) * PAGE >= c.current_length + num_steps - 1
            assert c.active_length >= 1
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
        held = {p for r in self.live for p in self.m.get_req_blocks(r)}
        assert self.m.num_used_pages == len(held)
        assert self.m.num_free_pages + self.m.num_used_pages == self.m.total_num_pages

    def teardown(self):
        for rid in list(self.live):
            self.m.release(rid)
        assert self.m.num_free_pages == self.m.total_num_pages
        assert not self.m.pool.refcount.any()
        self.m.check_invariants()


PagedCacheMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
TestPagedCacheMachine = PagedCacheMachine.TestCase


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), prefix=st.booleans())
def test_random_loop_all_pages_free_after_release(seed, prefix):
    """A plain randomized scheduler loop (many steps per example)."""
    rng = np.random.default_rng(seed)
    m = _make(prefix, 16)
    live: dict[str, FakeContext] = {}
    for i in range(120):
        op = rng.integers(0, 3)
        if op == 0 and len(live) < 4:
            rid = f"q{i}"
            m.claim(rid)
            base = [1, 2, 3, 4, 5, 6] if rng.random() < 0.6 else []
            live[rid] = FakeContext(rid, base + list(rng.integers(0, 5, rng.integers(1, 6))))
        elif op == 1 and live:
            batch = [c for c in live.values() if c.current_length < MAX_SEQ]
            if batch and m.can_fetch(batch):
                m.fetch(batch)
                for c in batch:
                    c.update(int(rng.integers(0, 5)))
                m.step(batch)
        elif op == 2 and live:
            rid = list(live)[rng.integers(0, len(live))]
            m.release(rid)
            del live[rid]
        m.check_invariants()
    for rid in live:
        m.release(rid)
    assert m.num_free_pages == m.total_num_pages and not m.pool.refcount.any()
