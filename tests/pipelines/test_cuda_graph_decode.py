"""CUDA-graph decode steps (``max.pipelines.lib.cuda_graph_decode``): buckets, static staging, padding
rows on the scratch page, capture once per key, greedy ids from the device, and no host reads inside a
captured step.  On the CPU the capture backend is ``EagerReplay`` (same bookkeeping, no CUDA); the
``gpu`` test runs the real ``torch.cuda.CUDAGraph`` capture."""

from __future__ import annotations

import collections
import sys
import os

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

from max.pipelines.lib.cuda_graph_decode import (  # noqa: E402
    DecodeGraphs,
    EagerReplay,
    bucket_for,
    buckets_upto,
    decode_graphs_for,
    plain_greedy,
)

HOST_READS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::item"}


class HostReads(TorchDispatchMode):
    """Counts the ops that read a tensor's values back to the host (a CUDA sync, not capturable)."""

    def __init__(self) -> None:
        super().__init__()
        self.hits: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = func._schema.name
        if name in HOST_READS or (name == "aten::repeat_interleave.Tensor"
                                  and (kwargs or {}).get("output_size") is None):
            self.hits[name] += 1
        return func(*args, **(kwargs or {}))


def test_buckets():
    assert buckets_upto(1) == [1]
    assert buckets_upto(16) == [1, 2, 4, 8, 16]
    assert buckets_upto(48) == [1, 2, 4, 8, 16, 32, 48]
    assert [bucket_for(n, [1, 2, 4, 8]) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, None]
    with pytest.raises(ValueError):
        buckets_upto(0)
    with pytest.raises(ValueError):
        bucket_for(0, [1])


@pytest.fixture(scope="module")
def torch_kernels():
    """The torch kernels a GPU runs (no native CPU kernels, so no native lowering)."""
    from max.engine import backend

    backend.use(backend.BackendPolicy(native=False, isa=None))
    yield
    backend.use(None)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from lm_support import make_tiny_llama

    return make_tiny_llama(str(tmp_path_factory.mktemp("cg")), max_position_embeddings=1024)


def _llm(path: str, graphs: bool):
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    llm = LLM(PipelineConfig(model_path=path, max_length=512, max_batch_size=8, kv_cache_page_size=16, devices="cpu"))
    pm = llm.pipeline.pipeline_model
    assert pm.decode_graphs is None  # the CPU never gets them on its own
    if graphs:
        pm.decode_graphs = decode_graphs_for(pm, backend=EagerReplay())
    return llm


PROMPTS = ["def main():", "import os", "the quick brown fox jumps over", "x"]


def test_greedy_decode_matches_eager_engine(torch_kernels, tiny_dir, monkeypatch):
    ref = _llm(tiny_dir, graphs=False).generate(PROMPTS, max_new_tokens=40, use_tqdm=False)
    llm = _llm(tiny_dir, graphs=True)
    graphs = llm.pipeline.pipeline_model.decode_graphs
    mgr = llm.pipeline.pipeline_model.kv_manager
    assert mgr.pool.refcount[graphs.scratch_page] == 1  # held by the graphs for good
    from max.pipelines.lib import sampling

    calls = collections.Counter()
    real = sampling.sampling.sample_for_contexts

    def counting(*a, **k):  # noqa: ANN002, ANN003
        calls["sampled"] += 1
        return real(*a, **k)

    monkeypatch.setattr(sampling.sampling, "sample_for_contexts", counting)
    got = llm.generate(PROMPTS, max_new_tokens=40, use_tqdm=False)
    assert got == ref
    # 4 requests: batch bucket 4; prompts + 40 tokens span 1..4 pages of 16 -> page buckets 1, 2, 4
    assert graphs.keys and all(b == 4 for b, _ in graphs.keys), graphs.keys
    assert {p for _, p in graphs.keys} <= {1, 2, 4}
    assert graphs.captures == len(graphs.keys)
    assert graphs.replays >= 39  # every decode step after each prompt's first token
    assert calls["sampled"] <= 2  # the prefill steps; every decode step took the device's argmax
    assert mgr.pool.refcount[graphs.scratch_page] == 1
    mgr.check_invariants()  # the scratch page is the manager's own (reserve_page)


def test_odd_batches_pad_on_the_scratch_page(torch_kernels, tiny_dir):
    """3 and 5 requests run in buckets 4 and 8: the padding rows write only the scratch page."""
    llm = _llm(tiny_dir, graphs=True)
    pm = llm.pipeline.pipeline_model
    graphs, mgr = pm.decode_graphs, pm.kv_manager
    blocks = mgr.device_buffers[0]._torch()
    for prompts in (PROMPTS[:3], PROMPTS + ["y"]):
        ref = _llm(tiny_dir, graphs=False).generate(prompts, max_new_tokens=6, use_tqdm=False)
        before = blocks[graphs.scratch_page].clone()
        assert llm.generate(prompts, max_new_tokens=6, use_tqdm=False) == ref
        assert not torch.equal(before, blocks[graphs.scratch_page]) or graphs.replays == 0
    assert {4, 8} <= {b for b, _ in graphs.keys}


