"""Scheduler contracts: ``Scheduler``, ``SchedulerResult``, and ``StepPlan`` / ``RequestStep`` (libremax: what one
step runs)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Generic, Mapping, Optional, TypeVar

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
class RequestStep:
    """What one request computes in one step (libremax extension): the tokens ``start .. end`` of its
    sequence.  ``start`` is where its KV cache ends when the step begins (past ``reused`` prompt tokens the
    planner took from the prefix cache); ``end`` is where the step stops -- the end of what the request has
    pending, or earlier for a prompt chunk.  ``samples``: whether a token is sampled after the step (only
    when it reaches the end of what is pending).  ``snapshot``: whether the step ends on a page boundary
    where the KV manager keeps a copy of the request's recurrent state (hybrid and state-space models with
    prefix caching)."""

    start: int
    end: int
    samples: bool
    reused: int = 0
    snapshot: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"RequestStep: need 0 <= start < end, got start={self.start}, end={self.end}")
        if not 0 <= self.reused <= self.start:
            raise ValueError(f"RequestStep: reused={self.reused} must be between 0 and start={self.start}")

    @property
    def num_tokens(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class StepPlan:
    """What the scheduler decided one step runs (libremax extension), handed to the pipeline with the
    batch (``TextGenerationInputs.plan``); the pipeline executes it and decides nothing of its own.

    ``steps``: per request id, its :class:`RequestStep` (every request the step runs has one).
    ``pages``: the KV pages the scheduler reserved for each request at admission (its maximum length).
    """

    steps: Mapping[str, RequestStep]
    pages: Mapping[str, int] = field(default_factory=dict)

    @property
    def num_tokens(self) -> dict[str, int]:
        """Per request id, the tokens it computes this step."""
        return {rid: s.num_tokens for rid, s in self.steps.items()}

    def tokens_for(self, request_id: str) -> Optional[int]:
        s = self.steps.get(request_id)
        return None if s is None else s.num_tokens

    def step_for(self, ctx: Any) -> RequestStep:
        """``ctx``'s step, checked against the context's indices (ValueError when the plan has no step for
        it or was made for other indices: a plan is good for the one step it was made for)."""
        s = self.steps.get(ctx.request_id)
        if s is None:
            raise ValueError(f"StepPlan: no step planned for request {ctx.request_id!r}")
        start, pending = int(ctx.start_idx), int(ctx.active_idx)
        if s.start != start or s.end > pending or s.samples != (s.end == pending):
            raise ValueError(f"StepPlan: request {ctx.request_id!r} has tokens {start}..{pending} pending, but its "
                             f"step was planned for {s.start}..{s.end} (samples={s.samples}); plan each step anew")
        return s
