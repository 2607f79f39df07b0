"""The step plan: the scheduler decides how many tokens each request runs per step (prompt chunks) and
hands the pipeline a plain record (``StepPlan``); the pipeline follows it and decides nothing itself."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from lm_support import make_tiny_llama
from max.interfaces import SamplingParams, StepPlan, TextGenerationInputs, TextGenerationRequest
from max.pipelines.lib.scheduler import TokenGenerationScheduler, plan_step, prefill_chunk_size_of


class _Ctx:
    def __init__(self, rid: str, n: int) -> None:
        self.request_id, self.active_length = rid, n


def test_plan_step_rule():
    ctxs = [_Ctx("decode", 1), _Ctx("long", 100), _Ctx("short", 7)]
    p = plan_step(ctxs, 32, {"decode": 3})
    assert dict(p.num_tokens) == {"decode": 1, "long": 32, "short": 7} and dict(p.pages) == {"decode": 3}
    assert dict(plan_step(ctxs, None).num_tokens) == {"decode": 1, "long": 100, "short": 7}
    assert p.tokens_for("missing") is None

    class Cfg:
        enable_chunked_prefill, prefill_chunk_size = True, 16

    assert prefill_chunk_size_of(Cfg()) == 16 and prefill_chunk_size_of(None) is None
    Cfg.enable_chunked_prefill = False
    assert prefill_chunk_size_of(Cfg()) is None


def test_the_scheduler_hands_its_plan_to_the_pipeline():
    seen = []

    class Pipe:
        kv_managers: list = []

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
