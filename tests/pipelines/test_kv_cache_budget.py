"""The KV cache a decoder pipeline allocates: sized from the model, max_length and max_batch_size
(or --kv-cache-memory), stored in the model's compute dtype, and a pool smaller than a full batch
at full length makes requests wait for pages instead of failing or re-running one by one."""

from __future__ import annotations

import os

import pytest

from lm_support import make_tiny_llama

pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

PAGE = 16


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_llama(str(tmp_path_factory.mktemp("kv_budget")))


def _llm(path, **kw):
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    return LLM(PipelineConfig(model_path=path, devices="cpu", max_length=64, max_batch_size=8,
                              kv_cache_page_size=PAGE, enable_prefix_caching=True, **kw))


def test_default_pool_is_max_batch_size_sequences_of_max_length_in_the_compute_dtype(tiny):
    llm = _llm(tiny)
    kv = llm.pipeline.kv_managers[0]
    model = llm.pipeline.pipeline_model
    assert kv.total_num_pages == 8 * (64 // PAGE)  # not a fixed byte budget
    assert kv.params.dtype == model.compute_dtype  # the cache follows the model's activations
    per_token = 2 * 2 * 2 * 16 * model.compute_dtype.size_in_bytes  # K+V, 2 layers, 2 KV heads, head_dim 16
    assert kv.memory_bytes == kv.total_num_pages * PAGE * per_token
    assert f"{kv.params.dtype_shorthand} on cpu" in kv.describe()


def test_small_pool_makes_requests_wait_for_pages(tiny):
    from max.interfaces import SamplingParams

    per_page = 2 * 2 * 2 * 16 * 4 * PAGE  # float32 tiny llama
    llm = _llm(tiny, kv_cache_memory=8 * per_page)
    kv = llm.pipeline.kv_managers[0]
    assert kv.total_num_pages == 8
    sched = llm.scheduler
    seen: list[int] = []

    class Hooks:
        def batch_size(self, n, queue_depth):
            seen.append(n)

    sched.metrics = Hooks()
    params = SamplingParams(top_k=1, max_new_tokens=40, ignore_eos=True)
    prompts = [f"x = {i}" for i in range(6)]  # ~4 tokens + 40 new = 3 pages of 16 each: 2 fit in 8 pages
    outs = llm.generate(prompts, sampling_params=params, max_new_tokens=40, use_tqdm=False)
    assert len(outs) == 6 and all(o for o in outs)
    assert max(seen) == 2  # never more running than the pool holds at their maximum lengths
    assert sched.recoveries == 0  # no batch ever failed for lack of pages
    assert kv.num_free_pages == kv.total_num_pages
    kv.check_invariants()
