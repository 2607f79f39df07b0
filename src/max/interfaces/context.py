"""Context protocols: ``BaseContext`` (request lifecycle) and ``InputContext`` (token state).

Token array layout (``TextContext`` in ``max.pipelines.core`` is the concrete class;
the reference's prose and diagram disagree about the indices, and this package follows
the concrete definition)::

    tokens: [ in the KV cache | next_tokens | not yet fed | preallocated ... ]
            0           start_idx      active_idx       end_idx           len(tokens)

* ``start_idx``: number of tokens whose keys/values are already in the KV cache.
* ``next_tokens == tokens[start_idx:active_idx]``: what the next forward pass consumes;
  ``active_length == active_idx - start_idx``.
* ``end_idx``: one past the last valid token (``active_idx < end_idx`` during chunked
  prefill).  ``current_length == active_idx``.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from max.interfaces.log_probabilities import LogProbabilities
from max.interfaces.request import RequestID
from max.interfaces.sampling import SamplingParams
from max.interfaces.status import GenerationStatus


@runtime_checkable
class BaseContext(Protocol):
    """Minimal request-lifecycle contract shared by serving, scheduling and pipelines."""

    @property
    def request_id(self) -> RequestID:
        """Unique identifier for the request."""
        ...

    @property
    def status(self) -> GenerationStatus:
        """Current generation status of the request."""
        ...

    @property
    def is_done(self) -> bool:
        """Whether the request has completed generation."""
        ...


@runtime_checkable
class InputContext(Protocol):
    """Model inputs for token generation: token array, indices, status and sampling state."""

    @property
    def active_idx(self) -> int:
        """End (exclusive) of ``next_tokens`` in the token array."""
        ...

    @property
    def active_length(self) -> int:
        """Number of tokens processed this iteration (prompt or chunk size during context
        encoding, usually 1 during token generation)."""
        ...

    @property
    def all_tokens(self) -> npt.NDArray[np.integer[Any]]:
        """All prompt and generated tokens, without preallocated slots."""
        ...

    def bump_token_indices(self, start_idx: int = 0, active_idx: int = 0, end_idx: int = 0) -> None:
        """Increment the indices by the given amounts (the token array is not touched)."""
        ...

    def compute_num_available_steps(self, max_seq_len: int) -> int:
        """How many generation steps fit before ``max_seq_len`` is reached."""
        ...

    @property
    def current_length(self) -> int:
        """Total length of the sequence: completed plus active tokens."""
        ...

    @property
    def end_idx(self) -> int:
        """One past the last valid token."""
        ...

    @property
    def eos_token_ids(self) -> set[int]:
        """Token ids that end generation."""
        ...

    @property
    def generated_tokens(self) -> npt.NDArray[np.integer[Any]]:
        """Tokens produced by the model (prompt excluded)."""
        ...

    def get_min_token_logit_mask(self, num_steps: int) -> list[npt.NDArray[np.int32]]:
        """Per step, the token ids to mask (EOS while fewer than ``min_tokens`` were generated)."""
        ...

    @property
    def is_done(self) -> bool:
        """Whether generation has finished or been terminated."""
        ...

    @property
    def is_initial_prompt(self) -> bool:
        """True while no token has been generated."""
        ...

    @property
    def json_schema(self) -> Optional[str]:
        """JSON schema for constrained decoding, if any."""
        ...

    def jump_ahead(self, new_token: int) -> None:
        """Add a token and advance the indices (speculative decoding)."""
        ...

    @property
    def last_generated_token(self) -> int:
        """The most recently generated token; raises if none has been generated."""
        ...

    @property
    def log_probabilities(self) -> int:
        """Number of top tokens to return log probabilities for; 0 disables them."""
        ...

    @property
    def log_probabilities_echo(self) -> bool:
        """Whether prompt tokens also get log probabilities."""
        ...

    @property
    def matcher(self) -> Optional[Any]:
        """The grammar matcher for structured output, if any."""
        ...

    @property
    def max_length(self) -> Optional[int]:
        """Maximum sequence length, or None."""
        ...

    @property
    def min_tokens(self) -> int:
        """Minimum number of new tokens to generate."""
        ...

    @property
    def needs_ce(self) -> bool:
        """Whether prompt tokens remain to be encoded (context encoding)."""
        ...

    @property
    def next_tokens(self) -> npt.NDArray[np.integer[Any]]:
        """Tokens for the next forward pass; length ``active_length``."""
        ...

    @property
    def prompt_tokens(self) -> npt.NDArray[np.integer[Any]]:
        """The original prompt tokens."""
        ...

    @property
    def request_id(self) -> RequestID:
        """Unique identifier of the request."""
        ...

    def reset(self) -> None:
        """Make every token part of a new prompt (after eviction from the cache)."""
        ...

    @property
    def sampling_params(self) -> SamplingParams:
        """The request's sampling parameters."""
        ...

    def set_matcher(self, matcher: Any) -> None:
        """Install a grammar matcher for constrained decoding."""
        ...

    def set_token_indices(
        self, start_idx: Optional[int] = None, active_idx: Optional[int] = None, end_idx: Optional[int] = None
    ) -> None:
        """Set the indices to absolute values (the token array is not touched)."""
        ...

    @property
    def start_idx(self) -> int:
        """Number of tokens already processed (in the KV cache)."""
        ...

    @property
    def status(self) -> GenerationStatus:
        """Current generation status."""
        ...

    @property
    def tokens(self) -> npt.NDArray[np.integer[Any]]:
        """The full token array, preallocated slots included."""
        ...

    def update(self, new_token: int, log_probabilities: Optional[LogProbabilities] = None) -> None:
        """Append a generated token (and its log probabilities)."""
        ...
