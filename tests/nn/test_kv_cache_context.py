"""Test helper: a minimal ``KVCacheAwareContext`` (``TextContext`` index semantics), and its checks."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from max.interfaces import GenerationStatus


class FakeContext:
    """tokens[:start_idx] cached, tokens[start_idx:active_idx] next, end_idx = valid end."""

    def __init__(self, request_id: str, prompt, max_length: Optional[int] = None) -> None:
        self.request_id = request_id
        prompt = np.asarray(prompt, dtype=np.int64)
        self._tokens = np.zeros(max(16, 2 * len(prompt)), dtype=np.int64)
        self._tokens[: len(prompt)] = prompt
        self.start_idx = 0
        self.active_idx = len(prompt)
        self.end_idx = len(prompt)
        self.max_length = max_length
        self.status = GenerationStatus.ACTIVE
        self.eos_token_ids: set[int] = set()
        self.json_schema = None
        self.matcher = None

    @property
    def tokens(self) -> np.ndarray:
        return self._tokens

    @property
    def all_tokens(self) -> np.ndarray:
        return self._tokens[: self.end_idx]

    @property
    def active_length(self) -> int:
        return self.active_idx - self.start_idx

    @property
    def current_length(self) -> int:
        return self.active_idx

    @property
    def next_tokens(self) -> np.ndarray:
        return self._tokens[self.start_idx : self.active_idx]

    @property
    def is_done(self) -> bool:
        return self.status.is_done

    def bump_token_indices(self, start_idx: int = 0, active_idx: int = 0, end_idx: int = 0) -> None:
        self.start_idx += start_idx
        self.active_idx += active_idx
        self.end_idx += end_idx
        assert 0 <= self.start_idx <= self.active_idx <= self.end_idx

    def set_token_indices(self, start_idx=None, active_idx=None, end_idx=None) -> None:
        if start_idx is not None:
            self.start_idx = start_idx
        if active_idx is not None:
            self.active_idx = active_idx
        if end_idx is not None:
            self.end_idx = end_idx
        assert 0 <= self.start_idx <= self.active_idx <= self.end_idx

    def compute_num_available_steps(self, max_seq_len: int) -> int:
        return max_seq_len - self.current_length + 1

    def update(self, new_token: int) -> None:
        """After a forward pass: next_tokens are cached; append the sampled token."""
        if self.end_idx >= len(self._tokens):
            self._tokens = np.concatenate([self._tokens, np.zeros(len(self._tokens), dtype=np.int64)])
        self._tokens[self.end_idx] = new_token
        self.start_idx = self.active_idx
        self.end_idx += 1
        self.active_idx = self.end_idx

    def reset(self) -> None:
        self.start_idx = 0
        self.active_idx = self.end_idx

    def set_matcher(self, matcher: Any) -> None:
        self.matcher = matcher


# ----------------------------------------------------------------------------- tests


def test_fake_context_satisfies_protocol():
    from max.nn.kv_cache import KVCacheAwareContext

    ctx = FakeContext("a", [1, 2, 3])
    assert isinstance(ctx, KVCacheAwareContext)
    assert list(ctx.next_tokens) == [1, 2, 3] and ctx.active_length == 3
    ctx.update(9)
    assert (ctx.start_idx, ctx.active_idx, ctx.end_idx) == (3, 4, 4)
    assert list(ctx.next_tokens) == [9]


def test_object_missing_members_is_not_a_context():
    from max.nn.kv_cache import KVCacheAwareContext

    class Partial:
        request_id = "x"

    assert not isinstance(Partial(), KVCacheAwareContext)
