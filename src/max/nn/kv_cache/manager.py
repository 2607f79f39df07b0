"""Base classes of KV cache managers and the inputs they hand to model graphs."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any, Generic, Optional, TypeVar, Union

from max.nn.kv_cache.cache_params import KVCacheParams

T = TypeVar("T")


class _FieldValues:
    """A dataclass as the sequence of its fields' values, in field order (iteration, ``len``, indexing)."""

    def __iter__(self) -> Iterator[Any]:
        return iter(getattr(self, f.name) for f in fields(self))  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(fields(self))  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> Any:
        return list(self)[i]


@dataclass
class KVCacheInputSymbols(_FieldValues):
    """Base of the graph input types a KV cache manager defines (one field per input).

    Iterating yields the types in field order, so ``Graph(input_types=[..., *symbols])``
    works.
    """


@dataclass
class KVCacheInputs(_FieldValues):
    """Base of the (driver tensor) inputs a KV cache manager hands to a model.

    Iterating yields the tensors in field order, matching the order of the manager's
    ``input_symbols()``, so ``model.execute(*model_inputs, *kv_cache_inputs)`` works.
    """


@dataclass
class RaggedKVCacheInputs(KVCacheInputs):
    """Cache inputs for ragged (flattened-token) batches over a paged cache.

    * ``blocks``: the device's page pool (see ``PagedKVCacheManager`` for the layout).
    * ``cache_lengths``: uint32 ``[batch]``, tokens already in the cache per request
      (``ctx.start_idx``); the new tokens of request ``b`` go to positions
      ``cache_lengths[b] + i``.
    * ``lookup_table``: uint32 ``[batch, max_pages]``, the request's page ids in order
      (the page of position ``t`` is ``lookup_table[b, t // page_size]``); unused
      entries are 0.
    * ``max_lengths``: uint32 ``[num_steps, 2]`` on the host; row ``s`` is
      ``(max new tokens in the batch at step s, max cache length at step s)``.
    """

    blocks: Any
    cache_lengths: Any
    lookup_table: Any
    max_lengths: Any


@dataclass
class PaddedKVCacheInputs(KVCacheInputs):
    """Cache inputs for padded (``[batch, seq]``) batches."""

    k_cache: Any
    v_cache: Any
    start_pos: Any
    null_op: Any


@dataclass
class KVCacheInputsSequence(KVCacheInputs):
    """A sequence of ``KVCacheInputs`` (one per device or step); iterates over all their tensors."""

    kv_cache_inputs: Sequence[KVCacheInputs]

    def __iter__(self) -> Iterator[Any]:
        for inputs in self.kv_cache_inputs:
            yield from inputs

    def __len__(self) -> int:
        return sum(len(x) for x in self.kv_cache_inputs)


