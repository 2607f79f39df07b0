"""Scheduler contracts: ``Scheduler`` and ``SchedulerResult``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Generic, Optional, TypeVar

PipelineOutputType = TypeVar("PipelineOutputType")


class Scheduler(ABC):
    """Base class of schedulers."""

    @abstractmethod
    def run_iteration(self) -> None:
        """Create and execute one batch (batch creation, request scheduling)."""
        raise NotImplementedError(f"{type(self).__name__}.run_iteration is not implemented")


@dataclass
class SchedulerResult(Generic[PipelineOutputType]):
    """The state of one request's pipeline execution as reported by the scheduler."""

    is_done: bool
    """Whether the operation has finished (completed or cancelled)."""
    result: Optional[PipelineOutputType]
    """The pipeline output, if any (None when cancelled)."""

    @classmethod
    def cancelled(cls) -> "SchedulerResult[PipelineOutputType]":
        """A finished result with no output."""
        return cls(is_done=True, result=None)

    @classmethod
    def create(cls, result: PipelineOutputType) -> "SchedulerResult[PipelineOutputType]":
        """A result carrying ``result``; done when ``result.is_done`` is."""
        return cls(is_done=bool(getattr(result, "is_done", False)), result=result)
