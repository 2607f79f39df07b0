"""``max.nn.kv_cache``: KV cache parameters, context protocol and managers.

* :mod:`.cache_params`: ``KVCacheParams``, ``KVCacheStrategy``.
* :mod:`.context`: ``KVCacheAwareContext``.
* :mod:`.manager`: ``KVCacheManager`` (abstract), ``KVCacheInputs`` and friends.
* :mod:`.paged_cache`: ``PagedKVCacheManager`` (page pool, page tables, prefix caching).
* :mod:`.state_cache`: ``HybridKVCacheManager`` (pages plus recurrent-state slots), ``StateSpec``.
* :mod:`.sizing`: ``kv_cache_budget`` (how much memory the pool gets), ``parse_memory_size``.
"""

from max.nn.kv_cache.cache_params import DEFAULT_PAGE_SIZE, KVCacheParams, KVCacheStrategy
from max.nn.kv_cache.collection import FetchPagedKVCacheCollection, PagedKVCacheCollection
from max.nn.kv_cache.context import KVCacheAwareContext
from max.nn.kv_cache.manager import (
    KVCacheInputs,
    KVCacheInputsSequence,
    KVCacheInputSymbols,
    KVCacheManager,
    PaddedKVCacheInputs,
    RaggedKVCacheInputs,
)
from max.nn.kv_cache.paged_cache import (
    InsufficientPagesError,
    PagedCacheInputSymbols,
    PagedKVCacheManager,
    PagePool,
    hash_page,
)
from max.nn.kv_cache.state_cache import (
    HybridCacheInputSymbols,
    HybridKVCacheInputs,
    HybridKVCacheManager,
    StateSpec,
    state_bytes,
    state_slots_for,
)
from max.nn.kv_cache.sizing import available_memory, format_bytes, kv_cache_budget, parse_memory_size

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "FetchPagedKVCacheCollection",
    "PagedKVCacheCollection",
    "InsufficientPagesError",
    "KVCacheAwareContext",
    "KVCacheInputSymbols",
    "KVCacheInputs",
    "KVCacheInputsSequence",
    "KVCacheManager",
    "KVCacheParams",
    "KVCacheStrategy",
    "PaddedKVCacheInputs",
    "PagePool",
    "PagedCacheInputSymbols",
    "PagedKVCacheManager",
    "RaggedKVCacheInputs",
    "available_memory",
    "format_bytes",
    "hash_page",
    "HybridCacheInputSymbols",
    "HybridKVCacheInputs",
    "HybridKVCacheManager",
    "StateSpec",
    "state_bytes",
    "state_slots_for",
    "kv_cache_budget",
    "parse_memory_size",
]
