"""``KVCacheAwareContext``: the part of ``InputContext`` a KV cache manager needs."""

from __future__ import annotations

from typing import Any, Optional, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from max.interfaces.status import GenerationStatus


@runtime_checkable
class KVCacheAwareContext(Protocol):
    """Minimum API for interacting with a KV cache.

    Indices (see ``max.interfaces.context``): ``tokens[:start_idx]`` are in the cache,
    ``tokens[start_idx:active_idx]`` (``next_tokens``) are fed next, ``end_idx`` is one past
    the last valid token.  The index setters never touch the token array.
    """

    @property
    def active_idx(self) -> int: ...

    @property
    def active_length(self) -> int:
        """Number of tokens input this iteration (prompt/chunk size for context encoding, 1 for decode)."""
        ...

    def bump_token_indices(self, start_idx: int = 0, active_idx: int = 0, end_idx: int = 0) -> None:
        """Update the indices by relative amounts without touching the token array."""
        ...

    def compute_num_available_steps(self, max_seq_len: int) -> int:
        """Steps that can run before ``max_seq_len`` is exceeded."""
        ...

    @property
    def current_length(self) -> int:
        """Length of the sequence including completed and active tokens."""
        ...

    @property
    def end_idx(self) -> int: ...

    @property
    def eos_token_ids(self) -> set[int]: ...

    @property
    def is_done(self) -> bool: ...

    @property
    def json_schema(self) -> Optional[str]: ...

    @property
    def matcher(self) -> Optional[Any]: ...

    @property
    def max_length(self) -> Optional[int]: ...

    @property
    def next_tokens(self) -> npt.NDArray[np.integer[Any]]: ...

    @property
    def request_id(self) -> str: ...

    def reset(self) -> None:
        """Make all tokens a new prompt (after eviction)."""
        ...

    def set_matcher(self, matcher: Any) -> None: ...

    def set_token_indices(
        self, start_idx: Optional[int] = None, active_idx: Optional[int] = None, end_idx: Optional[int] = None
    ) -> None:
        """Set the indices to absolute values without touching the token array."""
        ...

    @property
    def start_idx(self) -> int: ...

    @property
    def status(self) -> GenerationStatus: ...

    @property
    def tokens(self) -> npt.NDArray[np.integer[Any]]: ...
