"""``CacheSeq``: the least a sequence needs for ``PagedKVCacheManager`` to claim, size and advance its pages
(Whisper's decoder sequences and its encoder windows in the cross cache)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class CacheSeq:
    """One sequence in a paged KV cache: ``tokens[:start_idx]`` are cached, ``tokens[start_idx:active_idx]``
    are fed next."""

    request_id: str
    tokens: Any
    start_idx: int = 0
    active_idx: int = 0
    max_length: Optional[int] = None

    def set_token_indices(self, start_idx: Optional[int] = None, active_idx: Optional[int] = None) -> None:
        if start_idx is not None:
            self.start_idx = start_idx
        if active_idx is not None:
            self.active_idx = active_idx

    def bump_token_indices(self, start_idx: int = 0, active_idx: int = 0) -> None:
        self.start_idx += start_idx
        self.active_idx += active_idx
