"""``PagedKVCacheManager``: a paged KV cache with prefix caching.

Memory layout
=============
Each device holds ONE pool buffer (``RaggedKVCacheInputs.blocks``) of shape::

    [total_num_pages, 2, num_layers, page_size, n_kv_heads_per_device, head_dim]

``[p, 0, l]`` holds the keys and ``[p, 1, l]`` the values of layer ``l`` for the
``page_size`` consecutive token positions stored in page ``p``.  Under tensor
parallelism every device has a pool with the same page ids and its own slice of the
KV heads, so one page table serves all devices.

A request's token at absolute position ``t`` (0-based, prompt included) lives in page
``lookup_table[b, t // page_size]`` at slot ``t % page_size``.  For a forward pass over
a ragged batch (tokens of all requests concatenated, ``input_row_offsets`` of shape
``[batch + 1]`` delimiting them) attention layer ``l`` must, for request ``b``:

1. write the new K/V rows ``i = 0 .. n_b - 1`` (``n_b = offsets[b+1] - offsets[b]``) at
   positions ``t = cache_lengths[b] + i``:
   ``blocks[lookup_table[b, t // P], 0|1, l, t % P] = k|v``;
2. attend causally from new token ``i`` to positions ``0 .. cache_lengths[b] + i``,
   gathering them through the same mapping.

Page accounting
===============
Pages are refcounted.  A page is *free* when no request holds it; a free page may still
be *cached*: it then keeps the K/V of a full page of tokens, indexed by a hash chain
``h_i = blake2b(h_{i-1} || tokens[i*P:(i+1)*P])`` (so a hash identifies the page's tokens
and the whole prefix before them).  ``fetch`` of a request looks up its prompt's full
pages in that index and reuses matching pages (refcount + 1) instead of recomputing
them; it advances the context's ``start_idx`` past the reused tokens (always leaving at
least one token to compute, so the model produces logits).  Only full pages are ever
shared and shared pages are never written, so no copy-on-write is needed.  ``step``
registers a request's newly completed full pages; when an identical page is already
registered the request switches to it and frees its own copy.  Allocation takes never-
cached free pages first, most recently freed first (a stack: a steady load keeps reusing
the same few pages, so the pool's untouched memory is never committed), then evicts the
least recently freed cached page (the prefix cache keeps its LRU order).
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from max.dtype import DType
from max.nn.kv_cache.cache_params import KVCacheParams, KVCacheStrategy
from max.nn.kv_cache.manager import KVCacheInputSymbols, KVCacheManager, RaggedKVCacheInputs

logger = logging.getLogger("max.nn.kv_cache")

_ROOT_HASH = b"\x00" * 16


def _root_hash(ctx: Any) -> bytes:
    """The hash chain's root: shared by every request, unless the context carries a ``cache_salt``
    (e.g. its LoRA adapter: pages computed under another adapter hold other keys and values)."""
    salt = getattr(ctx, "cache_salt", None)
    if not salt:
        return _ROOT_HASH
    return hashlib.blake2b(_ROOT_HASH + str(salt).encode("utf-8"), digest_size=16).digest()


class InsufficientPagesError(RuntimeError):
    """``fetch`` needs more free pages than the pool has."""


def hash_page(parent: bytes, tokens: Any) -> bytes:
    """The hash-chain value of a full page of ``tokens`` following a page with hash ``parent``."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(np.ascontiguousarray(tokens, dtype=np.int64).tobytes())
    return h.digest()