class KVCacheManager(ABC, Generic[T]):
    """Base class of KV cache managers.

    Lifecycle of a request: ``external_claim(request_id)`` (reserve a slot) ->
    ``fetch(batch, num_steps)`` before each forward pass (allocate memory, return the
    cache inputs) -> ``step(batch)`` after the contexts were updated (commit finished
    pages to the prefix cache) -> ``release(request_id)``.
    """

    def __init__(
        self,
        params: KVCacheParams,
        max_batch_size: int,
        max_seq_len: int,
        num_layers: int,
        devices: Sequence[Any],
        session: Any = None,
        is_ragged: bool = False,
    ) -> None:
        if not isinstance(params, KVCacheParams):
            raise TypeError(f"{type(self).__name__}: params must be a KVCacheParams, got {type(params).__name__}")
        for name, v in (("max_batch_size", max_batch_size), ("max_seq_len", max_seq_len), ("num_layers", num_layers)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{type(self).__name__}: {name} must be a positive int, got {v!r}")
        devices = list(devices)
        if not devices:
            raise ValueError(f"{type(self).__name__}: at least one device is needed")
        if len(devices) != params.n_devices:
            raise ValueError(
                f"{type(self).__name__}: params.n_devices is {params.n_devices} but {len(devices)} devices were given"
            )
        self.params = params
        """The parameters for the KV cache manager."""
        self.max_batch_size = max_batch_size
        """The maximum batch size (summed over data-parallel replicas)."""
        self.max_seq_len = max_seq_len
        """The maximum sequence length."""
        self.num_layers = num_layers
        """The number of layers."""
        self.devices = devices
        self.session = session
        self.is_ragged = is_ragged
        self._claimed: set[str] = set()

    # ------------------------------------------------------------------ slots
    def contains(self, request_id: str) -> bool:
        """Whether ``request_id`` is currently claimed."""
        return request_id in self._claimed

    def external_claim(self, request_id: str) -> None:
        """Reserve a slot for ``request_id``.

        Raises:
            ValueError: if it is already claimed or all ``max_batch_size`` slots are taken.
        """
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
        if request_id in self._claimed:
            raise ValueError(f"request {request_id!r} is already claimed")
        if len(self._claimed) >= self.max_batch_size:
            raise ValueError(
                f"cannot claim request {request_id!r}: all {self.max_batch_size} slots (max_batch_size) are in use"
            )
        self._claimed.add(request_id)

    def claim(self, request_id: str) -> None:
        """Same as :meth:`external_claim`."""
        self.external_claim(request_id)

    def release(self, request_id: str) -> None:
        """Return ``request_id``'s slot (and memory) to the pool.

        Raises:
            ValueError: if ``request_id`` is not claimed.
        """
        if request_id not in self._claimed:
            raise ValueError(f"cannot release request {request_id!r}: it is not claimed")
        self._claimed.discard(request_id)

    def cached_tokens(self, request_id: str) -> int:
        """Tokens of ``request_id`` reused from a prefix cache (0: this manager has none)."""
        return 0

    @property
    def prefix_caching(self) -> bool:
        """Whether this manager reuses cached prompt prefixes (then it has ``reuse_cached_prefix(ctx)``)."""
        return False

    @property
    def state_snapshot_interval(self) -> Optional[int]:
        """Every how many tokens the manager keeps a snapshot of a request's recurrent state, at the end of a
        step standing on such a boundary (None: it keeps none).  The step planner ends prompt steps there."""
        return None

    @property
    def claimed_requests(self) -> frozenset:
        """The request ids currently claimed."""
        return frozenset(self._claimed)

    @property
    def slots_remaining(self) -> int:
        """How many more requests can be claimed."""
        return self.max_batch_size - len(self._claimed)

    # ------------------------------------------------------------- abstract
    @classmethod
    @abstractmethod
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
        """Estimated total memory (bytes, all devices) the cache will use."""

    @classmethod
    @abstractmethod
    def infer_optimal_batch_size(
        cls,
        params: KVCacheParams,
        max_seq_len: int,
        num_layers: int,
        available_cache_memory: int,
        devices: Sequence[Any],
        **kwargs: Any,
    ) -> int:
        """The largest batch of ``max_seq_len`` sequences that fits ``available_cache_memory``."""

    @abstractmethod
    def fetch(self, batch: Sequence[T], num_steps: int = 1) -> Sequence[KVCacheInputs]:
        """Reserve memory for ``batch`` and return the cache inputs of the next forward pass."""

    @abstractmethod
    def input_symbols(
        self, devices: Optional[Sequence[Any]] = None, num_layers: Optional[int] = None
    ) -> Sequence[KVCacheInputSymbols]:
        """The graph input types matching what :meth:`fetch` returns."""

    def step(self, batch: Sequence[T]) -> None:
        """Commit the new tokens into the prefix cache (no-op without prefix caching)."""
        return None

    @property
    def increment_cache_lengths_model(self) -> Any:
        """A compiled model ``(cache_lengths uint32 [batch], input_row_offsets uint32 [batch+1])
        -> cache_lengths + (offsets[1:] - offsets[:-1])`` on the first device (built on first
        use with ``session``, or a new ``InferenceSession`` over ``devices``)."""
        if getattr(self, "_inc_model", None) is None:
            from max.engine import InferenceSession
            from max.dtype import DType
            from max.graph import DeviceRef, Graph, TensorType, ops

            ref = DeviceRef.from_device(self.devices[0])
            cl_t = TensorType(DType.uint32, ["batch_size"], ref)
            off_t = TensorType(DType.uint32, ["input_row_offsets_len"], ref)
            with Graph("increment_cache_lengths", input_types=[cl_t, off_t]) as g:
                cl, off = (v.tensor for v in g.inputs)
                off = ops.cast(off, DType.int64)
                diff = ops.rebind(off[1:] - off[:-1], ["batch_size"])
                g.output(ops.cast(ops.cast(cl, DType.int64) + diff, DType.uint32))
            session = self.session if self.session is not None else InferenceSession(devices=self.devices)
            self._inc_model = session.load(g)
        return self._inc_model

    def increment_cache_lengths(
        self,
        kv_cache_inputs: Union[list[RaggedKVCacheInputs], list[PaddedKVCacheInputs]],
        prev_model_inputs: Any,
    ) -> Union[list[RaggedKVCacheInputs], list[PaddedKVCacheInputs]]:
        """Inputs for the next step of a multistep execution.

        ``cache_lengths += input lengths of the previous step`` (taken from
        ``prev_model_inputs.input_row_offsets``, a ``[batch + 1]`` tensor or one per
        device) and the first row of ``max_lengths`` is dropped.  Runs on the device
        (no synchronisation) and does not change the manager's own bookkeeping.
        """
        import torch

        from max.driver import Buffer

        offsets = getattr(prev_model_inputs, "input_row_offsets", None)
        if offsets is None:
            raise ValueError("increment_cache_lengths: prev_model_inputs has no input_row_offsets")
        out = []
        for i, inp in enumerate(kv_cache_inputs):
            if not isinstance(inp, RaggedKVCacheInputs):
                raise TypeError("increment_cache_lengths supports RaggedKVCacheInputs only")
            off = offsets[i] if isinstance(offsets, (list, tuple)) else offsets
            cl = inp.cache_lengths._torch()
            o = off._torch().to(device=cl.device, dtype=torch.int64)
            new_cl = (cl.to(torch.int64) + (o[1:] - o[:-1])).to(cl.dtype)
            ml = inp.max_lengths._torch()
            if ml.shape[0] < 2:
                raise ValueError("increment_cache_lengths: no steps remain in max_lengths")
            out.append(
                RaggedKVCacheInputs(
                    blocks=inp.blocks,
                    cache_lengths=Buffer._from_torch(new_cl),
                    lookup_table=inp.lookup_table,
                    max_lengths=Buffer._from_torch(ml[1:].contiguous()),
                )
            )
        return out
