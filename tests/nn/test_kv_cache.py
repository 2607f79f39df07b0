"""max.nn.kv_cache: params, sizing, paged manager lifecycle, errors, prefix caching, layout."""

from __future__ import annotations

import math

import numpy as np
import pytest

from max.driver import CPU, Buffer
from max.dtype import DType
from max.graph import BufferType, TensorType
from max.nn.kv_cache import (
    DEFAULT_PAGE_SIZE,
    InsufficientPagesError,
    KVCacheInputsSequence,
    KVCacheParams,
    KVCacheStrategy,
    PagedKVCacheManager,
    RaggedKVCacheInputs,
)
from test_kv_cache_context import FakeContext

P = 4  # page size used by most tests


def params(**kw) -> KVCacheParams:
    base = dict(dtype=DType.float32, n_kv_heads=2, head_dim=3, page_size=P)
    base.update(kw)
    return KVCacheParams(**base)


def manager(prefix=False, pages=32, max_batch_size=8, max_seq_len=64, num_layers=2, **kw) -> PagedKVCacheManager:
    return PagedKVCacheManager(
        params(enable_prefix_caching=prefix, **kw), max_batch_size, max_seq_len, num_layers, [CPU()], total_num_pages=pages
    )


def run_prefill(m: PagedKVCacheManager, ctx: FakeContext, next_token: int = 7, num_steps: int = 1):
    inputs = m.fetch([ctx], num_steps)
    ctx.update(next_token)
    m.step([ctx])
    return inputs


# ------------------------------------------------------------------ params


def test_params_defaults_and_derived_fields():
    p = KVCacheParams(DType.bfloat16, 8, 64)
    assert p.enable_prefix_caching is False and p.enable_kvcache_swapping_to_host is False
    assert p.host_kvcache_swap_space_gb is None and p.cache_strategy is KVCacheStrategy.PAGED
    assert p.page_size is None and p.effective_page_size == DEFAULT_PAGE_SIZE == 128
    assert (p.n_devices, p.data_parallel_degree, p.n_kv_heads_per_device) == (1, 1, 8)
    assert p.dtype_shorthand == "bf16" and params().dtype_shorthand == "f32"
    assert len(p.static_cache_shape) == 5 and all(isinstance(s, str) for s in p.static_cache_shape)
    assert KVCacheParams(DType.float32, 8, 64, n_devices=4).n_kv_heads_per_device == 2
    assert KVCacheParams(DType.float32, 8, 64, n_devices=2, data_parallel_degree=2).n_kv_heads_per_device == 8
    assert KVCacheParams(DType.float32, 8, 64, n_kv_heads_per_device=3).n_kv_heads_per_device == 3
    assert KVCacheParams(DType.float32, 2, 4, page_size=16).bytes_per_page(3) == 2 * 3 * 16 * 2 * 4 * 4


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(n_kv_heads=0), "n_kv_heads"),
        (dict(head_dim=-1), "head_dim"),
        (dict(page_size=0), "page_size"),
        (dict(n_devices=0), "n_devices"),
        (dict(n_kv_heads=3, n_devices=2), "n_kv_heads"),
        (dict(n_devices=3, data_parallel_degree=2), "data_parallel_degree"),
        (dict(enable_kvcache_swapping_to_host=True), "enable_prefix_caching"),
        (dict(enable_prefix_caching=True, enable_kvcache_swapping_to_host=True), "host_kvcache_swap_space_gb"),
    ],
)
def test_params_validation(kw, field):
    with pytest.raises(ValueError, match=field):
        params(**kw)


def test_params_dtype_must_be_dtype():
    with pytest.raises(TypeError):
        KVCacheParams("float32", 2, 4)


def test_strategy():
    assert KVCacheStrategy("paged") is KVCacheStrategy.PAGED
    assert KVCacheStrategy.MODEL_DEFAULT.value == "model_default"
    assert KVCacheStrategy.PAGED.kernel_substring() == "paged" and KVCacheStrategy.PAGED.uses_opaque()
    with pytest.raises(ValueError):
        KVCacheStrategy.MODEL_DEFAULT.kernel_substring()
    with pytest.raises(ValueError, match="PAGED"):
        PagedKVCacheManager(params(cache_strategy=KVCacheStrategy.MODEL_DEFAULT), 1, 8, 1, [CPU()])


