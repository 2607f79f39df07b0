"""The step plan: the scheduler decides what each request computes in a step (prompt chunks, image-aligned
ends, state-snapshot points, prefix reuse) and hands the pipeline a plain record (``StepPlan`` of
``RequestStep``); the pipeline follows it and decides nothing itself.  The rule (``plan_step``) is pure and
is checked here directly, by examples and by properties over random requests."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lm_support import make_tiny_llama
from max.interfaces import RequestStep, SamplingParams, StepPlan, TextGenerationInputs, TextGenerationRequest
from max.pipelines.lib.scheduler import TokenGenerationScheduler, prefill_chunk_size_of
from max.pipelines.lib.step_plan import (RequestState, StepCapabilities, StepPlanner, chunk_end, plan_request,
                                         plan_step, snapshot_cut)


class _Ctx:
    def __init__(self, rid: str, n: int, start: int = 0) -> None:
        self.request_id, self.start_idx, self.active_idx = rid, start, start + n
        self.image_spans: tuple = ()


def test_plan_step_rule():
    ctxs = [_Ctx("decode", 1, start=40), _Ctx("long", 100), _Ctx("short", 7)]
    p = plan_step(ctxs, 32, {"decode": 3})
    assert dict(p.num_tokens) == {"decode": 1, "long": 32, "short": 7} and dict(p.pages) == {"decode": 3}
    assert p.steps["decode"] == RequestStep(40, 41, samples=True)
    assert p.steps["long"] == RequestStep(0, 32, samples=False) and p.steps["short"].samples
    assert dict(plan_step(ctxs, None).num_tokens) == {"decode": 1, "long": 100, "short": 7}
    assert p.tokens_for("missing") is None
    with pytest.raises(ValueError, match="given twice"):
        plan_step([_Ctx("a", 3), _Ctx("a", 2)], None)
    with pytest.raises(ValueError, match="chunk size"):
        plan_step(ctxs, 0)
    with pytest.raises(ValueError, match="nothing pending"):
        RequestState("r", 5, 5)
    with pytest.raises(ValueError, match="start < end"):
        RequestStep(3, 3, samples=True)

    class Cfg:
        enable_chunked_prefill, prefill_chunk_size = True, 16

    assert prefill_chunk_size_of(Cfg()) == 16 and prefill_chunk_size_of(None) is None
    Cfg.enable_chunked_prefill = False
    assert prefill_chunk_size_of(Cfg()) is None


def test_images_and_snapshots_move_the_cut():
    spans = ((5, 9), (12, 20))
    r = RequestState("r", 0, 30, spans)
    assert plan_request(r, 7).end == 5  # the cut at 7 is inside the first image: before it
    assert plan_request(RequestState("r", 12, 30, spans), 2).end == 20  # the image starts the chunk: all of it
    # state snapshots every 4 tokens: a prompt's step ends at its last page boundary (the rest runs next)
    s = plan_request(RequestState("r", 0, 10), None, 4)
    assert (s.end, s.samples, s.snapshot) == (8, False, True)
    assert plan_request(RequestState("r", 8, 10), None, 4) == RequestStep(8, 10, samples=True)
    assert plan_request(RequestState("r", 0, 8), None, 4).end == 8  # ends on a boundary: whole
    assert plan_request(RequestState("r", 0, 30), 7, 4).end == 4  # a chunk too ends at its last boundary
    assert plan_request(RequestState("r", 9, 10), None, 4) == RequestStep(9, 10, samples=True)  # a decode
    # a boundary inside an image is skipped for the one before the image
    assert snapshot_cut(0, 23, 4, spans) == 20 and snapshot_cut(0, 19, 4, spans) == 12
    assert snapshot_cut(0, 11, 4, ((6, 10),)) == 4
    assert snapshot_cut(5, 11, 4, ((4, 10),)) == 11  # no boundary outside the image: no cut
    assert chunk_end(0, 10, spans) == 10


# ------------------------------------------------------------------ properties of the rule
@st.composite
def _requests(draw):
    end = draw(st.integers(1, 160))
    start = draw(st.integers(0, end - 1))
    marks = sorted(draw(st.sets(st.integers(0, end), max_size=8)))
    spans = tuple((lo, hi) for lo, hi in zip(marks[::2], marks[1::2]) if hi - lo > 1)
    return RequestState("r", start, end, spans)


_chunks = st.one_of(st.none(), st.integers(1, 48))
_pages = st.one_of(st.none(), st.integers(1, 24))


def _inside(spans, i):
    return any(lo < i < hi for lo, hi in spans)


@settings(max_examples=400, deadline=None)
@given(_requests(), _chunks, _pages)
def test_one_step_keeps_the_budget_and_every_image_whole(r, chunk, page):
    s = plan_request(r, chunk, page)
    assert s.start == r.start < s.end <= r.end and s.samples == (s.end == r.end)
    assert not _inside(r.image_spans, s.end), "an image split between two steps"
    if chunk is not None:  # over the budget only to take an image that starts the chunk whole
        assert s.end <= r.start + chunk or any(lo <= r.start and r.start + chunk < hi and s.end <= hi
                                              for lo, hi in r.image_spans)
    else:
        assert page is not None or s.end == r.end
    assert s.snapshot == (page is not None and s.end % page == 0)


@settings(max_examples=400, deadline=None)
@given(_requests(), _chunks, _pages)
def test_a_prompt_run_to_its_end_step_by_step(r, chunk, page):
    """Planning step after step covers the prompt without gaps, samples once at its end, and -- for a model
    that snapshots its state -- ends a step at the last page boundary the prompt reaches (outside images),
    where a later request sharing the prefix finds the state."""
    ends, state = [], r
    while True:
        s = plan_request(state, chunk, page)
        assert s.start == state.start
        ends.append(s.end)
        if s.samples:
            break
        state = RequestState("r", s.end, r.end, r.image_spans)
    assert ends[-1] == r.end and ends == sorted(set(ends))
    if page is not None:
        last = [b for b in range(r.start + 1, r.end + 1) if b % page == 0 and not _inside(r.image_spans, b)]
        assert not last or last[-1] in ends


@settings(max_examples=100, deadline=None)
@given(st.lists(_requests(), min_size=1, max_size=6), _chunks, _pages)
def test_a_batch_plans_each_request_alone(rs, chunk, page):
    rs = [RequestState(f"r{i}", r.start, r.end, r.image_spans) for i, r in enumerate(rs)]
    plan = plan_step(rs, chunk, snapshot_interval=page)
    assert list(plan.steps) == [r.request_id for r in rs]
    for r in rs:
        assert plan.steps[r.request_id] == plan_request(r, chunk, page)


# ------------------------------------------------------------------ the scheduler and the pipeline
def test_the_scheduler_hands_its_plan_to_the_pipeline():
    seen = []

    class Pipe:
        kv_managers: list = []
        step_capabilities = StepCapabilities()

        def execute(self, inputs):
            seen.append(inputs.plan)
            return {}

    sched = TokenGenerationScheduler(Pipe(), None, prefill_chunk_size=4)
    sched._execute({"a": _Ctx("a", 10), "b": _Ctx("b", 1)})
    assert isinstance(seen[0], StepPlan) and dict(seen[0].num_tokens) == {"a": 4, "b": 1}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    d = make_tiny_llama(str(tmp_path_factory.mktemp("plan")), max_position_embeddings=256)
    return LLM(PipelineConfig(model_path=d, max_length=128, max_batch_size=2, device_specs="cpu",
                              enable_prefix_caching=False))


def _ctx(llm, rid, ids, n):
    req = TextGenerationRequest(request_id=rid, model_name="m", prompt=ids,
                                sampling_params=SamplingParams(top_k=1, max_new_tokens=n, ignore_eos=True))
    return asyncio.run(llm.tokenizer.new_context(req))


def test_the_pipeline_follows_the_plan_not_its_config(tiny):
    """Chunking off in the config; a plan of 5-token chunks makes the pipeline prefill in chunks (no
    token sampled until the prompt is done) and the greedy tokens equal a whole-prompt prefill's."""
    ids = [int(t) for t in np.random.default_rng(0).integers(5, 900, 23)]
    whole = _ctx(tiny, "whole", ids, 4)
    pipe = tiny.pipeline
    pipe.execute(TextGenerationInputs([{"whole": whole}], num_steps=4))
    chunked = _ctx(tiny, "chunked", ids, 4)
    steps = 0
    while not chunked.is_done:
        plan = plan_step([chunked], 5)
        before = len(chunked.tokens[:chunked.end_idx])
        pipe.execute(TextGenerationInputs([{"chunked": chunked}], num_steps=1, plan=plan))
        steps += 1
        if steps <= 4:  # 23 prompt tokens: chunks of 5, 5, 5, 5, then 3 with the first sample
            assert chunked.end_idx == before, "a prompt chunk samples nothing"
    assert steps == 5 + 3
    assert list(chunked.tokens[len(ids):chunked.end_idx]) == list(whole.tokens[len(ids):whole.end_idx])
    for rid in ("whole", "chunked"):
        pipe.release(rid)


