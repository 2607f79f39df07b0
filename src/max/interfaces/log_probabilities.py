"""``LogProbabilities``: a data-only record of per-token log probabilities."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LogProbabilities:
    """Log probabilities for output tokens (data only, serialisable).

    ``token_log_probabilities[i]`` is the log probability of the i-th sampled token;
    ``top_log_probabilities[i]`` maps the top-N candidate token ids at that step to
    their log probabilities.
    """

    token_log_probabilities: list[float]
    """Probabilities of each token."""
    top_log_probabilities: list[dict[int, float]]
    """Top tokens and their corresponding probabilities."""

    def __post_init__(self) -> None:
        if len(self.token_log_probabilities) != len(self.top_log_probabilities):
            raise ValueError(
                "LogProbabilities: token_log_probabilities and top_log_probabilities must have the same "
                f"length, got {len(self.token_log_probabilities)} and {len(self.top_log_probabilities)}"
            )
