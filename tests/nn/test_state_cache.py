"""HybridKVCacheManager: state slots claimed and freed with the request (zeroed for a new one), the inputs
it hands the graph, a rewound request refused, prefix caching switched off, one memory budget for pages and
slots, the start-up line and /metrics gauges; a graph step updating only the batch's slots."""

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
)
from test_kv_cache_context import FakeContext

SPECS = [StateSpec("layers.0.conv", (6, 2)), StateSpec("layers.0.ssm", (2, 3, 4))]


def _mgr(max_batch: int = 3, prefix: bool = True, **kw) -> HybridKVCacheManager:
    params = KVCacheParams(dtype=DType.float32, n_kv_heads=1, head_dim=4, page_size=4, enable_prefix_caching=prefix)
    return HybridKVCacheManager(params, max_batch_size=max_batch, max_seq_len=32, num_layers=1,
                                devices=[driver.CPU()], state_specs=SPECS, **kw)


def test_slots_follow_requests_and_are_zeroed():
    m = _mgr()
    assert not m.params.enable_prefix_caching  # asked for; refused for recurrent state
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
    m = _mgr(available_cache_memory=got)
    assert m.total_num_pages == 20 and m.state_memory_bytes == st
    line = m.describe()
    assert "KV cache: 20 pages" in line and "recurrent state: 3 slots" in line and "prefix caching off" in line


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
    text = sm.render()[0].decode()
    assert "maxserve_state_cache_slots_used 1.0" in text
    assert "maxserve_state_cache_slots_total 3.0" in text
    assert f"maxserve_state_cache_capacity_bytes {float(m.state_memory_bytes)}" in text


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
