"""Every decoder family against transformers on a tiny random checkpoint made with its own config class:
logits over a ragged prefill + 4 decode steps (alone and batched with another request), greedy
generation token for token, and every KV page freed afterwards."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from support import scheduled_greedy  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nn"))

pytest.importorskip("transformers")

from family_support import (  # noqa: E402
    FAMILIES,
    GGUF_FAMILIES,
    family_llm,
    hf_greedy,
    steps_against_hf,
    tiny_family,
    tiny_gguf,
)


def _steps(llm, model, prompts: dict[str, list[int]], n_decode: int = 4) -> None:
    """Run ``prompts`` together through the pipeline model; compare every step's logits with transformers."""
    mgr = steps_against_hf(llm, model, prompts, n_decode)
    assert mgr.num_free_pages == mgr.total_num_pages


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_prefill_and_decode_logits_match_transformers(family):
    d, model, tok = tiny_family(family)
    llm = family_llm(family)
    rng = np.random.default_rng(0)
    a = rng.integers(0, len(tok), 20).tolist()  # crosses a 16-token page
    b = rng.integers(0, len(tok), 7).tolist()
    _steps(llm, model, {"a": a})
    _steps(llm, model, {"a": a, "b": b})


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_16_tokens_identical_alone_and_batched(family):
    d, model, tok = tiny_family(family)
    llm = family_llm(family)
    prompts = ["def forward(self, x):", "import os"]

    def run(ps):
        return scheduled_greedy(llm, ps, 16)

    want = [hf_greedy(model, tok(p)["input_ids"], 16) for p in prompts]
    assert run(prompts[:1]) == want[:1]
    assert run(prompts) == want
    mgr = llm.pipeline.kv_managers[0]
    assert mgr.num_free_pages == mgr.total_num_pages


@pytest.mark.parametrize("family", sorted(GGUF_FAMILIES))
def test_gguf_copy_matches_transformers(family):
    """The family's llama.cpp-layout GGUF (float32) loads through the GGUF translation and adapter and
    gives the same logits as transformers on the original weights."""
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    path, model, tok = tiny_gguf(family)
    llm = LLM(PipelineConfig(model_path=path, max_length=128, max_batch_size=4, kv_cache_page_size=16))
    assert llm.pipeline_config.model_config.architectures == [type(model).__name__]
    rng = np.random.default_rng(1)
    _steps(llm, model, {"a": rng.integers(0, len(tok), 20).tolist(), "b": rng.integers(0, len(tok), 5).tolist()},
           n_decode=2)


def _unscaled_copy(model):
    """``model``'s weights with plain RoPE (what a loader that ignored the file's factor tensors would run)."""
    import copy

    import transformers

    cfg = copy.deepcopy(model.config)
    rp = cfg.rope_parameters
    cfg.rope_parameters = {"rope_type": "default", "rope_theta": rp["rope_theta"],
                           "partial_rotary_factor": rp.get("partial_rotary_factor", 1.0)}
    plain = transformers.AutoModelForCausalLM.from_config(cfg).eval().float()
    plain.load_state_dict(model.state_dict())
    return plain


# family -> (RoPE kind the file must read as, prompt lengths (both sides of the original context))
ROPE_TENSOR_GGUF = {"llama-rope-freqs": ("llama3", {"long": 70, "short": 9}),
                    "exaone4-rope-freqs": ("llama3", {"long": 70, "short": 9}),
                    "phi3-longrope": ("longrope", {"long": 23, "short": 5, "cross": 14})}