def test_a_plan_is_good_for_its_own_step_only(tiny):
    """A plan without the request, or made for other indices, or for several steps, is refused before
    anything runs; a step that fails leaves the request with everything it had pending."""
    pipe = tiny.pipeline
    ids = [int(t) for t in np.random.default_rng(1).integers(5, 900, 12)]
    c = _ctx(tiny, "c", ids, 2)
    with pytest.raises(ValueError, match="no step planned"):
        pipe.execute(TextGenerationInputs([{"c": c}], num_steps=1, plan=plan_step([_Ctx("other", 3)], None)))
    stale = plan_step([RequestState("c", 4, 12)], None)
    with pytest.raises(ValueError, match="planned for 4..12"):
        pipe.execute(TextGenerationInputs([{"c": c}], num_steps=1, plan=stale))
    with pytest.raises(ValueError, match="covers one step"):
        pipe.execute(TextGenerationInputs([{"c": c}], num_steps=2, plan=plan_step([c], None)))
    assert (c.start_idx, c.active_idx, c.end_idx) == (0, 12, 12)

    model = pipe.pipeline_model
    real = model.execute

    def boom(*a, **k):
        raise RuntimeError("device lost")

    model.execute = boom
    try:
        with pytest.raises(RuntimeError, match="device lost"):
            pipe.execute(TextGenerationInputs([{"c": c}], num_steps=1, plan=plan_step([c], 5)))
    finally:
        model.execute = real
    assert c.active_idx == 12 and c.end_idx == 12, "a failed chunk must not shorten the prompt"
    pipe.release("c")