class PagePool:
    """Refcounted page allocator with a hash-indexed prefix cache (host-side bookkeeping only)."""

    def __init__(self, total_num_pages: int) -> None:
        if total_num_pages < 1:
            raise ValueError(f"PagePool: total_num_pages must be >= 1, got {total_num_pages}")
        self.total_num_pages = total_num_pages
        self.refcount = np.zeros(total_num_pages, dtype=np.int64)
        # refcount 0, not cached: a stack (most recently freed on top), page 0 first when new
        self._free: list[int] = list(range(total_num_pages - 1, -1, -1))
        self._evictable: OrderedDict[int, None] = OrderedDict()  # refcount 0, cached (LRU first)
        self._hash_of_page: dict[int, bytes] = {}
        self._page_of_hash: dict[bytes, int] = {}
        self.on_evict: Optional[Callable[[int, bytes], None]] = None
        """Called as ``on_evict(page, hash)`` just before a cached page is reused (its contents are intact)."""

    @property
    def num_free(self) -> int:
        """Pages held by no request (cached or not)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached(self) -> int:
        """Pages registered in the prefix cache (held or not)."""
        return len(self._page_of_hash)

    def is_cached(self, page: int) -> bool:
        return page in self._hash_of_page

    def is_evictable(self, page: int) -> bool:
        return page in self._evictable

    def lookup(self, h: bytes) -> Optional[int]:
        return self._page_of_hash.get(h)

    def alloc(self) -> int:
        """A page with refcount 1 and no cache entry."""
        if self._free:
            page = self._free.pop()
        elif self._evictable:
            page, _ = self._evictable.popitem(last=False)
            h = self._hash_of_page.pop(page)
            del self._page_of_hash[h]
            if self.on_evict is not None:
                self.on_evict(page, h)
        else:
            raise InsufficientPagesError("no free pages")
        self.refcount[page] = 1
        return page

    def acquire(self, page: int) -> None:
        """Take another reference to a cached page."""
        if self.refcount[page] == 0:
            if page not in self._evictable:
                raise AssertionError(f"page {page} is free but not cached")
            del self._evictable[page]
        self.refcount[page] += 1

    def release(self, page: int) -> None:
        if self.refcount[page] <= 0:
            raise AssertionError(f"page {page} released more often than acquired")
        self.refcount[page] -= 1
        if self.refcount[page] == 0:
            if page in self._hash_of_page:
                self._evictable[page] = None
            else:
                self._free.append(page)

    def register(self, page: int, h: bytes) -> None:
        """Index a held, full page under hash ``h`` (the hash must not be indexed yet)."""
        if h in self._page_of_hash or page in self._hash_of_page:
            raise AssertionError("page or hash already registered")
        self._hash_of_page[page] = h
        self._page_of_hash[h] = page

    def reset_prefix_cache(self) -> None:
        """Forget every cache entry; free cached pages become plain free pages."""
        for page in self._evictable:
            self._free.append(page)
        self._evictable.clear()
        self._hash_of_page.clear()
        self._page_of_hash.clear()

    def check(self) -> None:
        """Assert the internal invariants (used by tests)."""
        free = set(self._free)
        ev = set(self._evictable)
        assert len(free) == len(self._free) and not (free & ev)
        for p in range(self.total_num_pages):
            rc = int(self.refcount[p])
            assert rc >= 0
            assert (rc == 0) == (p in free or p in ev), p
            assert (p in ev) <= (p in self._hash_of_page)
            assert (p in free) <= (p not in self._hash_of_page)
        assert len(self._hash_of_page) == len(self._page_of_hash)
        for p, h in self._hash_of_page.items():
            assert self._page_of_hash[h] == p


@dataclass
class _Request:
    pages: list[int] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)  # one per committed (leading, full) page
    cached_tokens_hit: int = 0
    queried_to: int = 0  # prompt positions below this were already counted as prefix-cache queries

    @property
    def num_committed(self) -> int:
        return len(self.hashes)


@dataclass
class PagedCacheInputSymbols(KVCacheInputSymbols):
    """Graph input types of one device's paged cache (same order as ``RaggedKVCacheInputs``)."""

    kv_blocks: Any
    cache_lengths: Any
    lookup_table: Any
    max_lengths: Any


@dataclass
class _Plan:
    ctx: Any
    req: _Request
    rewind_to: Optional[int]  # new start_idx when committed pages must be dropped
    matched: list[tuple[Optional[int], bytes]]  # prefix-cache hits to acquire (None: to restore from the spill tier)
    new_pages: int
    seq_len: int


def _num_devices_pages(params: KVCacheParams, num_layers: int, n_devices: int) -> int:
    return params.bytes_per_page(num_layers) * n_devices