# ------------------------------------------------------------------ sizing


def test_pool_layout_and_default_size():
    m = PagedKVCacheManager(params(dtype=DType.bfloat16), 3, 10, 5, [CPU()])
    assert m.total_num_pages == 3 * math.ceil(10 / P) == m.num_free_pages
    (buf,) = m.device_buffers
    assert buf.shape == (9, 2, 5, P, 2, 3) and buf.dtype == DType.bfloat16
    # the pool is left uninitialised: attention zeroes the padding it gathers


def test_memory_sizing_helpers():
    p = params()
    page_bytes = 2 * 2 * P * 2 * 3 * 4  # K/V * layers * page * heads * head_dim * f32
    assert p.bytes_per_page(2) == page_bytes
    # Budget for 10.5 pages; a full batch (2 x 16 tokens) needs 8 pages: capped without prefix caching.
    budget = int(10.5 * page_bytes)
    assert PagedKVCacheManager.estimated_memory_size(p, 2, 16, 2, budget, [CPU()]) == 8 * page_bytes
    pc = params(enable_prefix_caching=True)
    assert PagedKVCacheManager.estimated_memory_size(pc, 2, 16, 2, budget, [CPU()]) == 10 * page_bytes
    assert PagedKVCacheManager.infer_optimal_batch_size(p, 16, 2, budget, [CPU()]) == 2  # 10 pages // 4
    assert PagedKVCacheManager.infer_optimal_batch_size(p, 8, 2, budget, [CPU()]) == 5
    m = PagedKVCacheManager(pc, 2, 16, 2, [CPU()], available_cache_memory=budget)
    assert m.total_num_pages == 10
    assert m.device_buffers[0].num_elements * 4 == PagedKVCacheManager.estimated_memory_size(
        pc, 2, 16, 2, budget, [CPU()]
    )
    # Two tensor-parallel devices: each page costs half as much per device, twice over.
    p2 = params(n_devices=2)
    assert p2.bytes_per_page(2) * 2 == page_bytes
    assert PagedKVCacheManager.estimated_memory_size(p2, 2, 16, 2, budget, [CPU(), CPU()]) == 8 * page_bytes


def test_memory_too_small_for_one_sequence():
    p = params()
    page_bytes = p.bytes_per_page(2)
    with pytest.raises(ValueError, match="insufficient KV cache memory"):
        PagedKVCacheManager(p, 1, 16, 2, [CPU()], available_cache_memory=3 * page_bytes)
    with pytest.raises(ValueError, match="insufficient KV cache memory"):
        PagedKVCacheManager.estimated_memory_size(p, 1, 16, 2, 3 * page_bytes, [CPU()])
    with pytest.raises(ValueError, match="insufficient KV cache memory"):
        PagedKVCacheManager.infer_optimal_batch_size(p, 16, 2, page_bytes, [CPU()])
    with pytest.raises(ValueError, match="cannot hold one sequence"):
        PagedKVCacheManager(p, 1, 16, 2, [CPU()], total_num_pages=3)


def test_constructor_validation():
    with pytest.raises(ValueError, match="max_seq_len"):
        PagedKVCacheManager(params(), 1, 0, 1, [CPU()])
    with pytest.raises(ValueError, match="n_devices"):
        PagedKVCacheManager(params(), 1, 8, 1, [CPU(), CPU()])
    with pytest.raises(NotImplementedError):
        PagedKVCacheManager(params(n_devices=2, data_parallel_degree=2), 2, 8, 1, [CPU(), CPU()])


# ------------------------------------------------------------------ lifecycle


