"""The step plan: before each model step, what every request computes in it.

The scheduler decides, the pipeline computes (the split of vLLM v1: a scheduler's record in, the model's
output out).  This module is the deciding half; ``pipeline.py`` executes the record and decides nothing.

* :func:`plan_step` is the rule, a pure function of plain records (:class:`RequestState` in,
  :class:`~max.interfaces.StepPlan` of :class:`~max.interfaces.RequestStep` out):

  - a request runs everything it has pending (one token when decoding, the rest of its prompt);
  - with a prefill chunk size, a prompt runs at most that many tokens, and the cut never lands inside an
    image's tokens (they attend to each other both ways, so they run in one step): it moves back to the
    image's start, or -- when the image starts the chunk -- forward to its end (:func:`chunk_end`);
  - a model that snapshots its recurrent state at page boundaries (hybrid / state-space models with
    prefix caching) ends a prompt's step (or chunk) at the last page boundary inside it, so a later request
    sharing the prefix finds the state there; the rest runs in the next step (:func:`snapshot_cut`);
  - a request samples a token only after a step that reaches the end of what it has pending.

* :class:`StepPlanner` does the part of planning that touches the KV cache, which the rule depends on,
  then calls :func:`plan_step`: it tags each request's prefix-cache salt with its LoRA adapter, and
  before a prompt is cut (by the chunk size or for a snapshot) looks its prefix up in the cache
  (``reuse_cached_prefix``), so the cut is measured from past the reused tokens.  It knows what the
  pipeline can do from the pipeline's declared :class:`StepCapabilities`, never by probing.

Prompts that run whole are looked up by the KV manager when it reserves their pages (``fetch``), after the
model's ``prepare_contexts`` hook (Phi-3 LongRoPE salts a request by the length it reaches in the step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Protocol, Sequence

from max.interfaces import RequestStep, StepPlan

__all__ = ["PrefixCache", "RequestState", "StepCapabilities", "StepPlanner", "chunk_end", "plan_request",
           "plan_step", "snapshot_cut"]

Span = tuple[int, int]


@dataclass(frozen=True)
class RequestState:
    """What the rule reads of one request: its id, ``start`` (tokens whose K/V is cached), ``end`` (the end
    of its pending tokens), the ``image_spans`` ``(start, end)`` that must each run in one step, and the
    prompt tokens the planner took from the prefix cache for this step (``reused``)."""

    request_id: str
    start: int
    end: int
    image_spans: tuple[Span, ...] = ()
    reused: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"request {self.request_id!r}: nothing pending to plan (start_idx={self.start}, "
                             f"active_idx={self.end})")

    @classmethod
    def of(cls, ctx: Any, reused: int = 0) -> "RequestState":
        """A context's state (``request_id``, ``start_idx``, ``active_idx``, ``image_spans``)."""
        return cls(ctx.request_id, int(ctx.start_idx), int(ctx.active_idx), tuple(ctx.image_spans), reused)


def chunk_end(start: int, cut: int, spans: Sequence[Span]) -> int:
    """Where a prompt chunk from ``start`` meant to end at ``cut`` ends: ``cut``, unless that is inside an
    image span -- then the image's start, or its end when the image begins at or before ``start``."""
    for lo, hi in spans:
        if lo < cut < hi:
            return lo if lo > start else hi
    return cut


def snapshot_cut(start: int, end: int, page: int, spans: Sequence[Span] = ()) -> int:
    """Where a step running ``start .. end`` ends for a state snapshot every ``page`` tokens: ``end`` when it
    is on a boundary, else the last boundary strictly inside the step that is inside no image span (else
    ``end``)."""
    b = end - end % page
    if b == end:
        return end
    while b > start:
        inside = [lo for lo, hi in spans if lo < b < hi]
        if not inside:
            return b
        b = inside[0] - inside[0] % page  # the last boundary at or before that image's start
    return end


def plan_request(r: RequestState, chunk: Optional[int], snapshot_interval: Optional[int] = None) -> RequestStep:
    """One request's step under the rule of :func:`plan_step`."""
    end = r.end
    if chunk is not None and r.end - r.start > chunk:
        end = min(chunk_end(r.start, r.start + chunk, r.image_spans), r.end)
    if snapshot_interval is not None:
        end = snapshot_cut(r.start, end, snapshot_interval, r.image_spans)
    snap = snapshot_interval is not None and end % snapshot_interval == 0
    return RequestStep(r.start, end, samples=end == r.end, reused=r.reused, snapshot=snap)


