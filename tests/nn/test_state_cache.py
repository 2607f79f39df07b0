"""HybridKVCacheManager: state slots claimed and freed with the request (zeroed for a new one), the inputs
it hands the graph, a rewound request refused, prefix caching with state snapshots at page boundaries (a
hit restores the snapshot, hits cut back to a snapshot, snapshots dropped with their pages and replaced
least recently used first), one memory budget for pages, slots and snapshots, the start-up line and /metrics
gauges; a graph step updating only the batch's slots."""

from __future__ import annotations

import numpy as np
import pytest

from max import driver
from max.dtype import DType
from max.nn.kv_cache import (
    HybridKVCacheInputs,
    HybridKVCacheManager,
    KVCacheParams,
    StateSpec,
    kv_cache_budget,
    state_bytes,
    state_slots_for,
)
from max.pipelines.lib.step_plan import snapshot_cut
from test_kv_cache_context import FakeContext

SPECS = [StateSpec("layers.0.conv", (6, 2)), StateSpec("layers.0.ssm", (2, 3, 4))]


def _mgr(max_batch: int = 3, prefix: bool = True, **kw) -> HybridKVCacheManager:
    params = KVCacheParams(dtype=DType.float32, n_kv_heads=1, head_dim=4, page_size=4, enable_prefix_caching=prefix)
    return HybridKVCacheManager(params, max_batch_size=max_batch, max_seq_len=32, num_layers=1,
                                devices=[driver.CPU()], state_specs=SPECS, **kw)


def test_slots_follow_requests_and_are_zeroed():
    m = _mgr(prefix=False)
    assert not m.params.enable_prefix_caching and m.num_snapshots == 0
    assert not _mgr(num_snapshots=0).params.enable_prefix_caching  # no snapshots: no prefix caching
    assert m.state_snapshot_interval is None and _mgr(num_snapshots=0).state_snapshot_interval is None
    m.claim("a")
    m.claim("b")
    sa, sb = m.slot_of("a"), m.slot_of("b")
    assert sa != sb and m.state_slots_used == 2
    m.state_buffers[1]._torch()[sa] = 7.0  # a state left behind by "a"
    m.release("a")
    assert m.state_slots_used == 1
    m.claim("c")  # reuses a's slot, zeroed
    assert m.slot_of("c") == sa
    assert not m.state_buffers[1]._torch()[sa].any()
    m.check_invariants()
    with pytest.raises(ValueError, match="all 3 slots"):
        m.claim("d")
        m.claim("e")
    for r in ("b", "c", "d"):
        m.release(r)
    assert m.state_slots_used == 0 and m.num_free_pages == m.total_num_pages
    m.check_invariants()


def test_fetch_inputs_and_rewind_refused():
    m = _mgr()
    a, b = FakeContext("a", [1, 2, 3, 4, 5]), FakeContext("b", [9, 8])
    for c in (a, b):
        m.claim(c.request_id)
    (inp,) = m.fetch([b, a])
    assert isinstance(inp, HybridKVCacheInputs) and len(list(inp)) == 5 + len(SPECS)
    np.testing.assert_array_equal(inp.state_slots.to_numpy(), [m.slot_of("b"), m.slot_of("a")])
    assert list(inp)[5:] == m.state_buffers
    syms = m.input_symbols()[0]
    assert len(list(syms)) == len(list(inp)) and list(syms.states[1].shape) == [3, 2, 3, 4]
    a.bump_token_indices(start_idx=5, active_idx=1, end_idx=1)
    m.fetch([a])  # follows on from where the state stopped
    a.set_token_indices(start_idx=2)  # a rewind: the recurrent state cannot follow
    with pytest.raises(ValueError, match="cannot be rewound"):
        m.fetch([a])
    m.state_buffers[0]._torch()[m.slot_of("a")] = 1.0
    a.set_token_indices(start_idx=0)  # a restart from 0 zeroes the slot
    m.fetch([a])
    assert not m.state_buffers[0]._torch()[m.slot_of("a")].any()


