"""``GenerationStatus``: where a request's generation stands."""

from __future__ import annotations

import enum


class GenerationStatus(str, enum.Enum):
    """Status of a generation process.  Every status other than ``ACTIVE`` is final."""

    ACTIVE = "active"
    """The generation process is ongoing."""
    END_OF_SEQUENCE = "end_of_sequence"
    """The generation process has reached the end of the sequence."""
    MAXIMUM_LENGTH = "maximum_length"
    """The generation process has reached the maximum allowed length."""
    CANCELLED = "cancelled"
    """The generation process has been cancelled by the user."""

    @property
    def is_done(self) -> bool:
        """True if the generation process is complete (the status is not ``ACTIVE``)."""
        return self is not GenerationStatus.ACTIVE

    def __str__(self) -> str:
        return self.value
