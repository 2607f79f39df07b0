"""``HybridKVCacheManager``: the paged KV cache plus fixed-size per-request recurrent-state slots.

Models with recurrent layers (Mamba-2's SSM, short convolutions, gated DeltaNet) carry, per request
and per such layer, a few fixed-size tensors: a convolution window and an SSM / linear-attention
state.  This manager owns them beside the KV pages of the model's attention layers:

* one buffer per :class:`StateSpec` (one per layer and kind), shape ``[num_slots, *spec.shape]``,
  ``num_slots = max_batch_size``; a request gets a slot when it is claimed (zeroed) and gives it back
  when it is released, together with its pages;
* ``fetch`` returns :class:`HybridKVCacheInputs`: the paged inputs, then ``state_slots`` (int64
  ``[batch]``, each request's slot), then the state buffers in spec order (graph inputs in the same
  order: :meth:`HybridKVCacheManager.input_symbols`).  The recurrent ops
  (``max.graph.ops.causal_conv1d`` ...) read and update the slots in place, so a prompt split over
  several steps (chunked prefill) carries its state from chunk to chunk;
* the state's position must follow the request: a fetch whose ``start_idx`` is not where the state
  stopped (0 restarts the request from a zeroed slot) is refused -- a recurrent state cannot be
  rewound;
* **prefix caching with state snapshots**: K/V pages are only reused together with the recurrent state
  at the end of the reused prefix.  When a request's state stands exactly at the end of one of its
  committed (prefix-cached) pages, :meth:`step` copies its slot into a *snapshot* slot keyed by that
  page's hash (which names the whole prefix).  A new request's prefix-cache match is cut back to the
  longest matched prefix whose last page has a snapshot; the snapshot is copied into the request's slot
  and the request goes on from there.  Snapshots live in ``num_snapshots`` fixed slots (least recently
  used one replaced when all are taken) and are dropped with their page when the page cache evicts it,
  or by ``reset_prefix_cache``.  A prompt's state passes a page boundary only at the end of a step, so
  :attr:`state_snapshot_interval` tells the step planner to end a prompt's step at its last page boundary
  (the rest of the prompt runs in the next step): a later request sharing that prefix (a repeated prompt, the next
  turn of a conversation) then finds it; decoding passes every later boundary;
* memory: ``--kv-cache-memory`` covers pages, slots and snapshots (:func:`max.nn.kv_cache.kv_cache_budget`
  with ``state_bytes``, :func:`state_slots_for`); :meth:`describe` (the start-up line) and ``/metrics``
  report them.

A model without attention layers (Mamba-2) still gets a minimal page pool (one layer, one head of one
element per token), so scheduling and accounting stay those of every other model.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from max.dtype import DType
from max.nn.kv_cache.cache_params import KVCacheParams
from max.nn.kv_cache.manager import RaggedKVCacheInputs
from max.nn.kv_cache.paged_cache import PagedCacheInputSymbols, PagedKVCacheManager

logger = logging.getLogger("max.nn.kv_cache")

__all__ = ["HybridCacheInputSymbols", "HybridKVCacheInputs", "HybridKVCacheManager", "StateSpec", "state_bytes",
           "state_slots_for"]


@dataclass(frozen=True)
class StateSpec:
    """One recurrent-state tensor of one layer: ``shape`` per request slot, ``dtype``."""

    name: str
    shape: tuple[int, ...]
    dtype: DType = DType.float32

    def __post_init__(self) -> None:
        if not self.shape or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in self.shape):
            raise ValueError(f"StateSpec {self.name!r}: shape must be non-negative ints, got {self.shape!r}")

    @property
    def nbytes(self) -> int:
        """Bytes of one slot."""
        return math.prod(self.shape) * self.dtype.size_in_bytes


def state_bytes(specs: Sequence[StateSpec], num_slots: int) -> int:
    """Bytes of ``num_slots`` slots of every spec."""
    return num_slots * sum(s.nbytes for s in specs)


def state_slots_for(max_batch_size: int, prefix_caching: bool, num_snapshots: Optional[int] = None) -> int:
    """Slots a :class:`HybridKVCacheManager` keeps: one per request, plus its prefix-cache snapshots
    (``num_snapshots``, by default ``max_batch_size``; none without prefix caching)."""
    if not prefix_caching:
        return max_batch_size
    return max_batch_size + (max_batch_size if num_snapshots is None else num_snapshots)


@dataclass
class HybridKVCacheInputs(RaggedKVCacheInputs):
    """:class:`RaggedKVCacheInputs`, then ``state_slots`` (int64 ``[batch]``) and the state buffers."""

    state_slots: Any = None
    states: tuple = ()

    def __iter__(self) -> Iterator[Any]:
        yield from (self.blocks, self.cache_lengths, self.lookup_table, self.max_lengths, self.state_slots)
        yield from self.states

    def __len__(self) -> int:
        return 5 + len(self.states)


@dataclass
class HybridCacheInputSymbols(PagedCacheInputSymbols):
    """Graph input types matching :class:`HybridKVCacheInputs`."""

    state_slots: Any = None
    states: tuple = ()

    def __iter__(self) -> Iterator[Any]:
        yield from (self.kv_blocks, self.cache_lengths, self.lookup_table, self.max_lengths, self.state_slots)
        yield from self.states

    def __len__(self) -> int:
        return 5 + len(self.states)


class HybridKVCacheManager(PagedKVCacheManager):
    """Paged KV cache of the attention layers plus recurrent-state slots (see the module docstring).

    ``num_layers`` counts the attention layers (the page pool's layers); ``state_specs`` lists every
    recurrent state tensor; ``num_snapshots``: prefix-cache state snapshots kept (default
    ``max_batch_size``; 0 turns prefix caching off).  One device only.
    """

    def __init__(self, params: KVCacheParams, max_batch_size: int, max_seq_len: int, num_layers: int,
                 devices: Sequence[Any], session: Any = None, available_cache_memory: Optional[int] = None,
                 total_num_pages: Optional[int] = None, is_ragged: bool = True,
                 state_specs: Sequence[StateSpec] = (), num_snapshots: Optional[int] = None) -> None:
        if len(list(devices)) != 1:
            raise NotImplementedError("models with recurrent layers run on one device: tensor parallelism is not "
                                      "supported for them yet")
        specs = list(state_specs)
        if not specs:
            raise ValueError("HybridKVCacheManager: state_specs is empty (use PagedKVCacheManager)")
        if len({s.name for s in specs}) != len(specs):
            raise ValueError("HybridKVCacheManager: state spec names must be distinct")
        if num_snapshots is not None and (isinstance(num_snapshots, bool) or not isinstance(num_snapshots, int)
                                          or num_snapshots < 0):
            raise ValueError(f"HybridKVCacheManager: num_snapshots must be an int >= 0, got {num_snapshots!r}")
        if params.enable_prefix_caching and num_snapshots == 0:
            logger.info("prefix caching is off for this model: no state snapshots (its recurrent layers' state "
                        "could not be restored with cached pages)")
            params = dataclasses.replace(params, enable_prefix_caching=False)
        self.state_specs = specs
        self.num_slots = max_batch_size
        self.num_snapshots = (state_slots_for(max_batch_size, params.enable_prefix_caching, num_snapshots)
                              - max_batch_size)
        super().__init__(params, max_batch_size, max_seq_len, num_layers, devices, session,
                         available_cache_memory, total_num_pages, is_ragged)  # logs describe(): pages and state
        from max.driver import Buffer

        self.state_buffers: list[Any] = []
        for s in specs:
            buf = Buffer(s.dtype, (self.num_slots, *s.shape), device=self.devices[0])
            buf._torch().zero_()
            self.state_buffers.append(buf)
        self._free_slots: list[int] = list(range(self.num_slots - 1, -1, -1))
        self._slot_of: dict[str, int] = {}
        self._state_pos: dict[str, int] = {}
        # prefix-cache snapshots: hash of a cached page -> snapshot slot (least recently used first)
        self.snapshot_buffers: list[Any] = [Buffer(s.dtype, (self.num_snapshots, *s.shape), device=self.devices[0])
                                            for s in specs]
        self._snap_of: OrderedDict[bytes, int] = OrderedDict()
        self._free_snaps: list[int] = list(range(self.num_snapshots - 1, -1, -1))
        self.state_snapshots_taken = 0
        self.state_snapshot_restores = 0
        """Prefix-cache hits whose recurrent state came from a snapshot (one per request hit)."""
        evict = self.pool.on_evict

        def on_evict(page: int, h: bytes) -> None:  # a snapshot goes with its page
            self._drop_snapshot(h)
            if evict is not None:
                evict(page, h)

        self.pool.on_evict = on_evict

    # ------------------------------------------------------------ accounting
    @property
    def state_memory_bytes(self) -> int:
        """Bytes of all state slots and snapshot slots."""
        return state_bytes(self.state_specs, self.num_slots + self.num_snapshots)

    @property
    def state_snapshots_used(self) -> int:
        return len(self._snap_of)

    @property
    def state_snapshots_total(self) -> int:
        return self.num_snapshots

    @property
    def state_slots_used(self) -> int:
        return self.num_slots - len(self._free_slots)

    @property
    def state_slots_total(self) -> int:
        return self.num_slots

    def slot_of(self, request_id: str) -> int:
        self._req(request_id)
        return self._slot_of[request_id]

    def describe_state(self) -> str:
        from max.nn.kv_cache.sizing import format_bytes

        per = sum(s.nbytes for s in self.state_specs)
        if self.params.enable_prefix_caching:
            return (f"recurrent state: {self.num_slots} slots + {self.num_snapshots} prefix-cache snapshots x "
                    f"{format_bytes(per)} ({len(self.state_specs)} tensors) = {format_bytes(self.state_memory_bytes)}")
        return (f"recurrent state: {self.num_slots} slots x {format_bytes(per)} ({len(self.state_specs)} tensors) = "
                f"{format_bytes(self.state_memory_bytes)}; prefix caching off")

    def describe(self) -> str:
        return f"{super().describe()}; {self.describe_state()}"

    def check_invariants(self) -> None:
        super().check_invariants()
        assert len(set(self._free_slots)) == len(self._free_slots)
        assert set(self._slot_of) == set(self._reqs)
        assert not (set(self._free_slots) & set(self._slot_of.values()))
        assert len(self._free_slots) + len(self._slot_of) == self.num_slots
        assert len(set(self._free_snaps)) == len(self._free_snaps)
        assert not (set(self._free_snaps) & set(self._snap_of.values()))
        assert len(self._free_snaps) + len(self._snap_of) == self.num_snapshots
        for h in self._snap_of:  # a snapshot only while its page is cached
            assert self.pool.lookup(h) is not None, "state snapshot without its cached page"

    # ------------------------------------------------------------- lifecycle
    def _zero(self, slot: int) -> None:
        for buf in self.state_buffers:
            buf._torch()[slot].zero_()

    def external_claim(self, request_id: str) -> None:
        super().external_claim(request_id)
        slot = self._free_slots.pop()
        self._zero(slot)
        self._slot_of[request_id] = slot
        self._state_pos[request_id] = 0

    def release(self, request_id: str) -> None:
        super().release(request_id)
        self._free_slots.append(self._slot_of.pop(request_id))
        del self._state_pos[request_id]

    def fetch(self, batch: Sequence[Any], num_steps: int = 1) -> list[HybridKVCacheInputs]:
        """:meth:`PagedKVCacheManager.fetch` plus each request's state slot (a prefix-cache hit restores the
        state from the snapshot at its end, see :meth:`_take_matches`).

        Raises ValueError (before any change) when a request's ``start_idx`` is neither 0 nor where its
        recurrent state stopped."""
        batch = list(batch)
        for ctx in batch:
            rid = ctx.request_id
            self._req(rid)
            start, pos = int(ctx.start_idx), self._state_pos[rid]
            if start != 0 and start != pos:
                raise ValueError(f"request {rid!r}: start_idx={start} but its recurrent state has absorbed {pos} "
                                 "tokens; a recurrent state cannot be rewound (restart the request from 0)")
        for ctx in batch:
            rid = ctx.request_id
            if int(ctx.start_idx) == 0 and self._state_pos[rid]:  # a restart: from a zeroed state
                self._zero(self._slot_of[rid])
                self._state_pos[rid] = 0
        paged = super().fetch(batch, num_steps)
        for ctx in batch:
            self._state_pos[ctx.request_id] = int(ctx.active_idx) + num_steps - 1
        return self._with_state(paged, batch)

    # ------------------------------------------------- prefix-cache snapshots
    def _snapshot_cut(self, matched: list) -> int:
        """How many of ``matched`` (prefix-cache hits, in order) to keep: up to the last one whose page
        has a state snapshot (K/V is never reused without the state at its end)."""
        for j in range(len(matched), 0, -1):
            if matched[j - 1][1] in self._snap_of:
                return j
        return 0

    def _plan(self, ctx: Any, num_steps: int) -> Any:
        pl = super()._plan(ctx, num_steps)
        keep = self._snapshot_cut(pl.matched)
        if keep < len(pl.matched):
            del pl.matched[keep:]
            kept = pl.rewind_to // self.page_size if pl.rewind_to is not None else len(pl.req.pages)
            pl.new_pages = max(0, math.ceil(pl.seq_len / self.page_size) - kept - keep)
        return pl

    def _take_matches(self, pl: Any, pinned: bool = False) -> None:
        """Take the hits, then restore the request's state from the snapshot at their end."""
        if not pinned:  # reuse_cached_prefix may have shortened the plan's hits
            del pl.matched[self._snapshot_cut(pl.matched):]
        h = pl.matched[-1][1] if pl.matched else None
        assert h is None or h in self._snap_of
        super()._take_matches(pl, pinned)
        if h is None:
            return
        rid = pl.ctx.request_id
        snap, slot = self._snap_of[h], self._slot_of[rid]
        self._snap_of.move_to_end(h)
        for buf, sb in zip(self.state_buffers, self.snapshot_buffers):
            buf._torch()[slot].copy_(sb._torch()[snap])
        self._state_pos[rid] = int(pl.ctx.start_idx)
        self.state_snapshot_restores += 1

    def _drop_snapshot(self, h: bytes) -> None:
        snap = self._snap_of.pop(h, None)
        if snap is not None:
            self._free_snaps.append(snap)

    @property
    def state_snapshot_interval(self) -> Optional[int]:
        """The page size when prefix caching keeps state snapshots (a prompt's step should end at its last
        page boundary: the step planner's ``snapshot_cut``), else None."""
        if not self.params.enable_prefix_caching or not self.num_snapshots:
            return None
        return self.page_size

    def step(self, batch: Sequence[Any]) -> None:
        """:meth:`PagedKVCacheManager.step`, then a state snapshot for each request whose state stands at
        the end of a committed page that has none yet."""
        super().step(batch)
        if not self.params.enable_prefix_caching or not self.num_snapshots:
            return
        P = self.page_size
        for ctx in batch:
            rid = ctx.request_id
            pos = self._state_pos[rid]
            req = self._reqs[rid]
            if pos == 0 or pos % P or pos != int(ctx.start_idx) or req.num_committed < pos // P:
                continue
            h = req.hashes[pos // P - 1]
            if h in self._snap_of:
                self._snap_of.move_to_end(h)
                continue
            if not self._free_snaps:  # replace the least recently used snapshot
                _, old = self._snap_of.popitem(last=False)
                self._free_snaps.append(old)
            snap, slot = self._free_snaps.pop(), self._slot_of[rid]
            for buf, sb in zip(self.state_buffers, self.snapshot_buffers):
                sb._torch()[snap].copy_(buf._torch()[slot])
            self._snap_of[h] = snap
            self.state_snapshots_taken += 1

    def reset_prefix_cache(self) -> None:
        super().reset_prefix_cache()
        for h in list(self._snap_of):
            self._drop_snapshot(h)

    def _with_state(self, paged: list[RaggedKVCacheInputs], batch: list[Any]) -> list[HybridKVCacheInputs]:
        from max.driver import Buffer

        slots = np.array([self._slot_of[c.request_id] for c in batch], np.int64)
        (p,) = paged
        return [HybridKVCacheInputs(blocks=p.blocks, cache_lengths=p.cache_lengths, lookup_table=p.lookup_table,
                                    max_lengths=p.max_lengths,
                                    state_slots=Buffer.from_numpy(slots).to(self.devices[0]),
                                    states=tuple(self.state_buffers))]

    def increment_cache_lengths(self, kv_cache_inputs: Any, prev_model_inputs: Any) -> Any:
        out = super().increment_cache_lengths(kv_cache_inputs, prev_model_inputs)
        return [HybridKVCacheInputs(blocks=n.blocks, cache_lengths=n.cache_lengths, lookup_table=n.lookup_table,
                                    max_lengths=n.max_lengths, state_slots=o.state_slots, states=o.states)
                for n, o in zip(out, kv_cache_inputs)]

    def input_symbols(self, devices: Optional[Sequence[Any]] = None,
                      num_layers: Optional[int] = None) -> list[HybridCacheInputSymbols]:
        """The paged cache's symbols, then ``state_slots`` (int64 ``["batch_size"]``) and one
        ``BufferType [num_slots, *spec.shape]`` per state spec."""
        from max.graph import BufferType, TensorType

        out = []
        for p in super().input_symbols(devices, num_layers):
            ref = p.cache_lengths.device
            out.append(HybridCacheInputSymbols(
                kv_blocks=p.kv_blocks, cache_lengths=p.cache_lengths, lookup_table=p.lookup_table,
                max_lengths=p.max_lengths, state_slots=TensorType(DType.int64, ["batch_size"], ref),
                states=tuple(BufferType(s.dtype, [self.num_slots, *s.shape], ref) for s in self.state_specs)))
        return out
