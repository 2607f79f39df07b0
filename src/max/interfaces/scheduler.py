"""Scheduler contracts: ``Scheduler``, ``SchedulerResult``, and ``StepPlan`` (libremax: what one step runs)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Generic, Mapping, Optional, TypeVar

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


@dataclass(frozen=True)
class StepPlan:
    """What the scheduler decided one step runs (libremax extension), handed to the pipeline with the
    batch (``TextGenerationInputs.plan``); the pipeline computes it and decides nothing of its own.

    ``num_tokens``: per request id, the most tokens it runs this step -- 1 for a decode, up to the
    prefill chunk size for a prompt; fewer than the request has left means a prompt chunk, after which
    no token is sampled for it.  A request missing here runs everything it has.  ``pages``: the KV pages
    the scheduler reserved for each request at admission (its maximum length).
    """

    num_tokens: Mapping[str, int]
    pages: Mapping[str, int] = field(default_factory=dict)

    def tokens_for(self, request_id: str) -> Optional[int]:
        return self.num_tokens.get(request_id)