@pytest.mark.parametrize("family", sorted(ROPE_TENSOR_GGUF))
def test_gguf_rope_scaling_tensors_match_transformers(family):
    """RoPE scaling stored as tensors (Llama 3.1's rope_freqs, Phi-3 128k's rope_factors_long/short) applies:
    every step's logits equal transformers' on the original checkpoint, for prompts on both sides of the
    original context, and greedy tokens are identical; the same weights with plain RoPE differ (the file's
    factors matter)."""
    from family_support import hf_next_logits

    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    kind, lengths = ROPE_TENSOR_GGUF[family]
    path, model, tok = tiny_gguf(family)
    llm = LLM(PipelineConfig(model_path=path, max_length=128, max_batch_size=4, kv_cache_page_size=16))
    rng = np.random.default_rng(7)
    prompts = {k: rng.integers(0, len(tok), n).tolist() for k, n in lengths.items()}
    _steps(llm, model, prompts, n_decode=3)
    assert llm.pipeline.pipeline_model.config.rope_scaling["rope_type"] == kind
    seq = prompts["long"]
    ref, plain = hf_next_logits(model, seq), hf_next_logits(_unscaled_copy(model), seq)
    assert np.abs(ref - plain).max() > 1e-2 * (ref.max() - ref.min())
    texts = ["def forward(self, x): return x " * 6, "import os"]
    ids = [tok(t)["input_ids"] for t in texts]
    assert len(ids[0]) > model.config.rope_parameters["original_max_position_embeddings"]
    assert scheduled_greedy(llm, texts, 8) == [hf_greedy(model, i, 8) for i in ids]


def test_gguf_rope_freqs_without_a_llama3_match_apply_as_stored(tmp_path):
    """A rope_freqs tensor that is no llama3 scaling divides each pair's frequency by its factor, as llama.cpp
    does: logits equal transformers' Llama whose inverse frequencies are divided by the same factors."""
    import copy

    import torch
    from gguf_support import write_llama_gguf

    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    _, model, tok = tiny_family("llama")
    factors = np.random.default_rng(2).uniform(1.0, 6.0, 8).astype(np.float32)
    path = tmp_path / "tiny-freq-factors.gguf"
    write_llama_gguf(path, model, tok, lambda w, n, a, is_norm: w.add_tensor(n, a.astype(np.float32)),
                     extra_tensors={"rope_freqs.weight": factors})
    ref = copy.deepcopy(model)
    rot = ref.model.rotary_emb
    rot.inv_freq = rot.inv_freq / torch.from_numpy(factors)
    llm = LLM(PipelineConfig(model_path=str(path), max_length=128, max_batch_size=4, kv_cache_page_size=16))
    rng = np.random.default_rng(4)
    _steps(llm, ref, {"a": rng.integers(0, len(tok), 40).tolist(), "b": rng.integers(0, len(tok), 6).tolist()},
           n_decode=2)
    assert llm.pipeline.pipeline_model.config.rope_scaling["rope_type"] == "freq_factors"


def test_phi3_longrope_factors_follow_each_sequence_length():
    """``max_length`` (128) above ``original_max_position_embeddings`` (16): in one batch a short request
    (short factors throughout), a long one (long factors from its prefill) and one that crosses 16 while
    decoding (recomputed with the long factors, as transformers drops its cache there) -- every step's
    logits equal transformers' on the whole sequence."""
    d, model, tok = tiny_family("phi3-longrope-switch")
    llm = family_llm("phi3-longrope-switch")
    assert llm.pipeline.pipeline_model.max_seq_len > 16
    rng = np.random.default_rng(3)
    prompts = {"short": rng.integers(0, len(tok), 5).tolist(), "long": rng.integers(0, len(tok), 23).tolist(),
               "cross": rng.integers(0, len(tok), 14).tolist()}
    _steps(llm, model, prompts, n_decode=5)
    _steps(llm, model, {"cross": prompts["cross"]}, n_decode=4)  # alone, prefix pages of the batched run reused


