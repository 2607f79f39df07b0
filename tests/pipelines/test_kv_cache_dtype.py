"""``--kv-cache-dtype int8 / fp8_e4m3`` end to end on a tiny Llama (teacher-forced KL and top-1 against the
float cache, native and torch kernels agreeing, bytes per token), and the prefix cache's spill tier
serving a hit with the same output as no cache.  The SmolLM2 figures: ``test_quantized_resident.py``."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from lm_support import make_tiny_llama  # noqa: E402

from max.dtype import DType  # noqa: E402
from max.engine import native  # noqa: E402
from max.nn.kv_cache import KVCacheParams  # noqa: E402
from max.pipelines.lib.teacher_forcing import compare_distributions, teacher_forced_logits  # noqa: E402

IDS = [5 + (i * 37) % 480 for i in range(97)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = make_tiny_llama(str(tmp_path_factory.mktemp("tiny_kvq")), hidden_size=128, num_attention_heads=4,
                        num_key_value_heads=2, initializer_range=0.05)
    return d, teacher_forced_logits(d, IDS)


@pytest.mark.parametrize("kv,max_kl", [("int8", 1e-4), ("fp8_e4m3", 1e-3)])
def test_quantised_cache_tracks_the_float_cache(tiny, kv, max_kl):
    d, ref = tiny
    got = teacher_forced_logits(d, IDS, kv_cache_dtype=kv)
    res = compare_distributions(ref, got)
    assert res["mean_kl"] <= max_kl and res["top1"] >= 0.9, res
    assert res["mean_kl"] > 0  # the cache really is quantised


def test_native_and_torch_kernels_agree_on_an_int8_cache(tiny, monkeypatch):
    if native.lib() is None:
        pytest.skip("native kernels unavailable")
    d, _ = tiny
    nat = teacher_forced_logits(d, IDS, kv_cache_dtype="int8")
    monkeypatch.setattr(native, "_default", None)  # every kernel on its torch path
    assert native.isa() == "torch"
    tor = teacher_forced_logits(d, IDS, kv_cache_dtype="int8")
    assert np.abs(nat - tor).max() <= 1e-3 * float(np.abs(tor).max())


def test_bytes_per_token_and_pool():
    """SmolLM2-135M's cache shape (30 layers, 3 KV heads of 64): 46,080 bytes per token in float32,
    23,040 in bfloat16, 12,240 in int8 / fp8 (64 codes + a 4-byte scale per row: 0.27x float32)."""
    from max.driver import CPU
    from max.nn.kv_cache import PagedKVCacheManager

    def per_token(dt):
        return KVCacheParams(dtype=dt, n_kv_heads=3, head_dim=64).bytes_per_token(30)

    assert per_token(DType.float32) == 46080 and per_token(DType.bfloat16) == 23040
    assert per_token(DType.int8) == per_token(DType.float8_e4m3fn) == 12240
    assert per_token(DType.int8) <= per_token(DType.float32) / 2
    p = KVCacheParams(dtype=DType.int8, n_kv_heads=3, head_dim=64, page_size=16)
    m = PagedKVCacheManager(p, 2, 64, 30, [CPU()])
    pool = m.device_buffers[0]._torch()
    assert pool.dtype == torch.int8 and pool.shape[-1] == 68
    assert pool.numel() * pool.element_size() == m.memory_bytes == m.total_num_pages * 16 * 12240


def test_bad_kv_cache_dtype_is_refused_early(tiny):
    from click.testing import CliRunner

    from max.entrypoints.cli import main
    from max.pipelines import PipelineConfig

    d, _ = tiny
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, int8, fp8_e4m3"):
        PipelineConfig(model_path=d, kv_cache_dtype="int4")
    r = CliRunner().invoke(main, ["generate", "--model-path", d, "--kv-cache-dtype", "int4"])
    assert r.exit_code != 0 and "int4" in r.output
    with pytest.raises(ValueError, match="kv_cache_spill_dir requires"):
        PipelineConfig(model_path=d, kv_cache_spill_dir="/tmp/x")


def _generate(llm, prompts, n=4):
    from max.interfaces import SamplingParams, TextGenerationRequest

    params = SamplingParams(top_k=1, max_new_tokens=n, ignore_eos=True)
    outs = []
    for k, p in enumerate(prompts):
        req = TextGenerationRequest(request_id=f"r{len(outs)}-{k}", model_name="m", prompt=p,
                                    sampling_params=params)
        ctx = asyncio.run(llm.tokenizer.new_context(req))
        got: list[int] = []
        llm.scheduler.submit(ctx, lambda o: got.extend(o.tokens))
        llm.scheduler.run_until_idle()
        outs.append(got)
    return outs


@pytest.mark.parametrize("where", ["host", "disk"])
def test_prefix_hit_from_the_spill_tier_gives_the_same_output(tiny, where, tmp_path):
    """A pool of 5 pages of 16 tokens: prompt A's cached pages are evicted by B and C into the spill tier,
    and A again gets them back (32 tokens not recomputed) -- its tokens equal those of a model without
    prefix caching."""
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    d, _ = tiny
    a = IDS[:40]
    b, c = [7 + (i * 11) % 470 for i in range(40)], [9 + (i * 13) % 460 for i in range(40)]
    base = dict(model_path=d, max_length=64, max_batch_size=1, device_specs="cpu", kv_cache_page_size=16)
    plain = LLM(PipelineConfig(**base, enable_prefix_caching=False))
    want = _generate(plain, [a, b, c, a])
    page_bytes = 2 * 2 * 2 * 32 * 4 * 16  # K and V, 2 layers, 2 KV heads of 32 floats, 16 tokens
    spill = dict(kv_cache_spill_dir=str(tmp_path / "spill")) if where == "disk" else {}
    llm = LLM(PipelineConfig(**base, enable_prefix_caching=True, kv_cache_memory=5 * page_bytes,
                             enable_kvcache_swapping_to_host=True, host_kvcache_swap_space_gb=0.01, **spill))
    mgr = llm.pipeline.kv_managers[0]
    assert mgr.total_num_pages == 5 and mgr.spill is not None and mgr.spill.kind == where
    got = _generate(llm, [a, b, c, a])
    assert got == want
    assert mgr.spill_hit_tokens == 32 and mgr.prefix_cache_hit_tokens == 32
    assert mgr.spill.stored_pages >= 2 and mgr.spill.hit_pages == 2
