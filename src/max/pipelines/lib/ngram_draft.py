"""The n-gram (prompt lookup) draft of speculative decoding: proposals copied from the request's own
tokens, no draft model.

When the last ``n`` tokens of a request (``n`` from ``prompt_lookup_max`` down to
``prompt_lookup_min``, longest first) occurred earlier in its prompt or output, the tokens that followed
their latest earlier occurrence are proposed (at most ``k``).  Repetitive generation -- editing code
that is in the prompt, summarising or quoting a given text -- continues such matches often, so the
target model verifies several tokens per step.  The proposal is deterministic (a one-hot draft
distribution), so rejection sampling keeps the target's distribution and greedy output is unchanged.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["DEFAULT_PROMPT_LOOKUP", "ngram_proposal", "prompt_lookup_bounds"]

DEFAULT_PROMPT_LOOKUP = 5
"""``prompt_lookup_max`` and ``prompt_lookup_min`` when neither is given (one given: the other equals it)."""


def prompt_lookup_bounds(lookup_min: int | None, lookup_max: int | None) -> tuple[int, int]:
    """``(min, max)`` n-gram sizes from the configured values (see :data:`DEFAULT_PROMPT_LOOKUP`); a clear
    ValueError for sizes < 1 or min > max."""
    if lookup_min is None and lookup_max is None:
        lookup_min = lookup_max = DEFAULT_PROMPT_LOOKUP
    lo = int(lookup_min if lookup_min is not None else lookup_max)  # type: ignore[arg-type]
    hi = int(lookup_max if lookup_max is not None else lookup_min)  # type: ignore[arg-type]
    if lo < 1 or hi < lo:
        raise ValueError(f"prompt_lookup_min ({lo}) must be >= 1 and <= prompt_lookup_max ({hi})")
    return lo, hi


def ngram_proposal(tokens: Sequence[int] | np.ndarray, k: int, lookup_min: int, lookup_max: int) -> list[int]:
    """Up to ``k`` draft tokens for a request whose tokens so far are ``tokens`` (see the module
    docstring); ``[]`` when no suffix of ``lookup_min .. lookup_max`` tokens occurred before."""
    t = np.asarray(tokens, dtype=np.int64)
    L = len(t)
    if k < 1:
        return []
    for n in range(min(lookup_max, L - 1), lookup_min - 1, -1):
        # windows starting at 0 .. L - 1 - n: every earlier occurrence, never the suffix itself
        windows = np.lib.stride_tricks.sliding_window_view(t[: L - 1], n)
        hits = np.flatnonzero((windows == t[L - n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return t[start:start + k].tolist()
    return []