def test_basic_lifecycle_and_inputs():
    m = manager(pages=16)
    a, b = FakeContext("a", range(10)), FakeContext("b", range(3))
    m.external_claim("a")
    m.claim("b")
    assert m.contains("a") and not m.contains("z")
    (inp,) = m.fetch([a, b])
    assert isinstance(inp, RaggedKVCacheInputs)
    assert inp.blocks is m.device_buffers[0]
    assert inp.cache_lengths.dtype == DType.uint32 and inp.lookup_table.dtype == DType.uint32
    assert list(inp.cache_lengths.to_numpy()) == [0, 0]
    lt = inp.lookup_table.to_numpy()
    assert lt.shape == (2, 3)
    pa, pb = m.get_req_blocks("a"), m.get_req_blocks("b")
    assert len(pa) == 3 and len(pb) == 1 and not set(pa) & set(pb)
    assert list(lt[0]) == pa and list(lt[1]) == [pb[0], 0, 0]
    assert inp.max_lengths.to_numpy().tolist() == [[10, 0]]
    assert m.num_used_pages == 4
    a.update(100)
    b.update(101)
    m.step([a, b])
    (inp,) = m.fetch([a, b], num_steps=3)  # a: 11 + 2 = 13 tokens -> 4 pages; b: 4 + 2 -> 2 pages
    assert list(inp.cache_lengths.to_numpy()) == [10, 3]
    assert inp.max_lengths.to_numpy().tolist() == [[1, 10], [1, 11], [1, 12]]
    assert len(m.get_req_blocks("a")) == 4 and len(m.get_req_blocks("b")) == 2
    assert m.get_req_blocks("a")[:3] == pa
    m.check_invariants()
    m.release("a")
    m.release("b")
    assert m.num_free_pages == m.total_num_pages and not m.pool.refcount.any()
    assert not m.contains("a")
    m.check_invariants()


def test_inputs_iterate_in_symbol_order():
    m = manager()
    ctx = FakeContext("a", range(5))
    m.claim("a")
    (inp,) = m.fetch([ctx])
    assert list(inp) == [inp.blocks, inp.cache_lengths, inp.lookup_table, inp.max_lengths] and len(inp) == 4
    seq = KVCacheInputsSequence([inp, inp])
    assert len(list(seq)) == 8 == len(seq)
    (sym,) = m.input_symbols()
    kinds = [type(t) for t in sym]
    assert kinds == [BufferType, TensorType, TensorType, TensorType]
    assert sym.kv_blocks.dtype == DType.float32
    assert [int(d) for d in sym.kv_blocks.shape] == [32, 2, 2, P, 2, 3]
    assert sym.lookup_table.dtype == DType.uint32 and len(sym.lookup_table.shape) == 2
    assert len(m.input_symbols(num_layers=5)[0].kv_blocks.shape) == 6
    assert int(m.input_symbols(num_layers=5)[0].kv_blocks.shape[2]) == 5


def test_errors():
    m = manager(pages=16, max_batch_size=2, max_seq_len=20)
    m.claim("a")
    with pytest.raises(ValueError, match="already claimed"):
        m.claim("a")
    m.claim("b")
    with pytest.raises(ValueError, match="max_batch_size"):
        m.claim("c")
    with pytest.raises(ValueError, match="not claimed"):
        m.release("c")
    with pytest.raises(ValueError, match="not claimed"):
        m.fetch([FakeContext("c", [1])])
    with pytest.raises(ValueError, match="max_seq_len"):
        m.fetch([FakeContext("a", range(21))])
    with pytest.raises(ValueError, match="max_seq_len"):
        m.fetch([FakeContext("a", range(19))], num_steps=3)
    with pytest.raises(ValueError, match="max_length"):
        m.fetch([FakeContext("a", range(10), max_length=5)])
    with pytest.raises(ValueError, match="duplicate"):
        m.fetch([FakeContext("a", [1]), FakeContext("a", [2])])
    with pytest.raises(ValueError, match="num_steps"):
        m.fetch([FakeContext("a", [1])], num_steps=0)
    ctx = FakeContext("a", range(4))
    ctx.set_token_indices(start_idx=2)
    with pytest.raises(ValueError, match="start_idx"):
        m.fetch([ctx])  # claims cached tokens the manager never stored
    assert m.num_free_pages == 16
    m.release("a")
    with pytest.raises(ValueError, match="not claimed"):
        m.release("a")