def test_the_planner_takes_the_cached_prefix_before_cutting(tmp_path):
    """With prefix caching, a repeated prompt's plan starts past its cached pages (``reused``), the chunk is
    measured from there, and the tokens equal the first run's; the pipeline declares what it can do."""
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    d = make_tiny_llama(str(tmp_path), max_position_embeddings=256)
    llm = LLM(PipelineConfig(model_path=d, max_length=128, max_batch_size=2, device_specs="cpu",
                             kv_cache_page_size=16, enable_prefix_caching=True))
    pipe = llm.pipeline
    mgr = pipe.kv_managers[0]
    caps = pipe.step_capabilities
    assert caps.prefix_cache is mgr and caps.snapshot_interval is None and caps.adapters is None
    ids = [int(t) for t in np.random.default_rng(2).integers(5, 900, 40)]
    first = _ctx(llm, "first", ids, 3)
    pipe.execute(TextGenerationInputs([{"first": first}], num_steps=3))
    pipe.release("first")
    again = _ctx(llm, "again", ids, 3)
    planner = StepPlanner(8, caps)
    plan = planner.plan([again])
    assert plan.steps["again"] == RequestStep(32, 40, samples=True, reused=32)  # two 16-token pages
    pipe.execute(TextGenerationInputs([{"again": again}], num_steps=1, plan=plan))
    while not again.is_done:
        pipe.execute(TextGenerationInputs([{"again": again}], num_steps=1, plan=planner.plan([again])))
    assert list(again.tokens[40:again.end_idx]) == list(first.tokens[40:first.end_idx])
    assert mgr.cached_tokens("again") == 32
    pipe.release("again")
