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
* **prefix caching is disabled**: a cached prefix would restore K/V without the matching recurrent
  state, so pages are never shared between requests of such a model (logged once at start-up);
* memory: ``--kv-cache-memory`` covers pages and slots (:func:`max.nn.kv_cache.kv_cache_budget` with
  ``state_bytes``); :meth:`describe` (the start-up line) and ``/metrics`` report both.

A model without attention layers (Mamba-2) still gets a minimal page pool (one layer, one head of one
element per token), so scheduling and accounting stay those of every other model.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from max.dtype import DType
from max.nn.kv_cache.cache_params import KVCacheParams
from max.nn.kv_cache.manager import RaggedKVCacheInputs
from max.nn.kv_cache.paged_cache import PagedCacheInputSymbols, PagedKVCacheManager

logger = logging.getLogger("max.nn.kv_cache")

__all__ = ["HybridCacheInputSymbols", "HybridKVCacheInputs", "HybridKVCacheManager", "StateSpec", "state_bytes"]


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
    recurrent state tensor.  One device only.
    """

    def __init__(self, params: KVCacheParams, max_batch_size: int, max_seq_len: int, num_layers: int,
                 devices: Sequence[Any], session: Any = None, available_cache_memory: Optional[int] = None,
                 total_num_pages: Optional[int] = None, is_ragged: bool = True,
                 state_specs: Sequence[StateSpec] = ()) -> None:
        if len(list(devices)) != 1:
            raise NotImplementedError("models with recurrent layers run on one device: tensor parallelism is not "
                                      "supported for them yet")
        specs = list(state_specs)
        if not specs:
            raise ValueError("HybridKVCacheManager: state_specs is empty (use PagedKVCacheManager)")
        if len({s.name for s in specs}) != len(specs):
            raise ValueError("HybridKVCacheManager: state spec names must be distinct")
        if params.enable_prefix_caching:
            logger.info("prefix caching is disabled for this model: its recurrent layers' state cannot be "
                        "restored from cached pages")
            params = dataclasses.replace(params, enable_prefix_caching=False)
        self.state_specs = specs
        self.num_slots = max_batch_size
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

    # ------------------------------------------------------------ accounting
    @property
    def state_memory_bytes(self) -> int:
        """Bytes of all state slots."""
        return state_bytes(self.state_specs, self.num_slots)

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
        """:meth:`PagedKVCacheManager.fetch` plus each request's state slot.

        Raises ValueError (before any change) when a request's ``start_idx`` is neither 0 nor where its
        recurrent state stopped."""
        batch = list(batch)
        restart = []
        for ctx in batch:
            rid = ctx.request_id
            self._req(rid)
            start, pos = int(ctx.start_idx), self._state_pos[rid]
            if start == 0:
                restart.append(rid)
            elif start != pos:
                raise ValueError(f"request {rid!r}: start_idx={start} but its recurrent state has absorbed {pos} "
                                 "tokens; a recurrent state cannot be rewound (restart the request from 0)")
        paged = super().fetch(batch, num_steps)
        for rid in restart:
            if self._state_pos[rid]:
                self._zero(self._slot_of[rid])
        for ctx in batch:
            self._state_pos[ctx.request_id] = int(ctx.active_idx) + num_steps - 1
        return self._with_state(paged, batch)

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