def test_out_of_pages_is_atomic():
    m = manager(pages=6, max_seq_len=24)
    a, b = FakeContext("a", range(16)), FakeContext("b", range(12))
    m.claim("a")
    m.claim("b")
    assert m.can_fetch([a]) and not m.can_fetch([a, b])
    with pytest.raises(InsufficientPagesError, match="needs 7 new pages") as ei:
        m.fetch([a, b])
    assert isinstance(ei.value, RuntimeError)
    assert m.num_free_pages == 6 and m.get_req_blocks("a") == [] and a.start_idx == 0
    m.fetch([a])
    assert m.num_free_pages == 2
    with pytest.raises(InsufficientPagesError):
        m.fetch([b])
    m.release("a")
    m.fetch([b])
    m.release("b")
    assert m.num_free_pages == 6


def test_increment_cache_lengths():
    m = manager()
    a, b = FakeContext("a", range(5)), FakeContext("b", range(2))
    m.claim("a")
    m.claim("b")
    inputs = m.fetch([a, b], num_steps=2)

    class Prev:
        input_row_offsets = Buffer.from_numpy(np.array([0, 5, 7], dtype=np.uint32))

    (nxt,) = m.increment_cache_lengths(inputs, Prev())
    assert list(nxt.cache_lengths.to_numpy()) == [5, 2]
    assert nxt.max_lengths.to_numpy().tolist() == inputs[0].max_lengths.to_numpy()[1:].tolist()
    assert nxt.lookup_table is inputs[0].lookup_table and nxt.blocks is inputs[0].blocks
    assert list(inputs[0].cache_lengths.to_numpy()) == [0, 0]  # inputs are not modified
    (out,) = m.increment_cache_lengths_model.execute(inputs[0].cache_lengths, Prev.input_row_offsets)
    assert list(out.to_numpy()) == [5, 2] and out.dtype == DType.uint32


def test_tensor_parallel_devices_share_page_table():
    p = params(n_kv_heads=4, n_devices=2)
    m = PagedKVCacheManager(p, 2, 16, 1, [CPU(), CPU()])
    assert [b.shape for b in m.device_buffers] == [(8, 2, 1, P, 2, 3)] * 2
    m.claim("a")
    ins = m.fetch([FakeContext("a", range(6))])
    assert len(ins) == 2 and ins[0].blocks is not ins[1].blocks
    assert (ins[0].lookup_table.to_numpy() == ins[1].lookup_table.to_numpy()).all()
    assert len(m.input_symbols()) == 2


# ------------------------------------------------------------------ prefix caching


def test_shared_prefix_reuses_pages_and_refcounts():
    m = manager(prefix=True, pages=20)
    prefix = list(range(100, 112))  # 3 full pages
    a = FakeContext("a", prefix + [1, 2])
    m.claim("a")
    run_prefill(m, a)
    pa = m.get_req_blocks("a")
    assert m.num_cached_pages == 3
    b = FakeContext("b", prefix + [5, 6, 7])
    m.claim("b")
    (inp,) = m.fetch([b])
    pb = m.get_req_blocks("b")
    assert pb[:3] == pa[:3] and pb[3] != pa[3]
    assert b.start_idx == 12 and list(b.next_tokens) == [5, 6, 7]
    assert list(inp.cache_lengths.to_numpy()) == [12]
    assert [m.page_refcount(p) for p in pa[:3]] == [2, 2, 2]
    assert m.page_refcount(pa[3]) == 1 and m.page_refcount(pb[3]) == 1
    assert m.prefix_cache_hit_tokens == 12
    m.check_invariants()
    m.release("a")
    assert [m.page_refcount(p) for p in pa[:3]] == [1, 1, 1] and m.page_refcount(pa[3]) == 0
    m.release("b")
    assert m.num_free_pages == m.total_num_pages and not m.pool.refcount.any()
    assert m.num_cached_pages == 3  # kept for later requests, but free
    m.check_invariants()


