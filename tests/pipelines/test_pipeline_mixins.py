"""max.pipelines.lib.pipeline's BatchInfo, GenerateMixin (TextGenerationPipeline.generate /
generate_async), KVCacheMixin (load_kv_manager, get_kv_params, infer_optimal_batch_size) and
get_paged_manager, on a tiny Llama checkpoint against transformers' greedy generation.
(MAX docs: max/api/python/pipelines/pipeline.)"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from family_support import family_llm, hf_greedy, tiny_family
from max.interfaces import SamplingParams, TextGenerationRequest
from max.pipelines.lib.pipeline import BatchInfo, GenerateMixin, KVCacheMixin, get_paged_manager


def _requests(prompts, n):
    sp = SamplingParams(top_k=1, max_new_tokens=n)
    return [TextGenerationRequest(request_id=f"g{i}", model_name="tiny", prompt=p, sampling_params=sp)
            for i, p in enumerate(prompts)]


def test_generate_matches_transformers_and_frees_the_cache():
    _, model, tok = tiny_family("llama")
    pipe = family_llm("llama").pipeline
    assert isinstance(pipe, GenerateMixin)
    prompts = ["def forward(self, x):", "import os"]
    outs = pipe.generate(_requests(prompts, 6))
    assert [o.request_id for o in outs] == ["g0", "g1"]
    assert [o.tokens for o in outs] == [hf_greedy(model, tok(p)["input_ids"], 6) for p in prompts]
    assert all(o.is_done for o in outs)
    mgr = get_paged_manager(pipe)
    assert mgr is pipe.kv_managers[0] and mgr.num_free_pages == mgr.total_num_pages
    single = pipe.generate(_requests(prompts[:1], 3)[0])
    assert single[0].tokens == outs[0].tokens[:3]


def test_generate_async_yields_each_step():
    pipe = family_llm("llama").pipeline

    async def steps():
        return [s async for s in pipe.generate_async(_requests(["import os"], 4))]

    got = asyncio.run(steps())
    assert len(got) == 4 and all(len(s) == 1 and len(s[0].tokens) == 1 for s in got)
    with pytest.raises(ValueError, match="no prompts"):
        pipe.generate([])


def test_kv_cache_mixin_and_batch_info():
    llm = family_llm("llama")
    pm = llm.pipeline.pipeline_model
    assert isinstance(pm, KVCacheMixin)
    hf = pm.huggingface_config
    params = type(pm).get_kv_params(hf, 1, pm.kv_cache_config, pm.kv_params.dtype)
    assert (params.n_kv_heads, params.head_dim) == (pm.kv_params.n_kv_heads, pm.kv_params.head_dim)
    assert type(pm).get_num_layers(hf) == hf.num_hidden_layers
    per_seq = -(-pm.max_seq_len // params.effective_page_size) * params.bytes_per_page(hf.num_hidden_layers)
    pc = pm.pipeline_config
    assert type(pm).infer_optimal_batch_size(pc, 3 * per_seq, hf, pm.devices, pm.kv_cache_config,
                                             params.dtype) == 3
    assert type(pm).estimate_kv_cache_size(pc, 10**12, pm.devices, hf, pm.kv_cache_config, params.dtype) == \
        pc.max_batch_size * per_seq
    mgr = pm.load_kv_manager(pm.session, 2 * per_seq)
    assert mgr.total_num_pages == 2 * per_seq // params.bytes_per_page(hf.num_hidden_layers)
    info = BatchInfo(past_seq_lens=[0, 7], seq_lens=[5, 1], num_steps=1)
    assert dataclasses.asdict(info) == {"past_seq_lens": [0, 7], "seq_lens": [5, 1], "num_steps": 1}
    assert get_paged_manager(object()) is None
