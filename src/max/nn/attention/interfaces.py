"""``max.nn.attention.interfaces``: the (deprecated, dataclass-style) attention layer bases.

:class:`AttentionImpl` holds a stacked ``wqkv`` weight; :class:`AttentionImplQKV` separate ``wq``,
``wk``, ``wv``.  A subclass's ``__call__(x, kv_collection, **kwargs)`` computes attention of the
ragged batch ``x`` ``[total_seq_len, hidden]`` over the paged KV cache; the keyword arguments it
needs (``input_row_offsets``, ``layer_idx``) are checked by :func:`required_kwargs` (ValueError when
one is missing).  :class:`DistributedAttentionImpl` marks layers that run over several devices.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

from max.nn.kv_cache.cache_params import KVCacheParams
from max.nn.layer import Layer, Module

__all__ = ["AttentionImpl", "AttentionImplQKV", "DistributedAttentionImpl", "required_kwargs"]


def required_kwargs(layer: object, kwargs: dict[str, Any], *names: str) -> list[Any]:
    """The values of ``names`` in ``kwargs``; ValueError naming the layer and the first missing one."""
    missing = [n for n in names if kwargs.get(n) is None]
    if missing:
        raise ValueError(f"{type(layer).__name__}: missing keyword argument(s) {', '.join(missing)} "
                         f"(call as layer(x, kv_collection, {', '.join(f'{n}=...' for n in names)}))")
    return [kwargs[n] for n in names]


@dataclass(eq=False)
class AttentionImpl(Layer, abc.ABC):
    """Attention with a stacked ``[(n_heads + 2 * n_kv_heads) * head_dim, hidden]`` ``wqkv`` weight and an
    output projection ``wo``; ``scale`` multiplies the attention scores."""

    n_heads: int
    kv_params: KVCacheParams
    wqkv: Any
    wo: Any
    scale: float

    @abc.abstractmethod
    def __call__(self, x: Any, kv_collection: Any, **kwargs: Any) -> Any: ...


@dataclass(eq=False)
class AttentionImplQKV(Layer, abc.ABC):
    """Attention with separate ``wq`` ``[n_heads * head_dim, hidden]`` and ``wk``/``wv``
    ``[n_kv_heads * head_dim, hidden]`` weights and an output projection ``wo``."""

    n_heads: int
    kv_params: KVCacheParams
    wq: Any
    wk: Any
    wv: Any
    wo: Any
    scale: float

    @abc.abstractmethod
    def __call__(self, x: Any, kv_collection: Any, **kwargs: Any) -> Any: ...


class DistributedAttentionImpl(Module, abc.ABC):
    """Base of attention layers whose work is split over several devices (called with per-device lists)."""

    @abc.abstractmethod
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