def test_prompt_fully_cached_still_computes_last_token():
    m = manager(prefix=True)
    prefix = list(range(12))
    m.claim("a")
    run_prefill(m, FakeContext("a", prefix))
    m.release("a")
    c = FakeContext("c", prefix)
    m.claim("c")
    m.fetch([c])
    # Only 2 of the 3 cached pages are reused: the last page is recomputed so logits exist.
    assert c.start_idx == 8 and c.active_length == 4
    m.release("c")
    assert m.num_free_pages == m.total_num_pages


def test_hash_chain_distinguishes_prefixes():
    m = manager(prefix=True)
    page = [9, 9, 9, 9]
    m.claim("a")
    run_prefill(m, FakeContext("a", [1, 1, 1, 1] + page + [0]))
    b = FakeContext("b", [2, 2, 2, 2] + page + [0])  # same second page, different first page
    m.claim("b")
    m.fetch([b])
    assert b.start_idx == 0
    assert not set(m.get_req_blocks("a")) & set(m.get_req_blocks("b"))
    c = FakeContext("c", [1, 1, 1, 1] + [9, 9, 9, 8] + [0])  # same first page only
    m.claim("c")
    m.fetch([c])
    assert c.start_idx == 4 and m.get_req_blocks("c")[0] == m.get_req_blocks("a")[0]
    for r in "abc":
        m.release(r)
    assert m.num_free_pages == m.total_num_pages


def test_decode_pages_are_committed_and_shared():
    m = manager(prefix=True)
    a = FakeContext("a", [5, 6, 7])
    m.claim("a")
    for tok in [8, 9, 10, 11, 12]:
        m.fetch([a])
        a.update(tok)
        m.step([a])
    # tokens 5..12 are in the sequence; positions 0..6 are cached => page 0 (5,6,7,8) is committed
    assert a.start_idx == 7 and m.num_cached_pages == 1
    b = FakeContext("b", [5, 6, 7, 8, 9, 10, 11, 12, 13])
    m.claim("b")
    m.fetch([b])
    assert b.start_idx == 4 and m.get_req_blocks("b")[0] == m.get_req_blocks("a")[0]
    m.release("a")
    m.release("b")
    assert m.num_free_pages == m.total_num_pages


def test_same_prompt_in_one_batch_is_deduplicated_at_step():
    m = manager(prefix=True, pages=12, max_seq_len=32)
    a, b = FakeContext("a", range(9)), FakeContext("b", range(9))
    m.claim("a")
    m.claim("b")
    m.fetch([a, b])
    assert not set(m.get_req_blocks("a")) & set(m.get_req_blocks("b"))
    assert m.num_used_pages == 6
    a.update(1)
    b.update(1)
    m.step([a, b])
    assert m.get_req_blocks("a")[:2] == m.get_req_blocks("b")[:2]
    assert m.num_used_pages == 4  # b's duplicate full pages were freed
    m.check_invariants()
    m.release("b")
    m.release("a")
    assert m.num_free_pages == 12 and not m.pool.refcount.any()


def test_cached_pages_are_evicted_lru_when_needed():
    m = manager(prefix=True, pages=9, max_seq_len=32)
    m.claim("a")
    run_prefill(m, FakeContext("a", list(range(100, 117))))  # 4 full pages + 1 token -> 5 pages
    m.release("a")
    assert m.num_cached_pages == 4 and m.num_free_pages == 9
    m.claim("b")
    # needs 6 pages: the 5 uncached free pages first, then 1 evicted cached page
    m.fetch([FakeContext("b", list(range(200, 224)))])
    assert m.num_cached_pages == 3 and m.num_used_pages == 6
    # Least recently freed go first, and release frees a chain tail-first: pages 0-2 survive.
    c = FakeContext("c", list(range(100, 110)))
    m.claim("c")
    m.fetch([c])
    assert c.start_idx == 8
    m.release("b")
    m.release("c")
    assert m.num_free_pages == 9
    m.reset_prefix_cache()
    assert m.num_cached_pages == 0 and m.num_free_pages == 9
    m.check_invariants()