def plan_step(requests: Iterable[Any], chunk: Optional[int], pages: Optional[Mapping[str, int]] = None, *,
              snapshot_interval: Optional[int] = None) -> StepPlan:
    """The step record for ``requests`` (:class:`RequestState` s, or contexts read by
    :meth:`RequestState.of`): each runs what it has pending, a prompt at most ``chunk`` tokens (None: whole)
    with image spans kept whole, cut at its last page boundary when the model snapshots its state every
    ``snapshot_interval`` tokens; ``pages``: the KV pages reserved per request (reported as is).  Pure: reads
    its arguments, changes nothing."""
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise ValueError(f"plan_step: the prefill chunk size must be an int >= 1 or None, got {chunk!r}")
    if snapshot_interval is not None and (isinstance(snapshot_interval, bool) or
                                          not isinstance(snapshot_interval, int) or snapshot_interval < 1):
        raise ValueError(f"plan_step: snapshot_interval must be an int >= 1 or None, got {snapshot_interval!r}")
    steps: dict[str, RequestStep] = {}
    for r in requests:
        state = r if isinstance(r, RequestState) else RequestState.of(r)
        if state.request_id in steps:
            raise ValueError(f"plan_step: request {state.request_id!r} given twice")
        steps[state.request_id] = plan_request(state, chunk, snapshot_interval)
    return StepPlan(steps, dict(pages or {}))


class PrefixCache(Protocol):
    """The KV manager calls the planner makes (``PagedKVCacheManager`` has them)."""

    def contains(self, request_id: str) -> bool: ...

    def external_claim(self, request_id: str) -> None: ...

    def reuse_cached_prefix(self, ctx: Any) -> int: ...


class AdapterSet(Protocol):
    """Which LoRA adapters are loaded (``LoRAManager``)."""

    def has(self, name: Optional[str]) -> bool: ...


@dataclass(frozen=True)
class StepCapabilities:
    """What a pipeline can do that changes its plan, declared by the pipeline
    (``TextGenerationPipeline.step_capabilities``):

    ``prefix_cache``: its KV manager, when it reuses cached prompt prefixes (None: no prefix cache);
    ``snapshot_interval``: the page size, when its KV manager snapshots recurrent state at page boundaries
    (None: it keeps none); ``adapters``: its LoRA adapters (None without LoRA): a request naming a loaded
    adapter shares prefix-cache pages only with requests of the same adapter."""

    prefix_cache: Optional[PrefixCache] = None
    snapshot_interval: Optional[int] = None
    adapters: Optional[AdapterSet] = None


class StepPlanner:
    """Plans steps for one pipeline: prompts at most ``chunk`` tokens per step (None: whole), under the
    pipeline's ``capabilities``."""

    def __init__(self, chunk: Optional[int], capabilities: StepCapabilities = StepCapabilities()) -> None:
        self.chunk = chunk
        self.capabilities = capabilities

    def plan(self, ctxs: Iterable[Any], pages: Optional[Mapping[str, int]] = None) -> StepPlan:
        """This step's record for the contexts ``ctxs`` (unfinished requests).  Sets each one's prefix-cache
        salt from its adapter and, where a cut depends on it, takes its cached prefix (the context's
        ``start_idx`` moves past the reused tokens; the KV manager claims the request first)."""
        caps, chunk = self.capabilities, self.chunk
        states = []
        for c in ctxs:
            if caps.adapters is not None:  # cached pages are shared only between requests of one adapter
                c.cache_salt = f"lora:{c.model_name}" if caps.adapters.has(c.model_name) else None
            reused = 0
            n = int(c.active_idx) - int(c.start_idx)
            cache = caps.prefix_cache
            if cache is not None and n > 1 and ((chunk is not None and n > chunk) or
                                                caps.snapshot_interval is not None):
                if not cache.contains(c.request_id):
                    cache.external_claim(c.request_id)
                reused = int(cache.reuse_cached_prefix(c))
            states.append(RequestState.of(c, reused))
        return plan_step(states, chunk, pages, snapshot_interval=caps.snapshot_interval)