def test_llama4_chunked_attention_across_chunks_with_chunked_prefill():
    """Llama 4 with attention_chunk_size 8: prompts of several chunks, in prefill pieces of 5 tokens (pieces
    straddle chunk boundaries), batched, then decode steps crossing further chunks -- every step's logits
    equal transformers' on the whole sequence; the RoPE layer's chunk mask matters (a model with a larger
    chunk differs)."""
    from family_support import hf_next_logits

    d, model, tok = tiny_family("llama4-chunked")
    llm = family_llm("llama4-chunked")
    # both layers (the chunked RoPE layer 0 too) read the paged cache with the native kernel on the CPU
    ops = [n.op for n in llm.pipeline.pipeline_model.model._prog.nodes]
    # (each fused with its layer's K/V write into one qkv_attention_native node)
    assert ops.count("qkv_attention_native") == model.config.num_hidden_layers == 2
    assert "ragged_attention" not in ops and "flash_attention_ragged" not in ops
    rng = np.random.default_rng(5)
    prompts = {"a": rng.integers(0, len(tok), 29).tolist(), "b": rng.integers(0, len(tok), 11).tolist()}
    mgr = steps_against_hf(llm, model, prompts, n_decode=6, chunk=5)
    assert mgr.num_free_pages == mgr.total_num_pages
    import copy

    full = copy.deepcopy(model)  # the same weights with global attention everywhere
    full.config.layer_types = ["full_attention"] * full.config.num_hidden_layers
    seq = prompts["a"]
    assert not np.allclose(hf_next_logits(model, seq), hf_next_logits(full, seq), atol=1e-3)


def test_phi3_longrope_speculative_steps_stay_on_one_side_of_the_original_context():
    """Transformers computes each token with the factors of its own length, so a verification step may
    not take a request across 16 (one step's rows share one set of factors): the draft budget stops at
    16, the crossing happens in a plain step (recomputed), and later verification steps are free."""
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    d, model, tok = tiny_family("phi3-longrope-switch")
    llm = LLM(PipelineConfig(model_path=d, max_length=128, max_batch_size=4, kv_cache_page_size=16,
                             speculative_method="ngram", num_speculative_tokens=3))
    budget = llm.pipeline._draft_budget

    class C:
        max_length = 128

        def __init__(self, end):
            self.end_idx = end

    assert [budget(C(e)) for e in (10, 13, 14, 15, 16, 17, 40)] == [3, 3, 2, 1, 0, 3, 3]


def test_phi3_longrope_with_the_ngram_draft_matches_transformers():
    """Generation with the n-gram draft across the original context (plain steps cross it, verification
    steps on either side): greedy output equals transformers'."""
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    d, model, tok = tiny_family("phi3-longrope-switch")
    llm = LLM(PipelineConfig(model_path=d, max_length=128, max_batch_size=4, kv_cache_page_size=16,
                             speculative_method="ngram", num_speculative_tokens=3, prompt_lookup_min=1,
                             prompt_lookup_max=2))
    prompts = ["x = x; x = x;", "a b a b a b", "1 2 1 2 1", "ab ab ab"]  # repeated tokens: early drafts
    assert all(len(tok(p)["input_ids"]) < 16 for p in prompts)  # they cross 16 while decoding
    want = [hf_greedy(model, tok(p)["input_ids"], 24) for p in prompts]
    assert scheduled_greedy(llm, prompts, 24) == want
    assert llm.pipeline.metrics.draft_tokens_proposed > 0


def test_llama4_default_max_length_is_capped():
    """Without --max-length, a Llama 4 whose context is 10M positions runs with 131072 (its RoPE table would
    take gigabytes); an explicit max_length is used as given."""
    from types import SimpleNamespace

    from max.pipelines.architectures.llama4.model import DEFAULT_MAX_LENGTH, Llama4Model

    hf = {**tiny_family("llama4")[1].config.to_dict(), "max_position_embeddings": 10_485_760}

    def cfg(max_length):
        return SimpleNamespace(max_length=max_length, model_config=SimpleNamespace(huggingface_config=hf))

    assert Llama4Model.calculate_max_seq_len(cfg(None), hf) == DEFAULT_MAX_LENGTH == 131072
    assert Llama4Model.calculate_max_seq_len(cfg(300_000), hf) == 300_000