def test_rewind_after_reset_drops_shared_pages():
    m = manager(prefix=True)
    prefix = list(range(8))
    m.claim("a")
    run_prefill(m, FakeContext("a", prefix + [50]))
    b = FakeContext("b", prefix + [60])
    m.claim("b")
    run_prefill(m, b)
    shared = m.get_req_blocks("b")[:2]
    assert shared == m.get_req_blocks("a")[:2]
    b.reset()  # evicted: everything is a prompt again, start_idx = 0
    m.fetch([b])
    # Re-matched from the cache instead of recomputing into shared pages.
    assert b.start_idx == 8 and m.get_req_blocks("b")[:2] == shared
    assert [m.page_refcount(p) for p in shared] == [2, 2]
    m.check_invariants()
    m.release("a")
    m.release("b")
    assert m.num_free_pages == m.total_num_pages


def test_prefix_caching_disabled_never_shares():
    m = manager(prefix=False)
    m.claim("a")
    run_prefill(m, FakeContext("a", range(12)))
    b = FakeContext("b", range(12))
    m.claim("b")
    m.fetch([b])
    assert b.start_idx == 0 and m.num_cached_pages == 0
    assert not set(m.get_req_blocks("a")) & set(m.get_req_blocks("b"))
    m.release("a")
    m.release("b")
    assert m.num_free_pages == m.total_num_pages


# ------------------------------------------------------------------ layout


def _kv_value(tokens, t: int, layer: int, kv: int) -> float:
    """What a deterministic "model" stores for position t: a function of the whole prefix."""
    h = 0
    for x in tokens[: t + 1]:
        h = (h * 31 + int(x) + 1) % 9973
    return float(h * 10 + layer * 2 + kv)


def _model_write(m: PagedKVCacheManager, inp: RaggedKVCacheInputs, batch) -> None:
    """Write K/V for each request's next tokens through the page table, as attention would."""
    blocks = inp.blocks._torch()
    lt = inp.lookup_table.to_numpy()
    cl = inp.cache_lengths.to_numpy()
    for b, ctx in enumerate(batch):
        toks = ctx.tokens
        for i in range(ctx.active_length):
            t = int(cl[b]) + i
            page, slot = lt[b, t // m.page_size], t % m.page_size
            for layer in range(m.num_layers):
                for kv in (0, 1):
                    blocks[page, kv, layer, slot] = _kv_value(toks, t, layer, kv)


def _check_cache_contents(m: PagedKVCacheManager, ctx) -> None:
    blocks = m.device_buffers[0].to_numpy()
    pages = m.get_req_blocks(ctx.request_id)
    for t in range(ctx.start_idx):
        page, slot = pages[t // m.page_size], t % m.page_size
        for layer in range(m.num_layers):
            for kv in (0, 1):
                got = blocks[page, kv, layer, slot]
                assert (got == _kv_value(ctx.tokens, t, layer, kv)).all(), (ctx.request_id, t)


def test_page_table_addresses_each_requests_tokens():
    """Every cached position reads back the value written for that request's prefix,
    including positions served from shared pages."""
    rng = np.random.default_rng(0)
    m = manager(prefix=True, pages=40, max_seq_len=40)
    base = list(rng.integers(0, 50, 9))
    ctxs = [FakeContext(f"r{i}", base + list(rng.integers(0, 50, 3 + i))) for i in range(4)]
    live = []
    for i, ctx in enumerate(ctxs):
        m.claim(ctx.request_id)
        live.append(ctx)
        for _ in range(3):
            (inp,) = m.fetch(live)
            _model_write(m, inp, live)
            for c in live:
                c.update(int(rng.integers(0, 50)))
            m.step(live)
            for c in live:
                _check_cache_contents(m, c)
    assert m.prefix_cache_hit_tokens >= 3 * 8
    for c in live:
        m.release(c.request_id)
    assert m.num_free_pages == m.total_num_pages
