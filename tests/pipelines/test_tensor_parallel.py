"""Tensor parallelism in one process over several logical CPU devices (``devices="cpu:0,1"``): a tiny
random Llama (and Qwen2: q/k/v biases, tied embeddings) split over 2 and 4 devices gives the logits of
the same model on one device, batched, over the paged KV cache (prefill crossing a page + decode
steps); each device holds its share of the KV heads and every page is freed; bad device lists and
head counts that do not divide fail before any model work."""

from __future__ import annotations

import functools
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nn"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

transformers = pytest.importorskip("transformers")

from test_hf_utils import make_bpe_tokenizer  # noqa: E402
from test_kv_cache_context import FakeContext  # noqa: E402


@functools.lru_cache(maxsize=None)
def tiny(family: str, extra_vocab: int = 0, bf16: bool = False) -> tuple[str, int]:
    """A tiny random checkpoint: 8 query heads, 4 KV heads (GQA), 2 layers; vocabulary = the
    tokenizer's (a multiple of 4) plus ``extra_vocab`` rows; ``bf16``: saved in bfloat16 (kept half
    precision on the CPU, widened on use)."""
    import torch

    tok = transformers.AutoTokenizer.from_pretrained(make_bpe_tokenizer())
    dims = dict(vocab_size=len(tok) + extra_vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256, initializer_range=0.2,
                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    if family == "llama":
        cfg = transformers.LlamaConfig(**dims, tie_word_embeddings=False)
    else:
        cfg = transformers.Qwen2Config(**dims, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval().float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith((".bias", "norm.weight")):
                p.uniform_(-0.5, 0.5)
    d = tempfile.mkdtemp(prefix=f"libremax-tp-{family}-")
    (model.to(torch.bfloat16) if bf16 else model).save_pretrained(d)
    tok.save_pretrained(d)
    return d, cfg.vocab_size


def _llm(path: str, devices: str):
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    return LLM(PipelineConfig(model_path=path, devices=devices, max_length=128, max_batch_size=4,
                              kv_cache_page_size=16))


def _run(llm, prompts: dict[str, list[int]], forced: dict[str, list[int]]) -> list[np.ndarray]:
    """Every step's logits ``[batch, vocab]`` for ``prompts`` run together (prefill, then one decode step
    per token of ``forced``); all of the request's pages are released at the end."""
    pm = llm.pipeline.pipeline_model
    mgr = pm.kv_manager
    ctxs = [FakeContext(rid, p) for rid, p in prompts.items()]
    for c in ctxs:
        mgr.claim(c.request_id)
    out = []
    try:
        for step in range(len(next(iter(forced.values()))) + 1):
            kv = mgr.fetch(ctxs)
            out.append(pm.execute(pm.prepare_initial_token_inputs(ctxs, kv)).logits.numpy().copy())
            if step == len(next(iter(forced.values()))):
                break
            for c in ctxs:
                c.tokens[c.end_idx] = forced[c.request_id][step]
                c.bump_token_indices(start_idx=c.active_idx - c.start_idx, active_idx=1, end_idx=1)
            mgr.step(ctxs)
        assert mgr.num_free_pages < mgr.total_num_pages  # the requests held pages ...
    finally:
        for c in ctxs:
            mgr.release(c.request_id)
    assert mgr.num_free_pages == mgr.total_num_pages  # ... and every page is free again (one table, all devices)
    mgr.check_invariants()
    return out


@pytest.mark.parametrize("family,n_dev,extra_vocab,bf16", [
    ("llama", 2, 0, False), ("llama", 4, 0, False),
    ("llama", 4, 2, False),  # vocabulary not a multiple of 4: embedding and lm_head run whole on the first device
    ("qwen2", 2, 0, False),
    ("qwen2", 2, 0, True),  # bfloat16 weights (and tied table) kept half precision, widened per shard
])
def test_split_model_matches_one_device(family, n_dev, extra_vocab, bf16):
    path, vocab = tiny(family, extra_vocab, bf16)
    rng = np.random.default_rng(1)
    prompts = {"a": rng.integers(0, vocab, 21).tolist(), "b": rng.integers(0, vocab, 6).tolist()}
    forced = {rid: rng.integers(0, vocab, 3).tolist() for rid in prompts}
    ref = _run(_llm(path, "cpu"), prompts, forced)
    llm = _llm(path, "cpu:" + ",".join(str(i) for i in range(n_dev)))
    pm = llm.pipeline.pipeline_model
    assert [str(r) for r in pm.device_refs] == [f"cpu:{i}" for i in range(n_dev)]
    mgr = pm.kv_manager
    assert len(mgr.device_buffers) == n_dev
    for buf in mgr.device_buffers:  # each device caches its share of the 4 KV heads
        assert tuple(buf.shape)[4] == 4 // n_dev
    got = _run(llm, prompts, forced)
    for step, (g, r) in enumerate(zip(got, ref)):
        assert g.shape == r.shape == (2, vocab)
        scale = max(1.0, float(np.abs(r).max()))
        err = float(np.abs(g - r).max())
        assert err <= 1e-5 * scale, f"step {step}: max |diff| {err:.3g} vs 1 device (scale {scale:.3g})"


def test_greedy_generation_is_the_same_split_over_two_devices():
    from max.interfaces import SamplingParams

    path, _ = tiny("llama")
    params = SamplingParams(top_k=1, max_new_tokens=8, ignore_eos=True)
    prompts = ["def forward(self, x):", "import os"]
    one = list(_llm(path, "cpu").generate(prompts, use_tqdm=False, sampling_params=params))
    two = list(_llm(path, "cpu:0,1").generate(prompts, use_tqdm=False, sampling_params=params))
    assert one == two and all(one)


def test_head_counts_that_do_not_divide_fail_before_model_work(monkeypatch):
    from max.pipelines.architectures.common import model as model_mod

    path, _ = tiny("llama")

    def boom(*a, **k):  # the KV cache is the first model work; the check must come before it
        raise AssertionError("model work started")

    monkeypatch.setattr("max.nn.kv_cache.PagedKVCacheManager", boom)
    with pytest.raises(ValueError, match=r"num_attention_heads = 8 does not split evenly across 3 devices"):
        _llm(path, "cpu:0,1,2")
    assert model_mod  # imported: the patch above reaches the module the model builds from


@pytest.mark.parametrize("spec,match", [
    ("cpu:0,0", "must be distinct"),
    ("cpu:0,x", "expected e.g."),
    ("gpu:7", "accelerator"),
])
def test_bad_device_lists_are_clear_errors(spec, match):
    path, _ = tiny("llama")
    with pytest.raises(ValueError, match=match):
        _llm(path, spec)


@pytest.mark.gpu
def test_split_over_two_gpus_matches_one_gpu():
    """The same check on real accelerators (peer copies between GPUs); needs 2 of them."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, torch sees {torch.cuda.device_count()}")
    path, vocab = tiny("llama")
    rng = np.random.default_rng(3)
    prompts = {"a": rng.integers(0, vocab, 21).tolist(), "b": rng.integers(0, vocab, 6).tolist()}
    forced = {rid: rng.integers(0, vocab, 3).tolist() for rid in prompts}
    ref = _run(_llm(path, "gpu:0"), prompts, forced)
    got = _run(_llm(path, "gpu:0,1"), prompts, forced)
    for step, (g, r) in enumerate(zip(got, ref)):
        scale = max(1.0, float(np.abs(r).max()))
        assert float(np.abs(g - r).max()) <= 1e-4 * scale, f"step {step}"  # TF32/cuBLAS split sums


@pytest.mark.parametrize("family", ["mistral", "qwen3", "gemma3", "granite"])
def test_other_families_split_over_two_devices(family):
    """Sliding windows (Mistral, Gemma 3), per-head q/k norms (Qwen3), Gemma 3's extra norms, local RoPE
    and soft-capping, Granite's multipliers: the same logits over 2 devices as over 1."""
    from family_support import tiny_family

    path, model, tok = tiny_family(family)
    rng = np.random.default_rng(4)
    prompts = {"a": rng.integers(0, len(tok), 21).tolist(), "b": rng.integers(0, len(tok), 6).tolist()}
    forced = {rid: rng.integers(0, len(tok), 2).tolist() for rid in prompts}
    ref = _run(_llm(path, "cpu"), prompts, forced)
    got = _run(_llm(path, "cpu:0,1"), prompts, forced)
    for step, (g, r) in enumerate(zip(got, ref)):
        scale = max(1.0, float(np.abs(r).max()))
        assert float(np.abs(g - r).max()) <= 1e-5 * scale, f"{family} step {step}"


@pytest.mark.parametrize("family,match", [
    ("phi3", "needs separate q/k/v and gate/up projections"),
    ("olmo2", "q/k norm over the whole projection"),
    ("mixtral", "mixture-of-experts"),
    ("deepseek_v2", "mixture-of-experts|not supported for this architecture"),
])
def test_families_that_do_not_split_yet_say_so_before_model_work(family, match, monkeypatch):
    from family_support import tiny_family

    path, _, _ = tiny_family(family)

    def boom(*a, **k):
        raise AssertionError("model work started")

    monkeypatch.setattr("max.nn.kv_cache.PagedKVCacheManager", boom)
    with pytest.raises(NotImplementedError, match=match):
        _llm(path, "cpu:0,1")