def test_captured_step_reads_nothing_back(torch_kernels, tiny_dir, monkeypatch):
    """Inside ``static_decode`` the step graph makes no host reads (what CUDA graph capture needs); the
    general ragged path does (the reason for the static mode).  The native library is hidden, so the K/V
    store runs the torch code a GPU runs."""
    from max.engine import native

    monkeypatch.setattr(native, "lib", lambda: None)
    llm = _llm(tiny_dir, graphs=True)
    pm = llm.pipeline.pipeline_model
    graphs = pm.decode_graphs
    mgr = pm.kv_manager
    llm.generate(PROMPTS[:2], max_new_tokens=2, use_tqdm=False)  # nothing pinned afterwards
    from max.interfaces import SamplingParams

    ctxs = [llm.make_context(p, SamplingParams(top_k=1, max_new_tokens=4)) for p in PROMPTS[:2]]
    for c in ctxs:
        mgr.external_claim(c.request_id)
    llm.pipeline.execute(_inputs(ctxs))  # prefill
    kv = mgr.fetch(ctxs, 1)
    mi = pm.prepare_initial_token_inputs(ctxs, kv)
    assert getattr(mi, "decode_rows", None) is not None
    graphs.run(*mi.decode_rows)  # captures (2, 1) outside the counter
    reads = HostReads()
    with reads:
        logits, ids = graphs.run(*mi.decode_rows)
    assert sum(reads.hits.values()) == 0, dict(reads.hits)
    eager = HostReads()
    with eager:
        (ref,) = pm.run_graph(mi)
    assert sum(eager.hits.values()) > 0
    torch.testing.assert_close(logits, ref._torch(), rtol=1e-5, atol=1e-5)
    assert torch.equal(ids, torch.argmax(ref._torch(), -1))
    for c in ctxs:
        llm.pipeline.release(c.request_id)


def _inputs(ctxs):
    from max.interfaces import TextGenerationInputs

    return TextGenerationInputs([{c.request_id: c for c in ctxs}], num_steps=1)


def test_run_checks_and_falls_back(torch_kernels, tiny_dir):
    llm = _llm(tiny_dir, graphs=True)
    g = llm.pipeline.pipeline_model.decode_graphs
    assert g.key_for(8, g.page_buckets[-1]) == (8, g.page_buckets[-1])
    assert g.key_for(9, 1) is None and g.key_for(1, g.page_buckets[-1] + 1) is None
    with pytest.raises(ValueError, match="holds 1 page"):
        g.run([1], [16], [[0]])  # position 16 needs a second page of 16
    with pytest.raises(ValueError):
        g.run([1, 2], [0], [[0]])
    assert g.run(list(range(9)), [0] * 9, [[0]] * 9) is None  # beyond the largest batch bucket
    with pytest.raises(ValueError, match="CUDA"):
        DecodeGraphs(g.model, g.blocks, 16, 8, 4, 0)


def test_failed_capture_turns_the_graphs_off(torch_kernels, tiny_dir):
    """A step that cannot be captured runs eagerly from then on, with the reason kept."""
    llm = _llm(tiny_dir, graphs=True)
    g = llm.pipeline.pipeline_model.decode_graphs

    class Broken(EagerReplay):
        def capture(self, fn):
            raise RuntimeError("operation not permitted when stream is capturing")

    g.backend = Broken()
    ref = _llm(tiny_dir, graphs=False).generate(PROMPTS[:2], max_new_tokens=5, use_tqdm=False)
    assert llm.generate(PROMPTS[:2], max_new_tokens=5, use_tqdm=False) == ref
    assert "stream is capturing" in g.disabled and g.replays == 0 and g.captures == 0


def test_plain_greedy():
    from max.interfaces import SamplingParams

    class Ctx:
        def __init__(self, **kw):
            self.sampling_params = SamplingParams(**kw)
            self.matcher = None
            self.log_probabilities = 0

        def get_min_token_logit_mask(self, n):
            return [np.zeros((0, 2), np.int32)]

    assert plain_greedy(Ctx(top_k=1))
    assert plain_greedy(Ctx(temperature=0.0))
    assert not plain_greedy(Ctx(top_k=5, temperature=0.7))
    assert not plain_greedy(Ctx(top_k=1, repetition_penalty=1.2))
    assert not plain_greedy(Ctx(top_k=1, logit_bias={3: 1.0}))
    c = Ctx(top_k=1)
    c.log_probabilities = 2
    assert not plain_greedy(c)


@pytest.mark.gpu
def test_cuda_graph_decode_on_gpu(tiny_dir):
    """On a CUDA device the model captures its decode steps by itself and matches the eager engine."""
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    def run(graphs: bool):
        os.environ["LIBREMAX_CUDA_GRAPHS"] = "1" if graphs else "0"
        try:
            llm = LLM(PipelineConfig(model_path=tiny_dir, max_length=512, max_batch_size=8, kv_cache_page_size=16,
                                     devices="gpu", quantization_encoding="float32"))
            return llm, llm.generate(PROMPTS, max_new_tokens=24, use_tqdm=False)
        finally:
            os.environ.pop("LIBREMAX_CUDA_GRAPHS", None)

    _, ref = run(False)
    llm, got = run(True)
    graphs = llm.pipeline.pipeline_model.decode_graphs
    assert graphs is not None and graphs.disabled is None, graphs.disabled
    assert graphs.captures >= 1 and graphs.replays >= 20
    assert got == ref