def test_gemma4_variants_not_run_natively_fall_back_or_are_refused(tmp_path):
    """A Gemma 4 with bidirectional attention (``use_bidirectional_attention="all"``) runs through the
    transformers fallback (with its reason logged), and with ``hf_fallback=False`` is refused naming the
    feature."""
    import transformers

    from family_support import DIMS
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    _, _, tok = tiny_family("gemma4")
    cfg = transformers.Gemma4TextConfig(**DIMS, vocab_size=len(tok), head_dim=16, global_head_dim=32,
                                        hidden_size_per_layer_input=0, use_bidirectional_attention="all",
                                        layer_types=["sliding_attention", "full_attention"], sliding_window=8)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    from max.pipelines.lib.registry import PIPELINE_REGISTRY

    arch = PIPELINE_REGISTRY._require(PipelineConfig(model_path=str(tmp_path), max_length=64, max_batch_size=2))
    assert arch.pipeline_model.__name__ == "HFFallbackModel"
    with pytest.raises(NotImplementedError, match="bidirectional attention"):
        LLM(PipelineConfig(model_path=str(tmp_path), max_length=64, max_batch_size=2, hf_fallback=False))


def test_gemma4_kv_sharing_needs_a_source_layer_of_each_type():
    """KV sharing reads the last earlier non-shared layer of the same attention type; a config where a
    shared layer's type has no such layer (or every layer is shared) is a clear error at load."""
    from max.pipelines.architectures.gemma4.config import config_from_hf, kv_sources

    base = dict(num_hidden_layers=4, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                global_head_dim=32, vocab_size=100, intermediate_size=96, rms_norm_eps=1e-6, max_position_embeddings=64,
                layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"])
    assert kv_sources({**base, "num_kv_shared_layers": 2, "layer_types": ["sliding_attention", "full_attention"] * 2}) \
        == [0, 1, 0, 1]
    assert kv_sources({**base, "num_kv_shared_layers": 0}) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="none of the first 3 layers is full_attention"):
        config_from_hf({**base, "num_kv_shared_layers": 1})
    with pytest.raises(ValueError, match="must be below num_hidden_layers"):
        config_from_hf({**base, "num_kv_shared_layers": 4})


def test_gemma4_kv_shared_layers_hold_no_cache_pages():
    """The layers that reuse an earlier layer's keys and values (E2B's last ones) get no cache entries: the
    paged cache of the 4-layer ``gemma4-kvshare`` checkpoint (2 shared) holds 2 layers."""
    llm = family_llm("gemma4-kvshare")
    pm = llm.pipeline.pipeline_model
    assert tiny_family("gemma4-kvshare")[1].config.num_kv_shared_layers == 2
    assert pm.kv_manager.num_layers == 2
    assert int(pm.kv_manager.input_symbols()[0][0].shape[2]) == 2


def test_gemma4_moe_block_needs_its_sizes():
    """``enable_moe_block`` without usable expert counts / sizes is a clear error at load."""
    from max.pipelines.architectures.gemma4.config import config_from_hf

    base = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                global_head_dim=32, vocab_size=100, intermediate_size=96, rms_norm_eps=1e-6, max_position_embeddings=64,
                layer_types=["sliding_attention", "full_attention"], enable_moe_block=True, num_experts=4,
                top_k_experts=2, moe_intermediate_size=32)
    assert config_from_hf(base).extra["num_experts"] == 4
    for bad in (dict(top_k_experts=5), dict(num_experts=None), dict(moe_intermediate_size=0)):
        with pytest.raises(ValueError, match="enable_moe_block needs"):
            config_from_hf({**base, **bad})


@pytest.mark.parametrize("family", ["gemma4-kvshare", "gemma4-moe"])
def test_gemma4_chunked_prefill_matches_transformers(family):
    """Prompts prefilled in 8-token pieces (the shared layers read keys/values their source layer wrote in
    earlier steps), then decoded, batched: logits equal transformers' and every page is freed."""
    _, model, tok = tiny_family(family)
    rng = np.random.default_rng(3)
    prompts = {"a": rng.integers(0, len(tok), 30).tolist(), "b": rng.integers(0, len(tok), 12).tolist()}
    mgr = steps_against_hf(family_llm(family), model, prompts, 3, chunk=8)
    assert mgr.num_free_pages == mgr.total_num_pages