class PagedKVCacheManager(KVCacheManager[Any]):
    """Paged KV cache (see the module docstring for the layout and page accounting).

    Args:
        params: cache parameters (``cache_strategy`` must be PAGED).
        max_batch_size: most requests claimed at once.
        max_seq_len: longest sequence (prompt + generated) a request may reach.
        num_layers: number of transformer layers.
        devices: one device per tensor-parallel shard (``params.n_devices`` of them).
        session: the ``InferenceSession`` (used for ``increment_cache_lengths_model``).
        available_cache_memory: bytes (all devices together) the pool may use; the page
            count is ``available_cache_memory // (bytes per page * n_devices)``.
        total_num_pages: page count (overrides ``available_cache_memory``).  Without
            either, the pool holds ``max_batch_size`` sequences of ``max_seq_len`` tokens.
        is_ragged: kept for API compatibility (the inputs are always ragged).
    """

    def __init__(
        self,
        params: KVCacheParams,
        max_batch_size: int,
        max_seq_len: int,
        num_layers: int,
        devices: Sequence[Any],
        session: Any = None,
        available_cache_memory: Optional[int] = None,
        total_num_pages: Optional[int] = None,
        is_ragged: bool = True,
    ) -> None:
        super().__init__(params, max_batch_size, max_seq_len, num_layers, devices, session, is_ragged)
        if params.cache_strategy is not KVCacheStrategy.PAGED:
            raise ValueError(f"PagedKVCacheManager needs cache_strategy PAGED, got {params.cache_strategy.value}")
        if params.data_parallel_degree != 1:
            raise NotImplementedError("PagedKVCacheManager: data_parallel_degree > 1 is not supported")
        self.page_size = params.effective_page_size
        self.max_pages_per_seq = math.ceil(max_seq_len / self.page_size)
        if total_num_pages is None:
            total_num_pages = self._pages_for(params, max_batch_size, max_seq_len, num_layers, available_cache_memory, len(self.devices))
        elif isinstance(total_num_pages, bool) or not isinstance(total_num_pages, int) or total_num_pages < 1:
            raise ValueError(f"PagedKVCacheManager: total_num_pages must be a positive int, got {total_num_pages!r}")
        if total_num_pages < self.max_pages_per_seq:
            raise ValueError(
                f"PagedKVCacheManager: {total_num_pages} pages of {self.page_size} tokens cannot hold one sequence "
                f"of max_seq_len={max_seq_len} ({self.max_pages_per_seq} pages needed)"
            )
        self.total_num_pages = total_num_pages
        self.pool = PagePool(total_num_pages)
        self._reqs: dict[str, _Request] = {}
        self._reserved: list[int] = []  # pages held by the manager itself (reserve_page)
        self.prefix_cache_hit_tokens = 0
        self.prefix_cache_queried_tokens = 0
        self.spill_hit_tokens = 0
        """Prefix-cache hit tokens whose pages came back from the spill tier (part of ``prefix_cache_hit_tokens``)."""
        self._inc_model: Any = None
        self._pending_restores: dict[bytes, list[Any]] = {}
        self.spill: Optional[Any] = None
        """The prefix cache's host / disk tier (a ``PageSpillStore``), with ``enable_kvcache_swapping_to_host``."""
        if params.enable_kvcache_swapping_to_host:
            from max.nn.kv_cache.spill import PageSpillStore

            self.spill = PageSpillStore(int(params.host_kvcache_swap_space_gb * (1 << 30)),
                                        params.host_kvcache_spill_dir)
            self.pool.on_evict = self._spill_page

        from max.driver import Buffer

        shape = (
            total_num_pages,
            2,
            num_layers,
            self.page_size,
            params.n_kv_heads_per_device,
            params.row_width,
        )
        # Uninitialised (zeroing gigabytes costs seconds): attention only reads positions
        # that were written, and its kernel zeroes the padding it gathers.
        self.device_buffers: list[Any] = [Buffer(params.dtype, shape, device=d) for d in self.devices]
        """One page pool per device, shape ``[pages, 2, layers, page_size, kv_heads, row_width]`` (``row_width``:
        ``head_dim``, or ``head_dim + 4`` for an int8 / fp8 cache: each row's codes then its float32 scale)."""
        logger.debug("%s", self.describe())  # `max serve` prints it once; LLM users see it at DEBUG

    # ---------------------------------------------------------------- sizing
    @staticmethod
    def _pages_for(
        params: KVCacheParams,
        max_batch_size: int,
        max_seq_len: int,
        num_layers: int,
        available_cache_memory: Optional[int],
        n_devices: int,
    ) -> int:
        pages_per_seq = math.ceil(max_seq_len / params.effective_page_size)
        full = max_batch_size * pages_per_seq
        if available_cache_memory is None:
            return full
        if available_cache_memory < 0:
            raise ValueError(f"available_cache_memory must be >= 0, got {available_cache_memory}")
        page_bytes = _num_devices_pages(params, num_layers, n_devices)
        pages = available_cache_memory // page_bytes
        if pages < pages_per_seq:
            raise ValueError(
                f"insufficient KV cache memory: {available_cache_memory} bytes hold {pages} pages of "
                f"{params.effective_page_size} tokens ({page_bytes} bytes each over {n_devices} device(s)), but one "
                f"sequence of max_seq_len={max_seq_len} needs {pages_per_seq} pages "
                f"({pages_per_seq * page_bytes} bytes)"
            )
        # Extra pages only help as prefix cache; without it, cap at what the batch can use.
        return pages if params.enable_prefix_caching else min(pages, full)

    @classmethod
    def estimated_memory_size(
        cls,
        params: KVCacheParams,
        max_batch_size: int,
        max_seq_len: int,
        num_layers: int,
        available_cache_memory: int,
        devices: Sequence[Any],
        **kwargs: Any,
    ) -> int:
        """Bytes (all devices) of the pool a manager built with these arguments allocates.

        Raises ``ValueError`` when ``available_cache_memory`` cannot hold one sequence of
        ``max_seq_len`` tokens.
        """
        n_dev = len(list(devices)) or params.n_devices
        pages = cls._pages_for(params, max_batch_size, max_seq_len, num_layers, available_cache_memory, n_dev)
        return pages * _num_devices_pages(params, num_layers, n_dev)

    @classmethod
    def infer_optimal_batch_size(
        cls,
        params: KVCacheParams,
        max_seq_len: int,
        num_layers: int,
        available_cache_memory: int,
        devices: Sequence[Any],
        **kwargs: Any,
    ) -> int:
        """How many sequences of ``max_seq_len`` tokens fit in ``available_cache_memory`` (>= 1).

        Raises ``ValueError`` when not even one fits.
        """
        n_dev = len(list(devices)) or params.n_devices
        pages_per_seq = math.ceil(max_seq_len / params.effective_page_size)
        pages = available_cache_memory // _num_devices_pages(params, num_layers, n_dev)
        if pages < pages_per_seq:
            cls._pages_for(params, 1, max_seq_len, num_layers, available_cache_memory, n_dev)  # raises
        return max(1, pages // pages_per_seq)

    # ------------------------------------------------------------- accounting
    @property
    def num_free_pages(self) -> int:
        """Pages held by no request (including cached pages, which are reclaimable)."""
        return self.pool.num_free

    @property
    def num_used_pages(self) -> int:
        """Pages held by at least one request."""
        return self.total_num_pages - self.pool.num_free

    @property
    def free_blocks_pct(self) -> float:
        return self.pool.num_free / self.total_num_pages

    @property
    def used_blocks_pct(self) -> float:
        return 1.0 - self.free_blocks_pct

    @property
    def memory_bytes(self) -> int:
        """Bytes of the page pools (all devices together)."""
        return self.total_num_pages * _num_devices_pages(self.params, self.num_layers, len(self.devices))

    @property
    def capacity_tokens(self) -> int:
        """Tokens the pool holds (``total_num_pages * page_size``)."""
        return self.total_num_pages * self.page_size

    def describe(self) -> str:
        """One line for logs: pages, tokens, bytes, dtype and how many full-length sequences fit."""
        from max.nn.kv_cache.sizing import format_bytes

        devs = ", ".join(str(getattr(d, "label", d)) for d in self.devices)
        line = (f"KV cache: {self.total_num_pages} pages x {self.page_size} tokens = {self.capacity_tokens} tokens, "
                f"{format_bytes(self.memory_bytes)} {self.params.dtype_shorthand} on {devs} "
                f"({self.total_num_pages // self.max_pages_per_seq} sequences of {self.max_seq_len} tokens")
        full_pages = int(self.max_batch_size) * self.max_pages_per_seq
        if full_pages > self.total_num_pages:
            full = format_bytes(full_pages * (self.memory_bytes // self.total_num_pages))
            line += (f"; a full batch, {self.max_batch_size} x {self.max_seq_len} tokens, would take {full}: requests "
                     "wait for free pages; --kv-cache-memory sets the size")
        if self.spill is not None:
            line += (f"; prefix-cache spill tier: up to {format_bytes(self.spill.capacity_bytes)} in "
                     f"{self.spill.directory or 'host memory'}")
        return line + ")"

    @property
    def num_cached_pages(self) -> int:
        """Pages indexed by the prefix cache."""
        return self.pool.num_cached

    @property
    def cache_hit_rate(self) -> float:
        """Fraction of queried prompt tokens served from the prefix cache."""
        q = self.prefix_cache_queried_tokens
        return self.prefix_cache_hit_tokens / q if q else 0.0

    def get_req_blocks(self, request_id: str) -> list[int]:
        """The page ids of ``request_id``, in position order."""
        return list(self._req(request_id).pages)

    def page_refcount(self, page: int) -> int:
        return int(self.pool.refcount[page])

    def reset_prefix_cache(self) -> None:
        """Drop every prefix-cache entry (held pages stay held)."""
        self.pool.reset_prefix_cache()
        if self.spill is not None:
            self.spill.clear()
        for r in self._reqs.values():
            r.hashes.clear()

    def check_invariants(self) -> None:
        """Assert that refcounts equal the number of requests holding each page (tests)."""
        self.pool.check()
        expect = np.zeros(self.total_num_pages, dtype=np.int64)
        for p in self._reserved:
            expect[p] += 1
        for r in self._reqs.values():
            assert len(set(r.pages)) == len(r.pages)
            for p in r.pages:
                expect[p] += 1
            for p, h in zip(r.pages, r.hashes):
                assert self.pool.lookup(h) == p
        assert (expect == self.pool.refcount).all()

    def reserve_page(self) -> int:
        """A page taken out of circulation for good, held by the manager itself (no request, never in the
        prefix cache): e.g. where the padding rows of a CUDA-graph decode step write their K/V."""
        page = self.pool.alloc()
        self._reserved.append(page)
        return page

    def _req(self, request_id: str) -> _Request:
        if request_id not in self._claimed:
            raise ValueError(f"request {request_id!r} is not claimed by this KV cache manager")
        return self._reqs[request_id]

    def cached_tokens(self, request_id: str) -> int:
        """Tokens of ``request_id`` whose K/V came from the prefix cache instead of being computed (0 for a
        request this manager does not hold)."""
        req = self._reqs.get(request_id)
        return req.cached_tokens_hit if req is not None else 0

    @property
    def prefix_caching(self) -> bool:
        return bool(self.params.enable_prefix_caching)

    # ----------------------------------------------------------- lifecycle
    def external_claim(self, request_id: str) -> None:
        super().external_claim(request_id)
        self._reqs[request_id] = _Request()

    def release(self, request_id: str) -> None:
        """Drop ``request_id``'s references to its pages (in reverse order, so the tail of a
        cached prefix is evicted before its head) and free its slot.

        Raises:
            ValueError: if ``request_id`` is not claimed.
        """
        super().release(request_id)
        req = self._reqs.pop(request_id)
        for page in reversed(req.pages):
            self.pool.release(page)

    def _plan(self, ctx: Any, num_steps: int) -> _Plan:
        rid = ctx.request_id
        req = self._req(rid)
        P = self.page_size
        start, active = int(ctx.start_idx), int(ctx.active_idx)
        if start < 0 or active < start:
            raise ValueError(f"request {rid!r}: invalid token indices start_idx={start}, active_idx={active}")
        seq_len = active + num_steps - 1
        if seq_len > self.max_seq_len:
            raise ValueError(
                f"request {rid!r} needs {seq_len} tokens (current length {active} + {num_steps - 1} further steps) "
                f"but the KV cache's max_seq_len is {self.max_seq_len}"
            )
        max_len = getattr(ctx, "max_length", None)
        if max_len is not None and active > max_len:
            raise ValueError(f"request {rid!r}: current length {active} exceeds its max_length {max_len}")
        if start > len(req.pages) * P:
            raise ValueError(
                f"request {rid!r}: start_idx={start} but only {len(req.pages) * P} positions were ever cached"
            )
        rewind_to = None
        num_committed = req.num_committed
        kept_pages = len(req.pages)
        if start < num_committed * P:
            # The model would rewrite shared, immutable pages: drop them, re-align to a page.
            rewind_to = (start // P) * P
            num_committed = start // P
            kept_pages = num_committed
        matched: list[tuple[int, bytes]] = []
        eff_start = rewind_to if rewind_to is not None else start
        # a request that wants its prompt's log probabilities (echo) computes the whole prompt
        wants_prompt_logits = bool(getattr(ctx, "log_probabilities_echo", False)) and bool(
            getattr(ctx, "log_probabilities", 0))
        if (
            self.params.enable_prefix_caching
            and kept_pages == num_committed
            and eff_start == num_committed * P
            and not wants_prompt_logits
        ):
            tokens = ctx.tokens
            parent = req.hashes[num_committed - 1] if num_committed else _root_hash(ctx)
            i = num_committed
            while (i + 1) * P < active:  # leave >= 1 token to compute
                h = hash_page(parent, tokens[i * P : (i + 1) * P])
                page = self.pool.lookup(h)
                if page is None and (self.spill is None or h not in self.spill):
                    break
                matched.append((page, h))
                parent = h
                i += 1
        have = kept_pages + len(matched)
        need = math.ceil(seq_len / P)
        return _Plan(ctx, req, rewind_to, matched, max(0, need - have), seq_len)

    @staticmethod
    def _restores(pl: _Plan) -> int:
        return sum(1 for p, _ in pl.matched if p is None)

    def _check_capacity(self, plans: list[_Plan]) -> None:
        hits_evictable = {p for pl in plans for p, _ in pl.matched if p is not None and self.pool.is_evictable(p)}
        # Pages dropped by a rewind are released first; only those reaching refcount 0 help.
        freed = 0
        for pl in plans:
            if pl.rewind_to is not None:
                keep = pl.rewind_to // self.page_size
                freed += sum(1 for p in pl.req.pages[keep:] if self.pool.refcount[p] == 1)
        available = self.pool.num_free - len(hits_evictable) + freed
        needed = sum(pl.new_pages + self._restores(pl) for pl in plans)
        if needed > available:
            raise InsufficientPagesError(
                f"KV cache out of pages: the batch needs {needed} new pages of {self.page_size} tokens but only "
                f"{available} of {self.total_num_pages} are free"
            )

    def can_fetch(self, batch: Sequence[Any], num_steps: int = 1) -> bool:
        """Whether :meth:`fetch` would find enough free pages (no state changes)."""
        try:
            self._check_capacity([self._plan(ctx, num_steps) for ctx in batch])
        except InsufficientPagesError:
            return False
        return True

    def fetch(self, batch: Sequence[Any], num_steps: int = 1) -> list[RaggedKVCacheInputs]:
        """Reserve pages for ``batch`` (``num_steps`` tokens each) and build its cache inputs.

        Reuses prefix-cache pages for new prompt tokens (advancing ``ctx.start_idx`` past
        them), allocates the rest, and returns one ``RaggedKVCacheInputs`` per device.  All
        checks run before any state changes, so a failed fetch leaves everything as it was.

        Raises:
            ValueError: unclaimed/duplicate requests, a sequence longer than ``max_seq_len``.
            InsufficientPagesError: not enough free pages (a ``RuntimeError``).
        """
        if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
            raise ValueError(f"fetch: num_steps must be an int >= 1, got {num_steps!r}")
        batch = list(batch)
        ids = [ctx.request_id for ctx in batch]
        if len(set(ids)) != len(ids):
            raise ValueError(f"fetch: duplicate request ids in the batch: {ids}")
        plans = [self._plan(ctx, num_steps) for ctx in batch]
        self._check_capacity(plans)

        P = self.page_size
        for pl in plans:
            req, ctx = pl.req, pl.ctx
            if pl.rewind_to is not None:
                keep = pl.rewind_to // P
                for page in reversed(req.pages[keep:]):
                    self.pool.release(page)
                del req.pages[keep:]
                del req.hashes[keep:]
                ctx.set_token_indices(start_idx=pl.rewind_to)
        for pl in plans:  # every plan's pool hits are held before any page is allocated (which may evict)
            self._pin_hits(pl)
        for pl in plans:
            self._take_matches(pl, pinned=True)
        for pl in plans:
            for _ in range(pl.new_pages):
                pl.req.pages.append(self.pool.alloc())
        return self._build_inputs(batch, num_steps)

    def _pin_hits(self, pl: _Plan) -> None:
        """Hold a plan's pool hits, and read its spill-tier hits now: allocating pages evicts cached pages
        into the tier, which may then drop the least recently used pages -- those could be ours."""
        for page, h in pl.matched:
            if page is not None:
                self.pool.acquire(page)
            elif h not in self._pending_restores and self.pool.lookup(h) is None:
                assert self.spill is not None
                arrays = self.spill.get(h)
                assert arrays is not None
                self._pending_restores[h] = arrays

    def _restore(self, h: bytes) -> int:
        """A held page with the contents the spill tier keeps under ``h`` (registered under ``h``)."""
        page = self.pool.lookup(h)
        if page is not None:  # restored already for another request of this batch
            self.pool.acquire(page)
            return page
        assert self.spill is not None
        arrays = self._pending_restores.pop(h)
        page = self.pool.alloc()
        import torch

        for buf, a in zip(self.device_buffers, arrays):
            dst = buf._torch()[page]
            dst.view(torch.uint8).copy_(torch.from_numpy(a).to(dst.device))
        self.spill.discard(h)
        self.pool.register(page, h)
        self.spill_hit_tokens += self.page_size
        return page

    def _spill_page(self, page: int, h: bytes) -> None:
        """``PagePool.on_evict``: keep an evicted cached page's contents in the spill tier."""
        import torch

        assert self.spill is not None
        arrays = [buf._torch()[page].contiguous().view(torch.uint8).cpu().numpy() for buf in self.device_buffers]
        self.spill.put(h, arrays)

    def _take_matches(self, pl: _Plan, pinned: bool = False) -> None:
        """Acquire a plan's prefix-cache hits (``pinned``: its pool hits are held already), bring back those
        in the spill tier, and move its context's ``start_idx`` past them."""
        req, ctx = pl.req, pl.ctx
        if self.params.enable_prefix_caching and req.num_committed * self.page_size == ctx.start_idx:
            lo = max(int(ctx.start_idx), req.queried_to)
            self.prefix_cache_queried_tokens += max(0, int(ctx.active_idx) - lo)
            req.queried_to = max(req.queried_to, int(ctx.active_idx))
        if not pinned:
            self._pin_hits(pl)
        for page, h in pl.matched:
            req.pages.append(self._restore(h) if page is None else page)
            req.hashes.append(h)
        if pl.matched:
            n = len(pl.matched) * self.page_size
            ctx.bump_token_indices(start_idx=n)
            req.cached_tokens_hit += n
            self.prefix_cache_hit_tokens += n

    def reuse_cached_prefix(self, ctx: Any) -> int:
        """Reuse prefix-cache pages for ``ctx``'s pending tokens (``start_idx .. active_idx``) without
        reserving anything else; returns the tokens reused (``start_idx`` moves past them).

        A pipeline that splits long prompts into chunks calls this on the whole pending prompt
        *before* chunking, so hits beyond the first chunk are found too (``fetch`` only looks at the
        tokens of the step it reserves).  A no-op without prefix caching or when the request must
        first drop shared pages (``fetch`` handles that).
        """
        if not self.params.enable_prefix_caching:
            return 0
        pl = self._plan(ctx, 1)
        if self.spill is not None and pl.matched:
            # pages come back from the spill tier only while free pages last (fetch computes the rest)
            free = self.pool.num_free - sum(1 for p, _ in pl.matched if p is not None and self.pool.is_evictable(p))
            for i, (p, _) in enumerate(pl.matched):
                if p is None:
                    if free <= 0:
                        del pl.matched[i:]
                        break
                    free -= 1
        if pl.rewind_to is not None or not pl.matched:
            if pl.rewind_to is None:
                self._take_matches(pl)  # counts the queried tokens
            return 0
        before = int(ctx.start_idx)
        self._take_matches(pl)
        return int(ctx.start_idx) - before

    def _build_inputs(self, batch: list[Any], num_steps: int) -> list[RaggedKVCacheInputs]:
        from max.driver import Buffer

        n = len(batch)
        cache_lengths = np.zeros(n, dtype=np.uint32)
        width = max([len(self._reqs[c.request_id].pages) for c in batch] + [1])
        lookup = np.zeros((n, width), dtype=np.uint32)
        active = np.zeros(n, dtype=np.int64)
        for b, ctx in enumerate(batch):
            pages = self._reqs[ctx.request_id].pages
            lookup[b, : len(pages)] = pages
            cache_lengths[b] = ctx.start_idx
            active[b] = ctx.active_idx - ctx.start_idx
        max_lengths = np.zeros((num_steps, 2), dtype=np.uint32)
        if n:
            for s in range(num_steps):
                max_lengths[s, 0] = active.max() if s == 0 else 1
                max_lengths[s, 1] = (
                    cache_lengths.max() if s == 0 else (cache_lengths.astype(np.int64) + active + s - 1).max()
                )
        host_ml = Buffer.from_numpy(max_lengths)
        out = []
        for dev, blocks in zip(self.devices, self.device_buffers):
            out.append(
                RaggedKVCacheInputs(
                    blocks=blocks,
                    cache_lengths=Buffer.from_numpy(cache_lengths.copy()).to(dev),
                    lookup_table=Buffer.from_numpy(lookup.copy()).to(dev),
                    max_lengths=host_ml,
                )
            )
        return out

    def step(self, batch: Sequence[Any]) -> None:
        """Commit each request's newly completed full pages to the prefix cache.

        Call after the contexts were updated with the step's outputs: positions below
        ``ctx.start_idx`` are then in the cache.  A no-op without prefix caching.
        """
        for ctx in batch:
            req = self._req(ctx.request_id)
            if not self.params.enable_prefix_caching:
                continue
            P = self.page_size
            written = int(ctx.start_idx)
            full = min(written // P, len(req.pages))
            if full <= req.num_committed:
                continue
            tokens = ctx.tokens
            parent = req.hashes[-1] if req.hashes else _root_hash(ctx)
            for i in range(req.num_committed, full):
                h = hash_page(parent, tokens[i * P : (i + 1) * P])
                existing = self.pool.lookup(h)
                page = req.pages[i]
                if existing is None:
                    self.pool.register(page, h)
                elif existing != page:
                    # Same tokens computed twice: share the indexed page, free our copy.
                    self.pool.acquire(existing)
                    self.pool.release(page)
                    req.pages[i] = existing
                req.hashes.append(h)
                parent = h

    # --------------------------------------------------------- graph side
    def input_symbols(
        self, devices: Optional[Sequence[Any]] = None, num_layers: Optional[int] = None
    ) -> list[PagedCacheInputSymbols]:
        """Per device: ``kv_blocks`` (BufferType ``[total_num_pages, 2, num_layers, page_size,
        n_kv_heads_per_device, row_width]``, ``row_width`` = ``KVCacheParams.row_width``), ``cache_lengths`` (uint32 ``["batch_size"]``),
        ``lookup_table`` (uint32 ``["batch_size", "max_num_pages"]``) and ``max_lengths``
        (uint32 ``["steps_remaining", 2]`` on the CPU)."""
        from max.graph import BufferType, DeviceRef, TensorType

        devs = list(devices) if devices is not None else self.devices
        layers = num_layers if num_layers is not None else self.num_layers
        out = []
        for d in devs:
            ref = DeviceRef.from_device(d)
            out.append(
                PagedCacheInputSymbols(
                    kv_blocks=BufferType(
                        self.params.dtype,
                        [
                            self.total_num_pages,
                            2,
                            layers,
                            self.page_size,
                            self.params.n_kv_heads_per_device,
                            self.params.row_width,
                        ],
                        ref,
                    ),
                    cache_lengths=TensorType(DType.uint32, ["batch_size"], ref),
                    lookup_table=TensorType(DType.uint32, ["batch_size", "max_num_pages"], ref),
                    max_lengths=TensorType(DType.uint32, ["steps_remaining", 2], DeviceRef.CPU()),
                )
            )
        return out