def test_budget_covers_pages_and_state():
    params = KVCacheParams(dtype=DType.float32, n_kv_heads=1, head_dim=4, page_size=4)
    page = params.bytes_per_page(1)
    st = state_bytes(SPECS, 3)
    assert st == 3 * (6 * 2 + 2 * 3 * 4) * 4
    got = kv_cache_budget(params, 1, 3, 32, [driver.CPU()], kv_cache_memory=st + 20 * page, state_bytes=st)
    assert got == 20 * page
    with pytest.raises(ValueError, match="recurrent-state slots alone"):
        kv_cache_budget(params, 1, 3, 32, [driver.CPU()], kv_cache_memory=st, state_bytes=st)
    m = _mgr(prefix=False, available_cache_memory=got)
    assert m.total_num_pages == 20 and m.state_memory_bytes == st
    line = m.describe()
    assert "KV cache: 20 pages" in line and "recurrent state: 3 slots" in line and "prefix caching off" in line
    # with prefix caching, the snapshots (one per request slot by default) come out of the same budget
    assert state_slots_for(3, True) == 6 and state_slots_for(3, True, 5) == 8 and state_slots_for(3, False) == 3
    m = _mgr(available_cache_memory=got)
    assert m.state_memory_bytes == state_bytes(SPECS, 6) and m.state_snapshots_total == 3
    assert "3 slots + 3 prefix-cache snapshots" in m.describe()
    with pytest.raises(ValueError, match="num_snapshots"):
        _mgr(num_snapshots=-1)


def test_tensor_parallel_refused():
    params = KVCacheParams(dtype=DType.float32, n_kv_heads=2, head_dim=4, page_size=4, n_devices=2)
    with pytest.raises(NotImplementedError, match="tensor parallelism is not supported"):
        HybridKVCacheManager(params, 2, 32, 1, [driver.CPU(), driver.CPU()], state_specs=SPECS)


def test_metrics_report_state():
    from max.serve.metrics import ServeMetrics

    m = _mgr()
    sm = ServeMetrics()
    sm.bind(kv_manager=m)
    m.claim("a")
    _run(m, FakeContext("a", list(range(8))))  # two full pages: a snapshot at position 8
    text = sm.render()[0].decode()
    assert "maxserve_state_cache_slots_used 1.0" in text
    assert "maxserve_state_cache_slots_total 3.0" in text
    assert "maxserve_state_cache_snapshots_used 1.0" in text
    assert "maxserve_state_cache_snapshots_total 3.0" in text
    assert f"maxserve_state_cache_capacity_bytes {float(m.state_memory_bytes)}" in text
    assert m.state_memory_bytes == state_bytes(SPECS, 6)


def test_graph_step_updates_only_the_batch_slots():
    """A conv step through a graph over the manager's inputs writes the batch's slots and no other."""
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType, ops

    m = _mgr()
    for r in ("a", "b", "c"):
        m.claim(r)
    a, c = FakeContext("a", [1, 2, 3]), FakeContext("c", [4])
    (inp,) = m.fetch([c, a])
    syms = m.input_symbols()[0]
    cpu = DeviceRef.CPU()
    with Graph("conv", input_types=[TensorType(DType.float32, ["T", 6], cpu),
                                     TensorType(DType.uint32, ["B1"], cpu), *syms]) as g:
        x, offs, *cache = g.inputs
        w = ops.constant(np.ones((6, 3), np.float32), DType.float32, cpu)
        g.output(ops.causal_conv1d(x.tensor, w, cache[5].buffer, cache[4].tensor, offs.tensor))
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    (y,) = InferenceSession(devices=[driver.CPU()]).load(g).execute(
        driver.Buffer.from_numpy(x), driver.Buffer.from_numpy(np.array([0, 1, 4], np.uint32)), *inp)
    conv = m.state_buffers[0]._torch().numpy()
    np.testing.assert_array_equal(conv[m.slot_of("c")], np.stack([np.zeros(6), x[0]], 1))
    np.testing.assert_array_equal(conv[m.slot_of("a")], x[2:4].T)
    assert not conv[m.slot_of("b")].any()
    np.testing.assert_allclose(y.to_numpy()[3], x[1:4].sum(0))


# ------------------------------------------------------------------ prefix caching with state snapshots
def _run(m, ctx, state=None):
    """One step of ``ctx``'s pending tokens: fetch, write ``state`` (default: the position) into its slot as
    the model would, advance the context, commit (``step``)."""
    m.fetch([ctx])
    slot = m.slot_of(ctx.request_id)
    for buf in m.state_buffers:
        buf._torch()[slot] = float(ctx.active_idx if state is None else state)
    n = ctx.active_idx - ctx.start_idx
    ctx.bump_token_indices(start_idx=n)
    m.step([ctx])


def _decode(m, ctx, tok):
    ctx.tokens[ctx.end_idx] = tok
    ctx.bump_token_indices(active_idx=1, end_idx=1)
    _run(m, ctx)


