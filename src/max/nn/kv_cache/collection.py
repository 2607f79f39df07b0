"""The paged KV cache as graph values: ``PagedKVCacheCollection`` and its constructor.

A model graph receives the manager's ``RaggedKVCacheInputs`` as graph inputs
(``blocks``, ``cache_lengths``, ``lookup_table``, ``max_lengths``, in
``PagedKVCacheManager.input_symbols()`` order).  ``FetchPagedKVCacheCollection``
turns those values into a collection the ``max.nn.kernels`` attention functions
read and write.  The pool layout is
``blocks[page, 0 (K) | 1 (V), layer, offset_in_page, kv_head, head_dim]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from max.graph import BufferValue, TensorValue
from max.nn.kv_cache.cache_params import DEFAULT_PAGE_SIZE, KVCacheParams


@dataclass
class PagedKVCacheCollection:
    """Graph values of one device's paged KV cache."""

    kv_params: KVCacheParams
    blocks: BufferValue
    cache_lengths: TensorValue
    lookup_table: TensorValue
    max_lengths: TensorValue

    @property
    def page_size(self) -> int:
        return self.kv_params.page_size or DEFAULT_PAGE_SIZE

    @property
    def num_layers(self) -> int:
        return int(self.blocks.shape[2])


class FetchPagedKVCacheCollection:
    """Builds a :class:`PagedKVCacheCollection` from the cache's graph inputs."""

    def __init__(self, kv_params: KVCacheParams, num_layers: int | None = None) -> None:
        self.kv_params = kv_params
        self.num_layers = num_layers

    def __call__(self, blocks: Any, cache_lengths: Any, lookup_table: Any, max_lengths: Any) -> PagedKVCacheCollection:
        from max.graph.value import BufferValue as BV

        if not isinstance(blocks, BV):
            raise TypeError(f"FetchPagedKVCacheCollection: blocks must be a BufferValue, got {type(blocks).__name__}")
        want = [None, 2, self.num_layers, self.kv_params.page_size or DEFAULT_PAGE_SIZE,
                self.kv_params.n_kv_heads_per_device, self.kv_params.row_width]
        got = list(blocks.shape)
        if len(got) != 6 or any(w is not None and g != w for w, g in zip(want, got)):
            raise ValueError(
                "FetchPagedKVCacheCollection: blocks must have shape [pages, 2, num_layers, page_size, "
                f"n_kv_heads, row_width] = {want}, got {got}"
            )
        if blocks.dtype != self.kv_params.dtype:
            raise TypeError(f"FetchPagedKVCacheCollection: blocks dtype {blocks.dtype}, kv_params say {self.kv_params.dtype}")
        return PagedKVCacheCollection(self.kv_params, blocks, cache_lengths.tensor, lookup_table.tensor,
                                      max_lengths.tensor)