def test_snapshot_at_a_page_boundary_restores_the_state_with_the_pages():
    m = _mgr()
    prompt = list(range(10, 20))  # 10 tokens, pages of 4: boundaries 4 and 8
    a = FakeContext("a", prompt)
    m.claim("a")
    assert m.state_snapshot_interval == 4
    assert snapshot_cut(a.start_idx, a.active_idx, m.state_snapshot_interval) == 8  # the prompt's step ends at
    # its last page boundary
    a.set_token_indices(active_idx=8)
    _run(m, a)
    assert m.state_snapshots_used == 1 and m.state_snapshots_taken == 1
    a.set_token_indices(active_idx=10)
    assert snapshot_cut(a.start_idx, a.active_idx, m.state_snapshot_interval) == 10
    _run(m, a)  # state at 10: off a boundary, no snapshot
    _decode(m, a, 5)
    _decode(m, a, 6)  # state at 12: a snapshot at the third page's end
    assert m.state_snapshots_used == 2
    m.check_invariants()
    # b shares a's first 9 tokens: pages 0-1 hit, its state comes from the snapshot at 8
    b = FakeContext("b", prompt[:9] + [99, 98])
    m.claim("b")
    m.fetch([b])
    assert b.start_idx == 8 and m.prefix_cache_hit_tokens == 8 and m.state_snapshot_restores == 1
    assert m.get_req_blocks("b")[:2] == m.get_req_blocks("a")[:2]
    for buf in m.state_buffers:
        assert (buf._torch()[m.slot_of("b")] == 8.0).all()
    m.check_invariants()
    # c repeats a's 12 tokens and more: three pages hit (the snapshot at 12)
    c = FakeContext("c", prompt + [5, 6, 7])
    m.claim("c")
    m.fetch([c])
    assert c.start_idx == 12 and (m.state_buffers[0]._torch()[m.slot_of("c")] == 12.0).all()
    for r in ("a", "b", "c"):
        m.release(r)
    assert m.num_free_pages == m.total_num_pages and m.state_slots_used == 0
    m.check_invariants()


def test_a_hit_is_cut_back_to_the_last_page_with_a_snapshot():
    m = _mgr()
    prompt = list(range(30, 43))  # 13 tokens
    a = FakeContext("a", prompt)
    m.claim("a")
    _run(m, a)  # one step to 13: pages 0-2 cached, but the state passed no boundary
    assert m.num_cached_pages == 3 and m.state_snapshots_used == 0
    b = FakeContext("b", prompt)
    m.claim("b")
    m.fetch([b])
    assert b.start_idx == 0 and m.prefix_cache_hit_tokens == 0  # K/V never reused without the state
    m.release("b")
    # a chunked second request reaches the boundary at 8: now a snapshot exists there
    c = FakeContext("c", prompt)
    m.claim("c")
    c.set_token_indices(active_idx=8)
    _run(m, c)
    assert m.state_snapshots_used == 1
    d = FakeContext("d", prompt)
    m.claim("d")
    assert m.reuse_cached_prefix(d) == 8  # pages 0-2 are cached, the snapshot stands at 8
    assert (m.state_buffers[1]._torch()[m.slot_of("d")] == 8.0).all()
    m.fetch([d])  # goes on from the restored state
    m.check_invariants()


def test_snapshots_leave_with_their_pages_and_least_recently_used_first():
    m = _mgr(max_batch=2, num_snapshots=2, total_num_pages=8)
    for i, rid in enumerate(("a", "b", "c")):
        ctx = FakeContext(rid, [100 * i + t for t in range(4)])
        m.claim(rid)
        _run(m, ctx)  # one page, the state at its end
        m.release(rid)
    assert m.state_snapshots_used == 2 and m.state_snapshots_taken == 3  # a's replaced by c's
    m.check_invariants()
    a = FakeContext("a2", list(range(4)) + [1])
    m.claim("a2")
    m.fetch([a])
    assert a.start_idx == 0  # a's page is cached, but its snapshot is gone
    m.release("a2")
    # filling the pool evicts the cached pages, and their snapshots with them
    big = FakeContext("big", list(range(500, 532)))
    m.claim("big")
    m.fetch([big])
    assert m.num_cached_pages == 0 and m.state_snapshots_used == 0
    m.check_invariants()
    m.release("big")
    ctx = FakeContext("e", list(range(700, 704)))
    m.claim("e")
    _run(m, ctx)
    assert m.state_snapshots_used == 1
    m.reset_prefix_cache()
    assert m.state_snapshots_used == 0
    m.check_invariants()
