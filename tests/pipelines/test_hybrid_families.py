"""Hybrid (recurrent-state) families against transformers on tiny random checkpoints made with their own
config classes: logits of a ragged prefill + decode steps alone and batched, the same prompt split into
chunks (chunked prefill carries the state), greedy tokens through the scheduler alone and batched, every
KV page and state slot freed; a prefix-cache hit restores the recurrent state from its snapshot (logits and
greedy tokens still those of transformers, alone and batched); LoRA refused."""

from __future__ import annotations

import functools
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from support import scheduled_greedy  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nn"))

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402

from family_support import assert_close, hf_greedy, hf_next_logits, steps_against_hf  # noqa: E402
from test_hf_utils import make_bpe_tokenizer  # noqa: E402
from test_kv_cache_context import FakeContext  # noqa: E402


def _randomize(model, *suffixes, std=0.5):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(suffixes):
                p.uniform_(-0.5, 0.5) if "norm" in name else p.normal_(0, std)


# test id -> (config from the shared token ids, tweak of the random model)
HYBRID = {
    # 2 groups of 2 heads, odd conv kernel, chunked scan crosses chunks of 8
    "mamba2": (lambda ids: transformers.Mamba2Config(
        **ids, hidden_size=32, num_heads=4, head_dim=16, n_groups=2, state_size=8, conv_kernel=3, expand=2,
        num_hidden_layers=2, chunk_size=8, initializer_range=0.2),
        lambda m: _randomize(m, "norm.weight", "norm_f.weight", "dt_bias", "conv1d.bias", "D")),
    # conv, attention (GQA 4/2, per-head q/k norms), conv; kernel 3
    "lfm2": (lambda ids: transformers.Lfm2Config(
        **ids, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, layer_types=["conv", "full_attention", "conv"],
        block_multiple_of=16, initializer_range=0.2),
        lambda m: _randomize(m, "norm.weight", "layernorm.weight")),
    # DeltaNet, DeltaNet, attention (GQA 4/2, gated output, partial RoPE); 2 key heads serve 4 value heads
    "qwen3_5": (lambda ids: transformers.Qwen3_5TextConfig(
        **ids, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, linear_conv_kernel_dim=3,
        linear_key_head_dim=8, linear_value_head_dim=12, linear_num_key_heads=2, linear_num_value_heads=4,
        layer_types=["linear_attention", "linear_attention", "full_attention"], initializer_range=0.2),
        lambda m: _randomize(m, "norm.weight", "layernorm.weight", "dt_bias")),
    # attention, DeltaNet (fused q|k|v|z layout), DeltaNet; layer 0 dense, 1-2 top-2 of 4 experts + shared
    "qwen3_next": (lambda ids: transformers.Qwen3NextConfig(
        **ids, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, linear_conv_kernel_dim=4,
        linear_key_head_dim=8, linear_value_head_dim=12, linear_num_key_heads=2, linear_num_value_heads=4,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        mlp_only_layers=[0], layer_types=["full_attention", "linear_attention", "linear_attention"],
        initializer_range=0.2),
        lambda m: _randomize(m, "norm.weight", "layernorm.weight", "dt_bias")),
    # mamba, attention (RoPE, GQA), mamba; top-2 of 4 experts + shared MLP; Granite multipliers
    "granitemoehybrid": (lambda ids: transformers.GraniteMoeHybridConfig(
        **ids, hidden_size=64, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, num_local_experts=4, num_experts_per_tok=2,
        shared_intermediate_size=48, layer_types=["mamba", "attention", "mamba"], mamba_n_heads=4,
        mamba_n_groups=2, mamba_d_state=8, mamba_d_conv=3, mamba_expand=2, mamba_chunk_size=8,
        position_embedding_type="rope", embedding_multiplier=2.0, residual_multiplier=0.5,
        attention_multiplier=0.2, logits_scaling=3.0, initializer_range=0.2),
        lambda m: _randomize(m, "norm.weight", "layernorm.weight", "dt_bias", "conv1d.bias", "D")),
    # parallel Mamba-2 + attention in each layer, every µP multiplier away from 1, gated-norm variant
    "falcon_h1": (lambda ids: transformers.FalconH1Config(
        **ids, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, mamba_d_ssm=96, mamba_n_heads=4, mamba_n_groups=2,
        mamba_d_state=8, mamba_d_conv=3, mamba_chunk_size=8, mamba_rms_norm=True, mamba_norm_before_gate=True,
        embedding_multiplier=1.5, lm_head_multiplier=0.5, mlp_multipliers=[0.7, 1.3], key_multiplier=0.8,
        attention_in_multiplier=1.2, attention_out_multiplier=0.9, ssm_multipliers=[0.5, 1.5, 0.8, 1.2, 0.9],
        ssm_in_multiplier=1.1, ssm_out_multiplier=0.6, initializer_range=0.2),
        lambda m: _randomize(m, "norm.weight", "layernorm.weight", "dt_bias", "conv1d.bias", "D")),
}


@functools.lru_cache(maxsize=None)
def tiny(name: str):
    make, tweak = HYBRID[name]
    tok = transformers.AutoTokenizer.from_pretrained(make_bpe_tokenizer())
    cfg = make(dict(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                    pad_token_id=tok.pad_token_id))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval().float()
    if tweak is not None:
        tweak(model)
    d = tempfile.mkdtemp(prefix=f"libremax-hybrid-{name}-")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d, model, tok


@functools.lru_cache(maxsize=None)
def llm_of(name: str, prefix_caching: bool = True):
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    d, _, _ = tiny(name)
    return LLM(PipelineConfig(model_path=d, max_length=128, max_batch_size=4, kv_cache_page_size=16,
                              enable_prefix_caching=prefix_caching))


def _free(mgr) -> None:
    assert mgr.num_free_pages == mgr.total_num_pages
    assert mgr.state_slots_used == 0
    mgr.check_invariants()


def _steps(llm, model, prompts: dict, n_decode: int = 3, chunk: int | None = None) -> None:
    """Run ``prompts`` together (prompts in pieces of ``chunk`` tokens: chunked prefill), then decode;
    every step's last-token logits against transformers."""
    _free(steps_against_hf(llm, model, prompts, n_decode, chunk))


@pytest.mark.parametrize("family", sorted(HYBRID))
def test_logits_alone_batched_and_chunked(family):
    _, model, tok = tiny(family)
    llm = llm_of(family)
    rng = np.random.default_rng(0)
    a = rng.integers(0, len(tok), 21).tolist()
    b = rng.integers(0, len(tok), 6).tolist()
    _steps(llm, model, {"a": a}, n_decode=2)
    _steps(llm, model, {"a": a, "b": b}, n_decode=2)
    _steps(llm, model, {"a": a, "b": b}, n_decode=1, chunk=5)


@pytest.mark.parametrize("family", sorted(HYBRID))
def test_greedy_alone_batched_and_with_prefix_cache_hits(family):
    _, model, tok = tiny(family)
    llm = llm_of(family)
    mgr = llm.pipeline.kv_managers[0]
    mgr.reset_prefix_cache()
    assert mgr.params.enable_prefix_caching and mgr.state_snapshots_total == 4
    assert "prefix-cache snapshots" in mgr.describe()
    prompts = ["def forward(self, x): return x + 1; " * 2, "import os"]
    ids = [tok(p)["input_ids"] for p in prompts]
    assert len(ids[0]) > 16 and len(ids[0]) % 16  # its prompt step ends at a page boundary: a snapshot there
    want = [hf_greedy(model, i, 8) for i in ids]
    hits, restores = mgr.prefix_cache_hit_tokens, mgr.state_snapshot_restores
    assert scheduled_greedy(llm, prompts[:1], 8) == want[:1]
    assert mgr.prefix_cache_hit_tokens == hits and mgr.state_snapshots_used >= 1
    # the same prompt again, batched with another: its pages and state come from the cache
    assert scheduled_greedy(llm, prompts, 8) == want
    hits = mgr.prefix_cache_hit_tokens
    assert hits >= 16 and mgr.state_snapshot_restores == restores + 1
    # a longer prompt sharing the first one's prefix, alone and beside a second sharing it too
    longer = [prompts[0] + "import sys", prompts[0] + "y = 2"]
    want2 = [hf_greedy(model, tok(p)["input_ids"], 8) for p in longer]
    assert scheduled_greedy(llm, longer[:1], 8) == want2[:1]
    assert scheduled_greedy(llm, longer, 8) == want2
    assert mgr.prefix_cache_hit_tokens >= hits + 3 * 16 and mgr.state_snapshot_restores == restores + 4
    _free(mgr)
    mgr.reset_prefix_cache()
    assert mgr.state_snapshots_used == 0


@pytest.mark.parametrize("family", ["granitemoehybrid", "lfm2", "mamba2", "qwen3_5"])
def test_logits_after_a_prefix_cache_hit(family):
    """A prompt whose first page the cache holds (with the state snapshot at its end) gives every step's
    logits of transformers, alone and batched."""
    _, model, tok = tiny(family)
    llm = llm_of(family)
    mgr = llm.pipeline.kv_managers[0]
    mgr.reset_prefix_cache()
    rng = np.random.default_rng(1)
    a = rng.integers(0, len(tok), 21).tolist()
    b = rng.integers(0, len(tok), 6).tolist()
    hits, restores = mgr.prefix_cache_hit_tokens, mgr.state_snapshot_restores
    _steps(llm, model, {"a": a}, n_decode=1, chunk=16)  # the state passes position 16: a snapshot
    assert mgr.state_snapshots_used == 1 and mgr.prefix_cache_hit_tokens == hits
    _steps(llm, model, {"a2": a[:18] + b}, n_decode=2)
    assert mgr.prefix_cache_hit_tokens == hits + 16
    _steps(llm, model, {"b": b, "a3": a + b}, n_decode=2)
    assert mgr.prefix_cache_hit_tokens == hits + 32 and mgr.state_snapshot_restores == restores + 2
    mgr.reset_prefix_cache()


def test_scheduler_chunked_prefill_and_soak_leave_no_slot_in_use():
    """Prompts longer than the scheduler's prefill chunk are fed in pieces (the state carries over); 200
    short requests through a batch of 4 leave every slot and page free."""
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    d, model, tok = tiny("lfm2")
    llm = LLM(PipelineConfig(model_path=d, max_length=128, max_batch_size=4, kv_cache_page_size=16,
                             prefill_chunk_size=8))
    prompts = ["def forward(self, x): return x + 1; " * 2, "import os"]
    assert scheduled_greedy(llm, prompts, 6) == [hf_greedy(model, tok(p)["input_ids"], 6) for p in prompts]
    rng = np.random.default_rng(5)
    words = ["a", "b", "x", "def", "os", "self", "1", "+"]
    soak = [" ".join(rng.choice(words, int(rng.integers(1, 12)))) for _ in range(200)]
    out = scheduled_greedy(llm, soak, 2)
    assert all(len(o) == 2 for o in out)
    assert out[0] == scheduled_greedy(llm, soak[:1], 2)[0]
    _free(llm.pipeline.kv_managers[0])


def test_tensor_parallel_lora_and_speculative_refused_before_model_work(monkeypatch):
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    d, _, _ = tiny("lfm2")

    def boom(*a, **k):
        raise AssertionError("model work started")

    monkeypatch.setattr("max.nn.kv_cache.HybridKVCacheManager", boom)
    with pytest.raises(NotImplementedError, match="tensor parallelism is not supported"):
        LLM(PipelineConfig(model_path=d, devices="cpu:0,1", max_length=128, max_batch_size=4))
    with pytest.raises(NotImplementedError, match="LoRA adapters are not supported for models with recurrent"):
        LLM(PipelineConfig(model_path=d, max_length=128, max_batch_size=4, enable_lora=True, max_lora_rank=8,
                           max_num_loras=1))
    with pytest.raises(NotImplementedError, match="speculative decoding is not supported"):
        LLM(PipelineConfig(model_path=d, max_length=128, max_batch_size=4, draft_model_path=d))


def test_echo_logits_of_every_prompt_position():
    """``enable_echo``: the logits of every position of a ragged batch, against transformers."""
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    d, model, tok = tiny("qwen3_5")
    llm = LLM(PipelineConfig(model_path=d, max_length=128, max_batch_size=4, kv_cache_page_size=16,
                             enable_echo=True))
    pm = llm.pipeline.pipeline_model
    mgr = pm.kv_manager
    rng = np.random.default_rng(2)
    prompts = {"a": rng.integers(0, len(tok), 9).tolist(), "b": rng.integers(0, len(tok), 4).tolist()}
    ctxs = [FakeContext(r, p) for r, p in prompts.items()]
    for c in ctxs:
        mgr.claim(c.request_id)
    logits = pm.execute(pm.prepare_initial_token_inputs(ctxs, mgr.fetch(ctxs))).logits.numpy()
    for c in ctxs:
        mgr.release(c.request_id)
    assert logits.shape[0] == 13
    with torch.no_grad():
        ref = np.concatenate([model(torch.tensor([p])).logits[0].double().numpy() for p in prompts.values()])
    for i in range(13):
        assert_close(logits[i], ref[i], f"position {i}")
    _free(mgr)


@pytest.mark.parametrize("family", ["mamba2", "qwen3_5"])
def test_bfloat16_weights_stay_close_to_float32_transformers(family):
    """bfloat16 compute (state kept in float32): prefill + 2 decode steps within 2% of the logit range."""
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    d, model, tok = tiny(family)
    llm = LLM(PipelineConfig(model_path=d, max_length=128, max_batch_size=4, kv_cache_page_size=16,
                             quantization_encoding="bfloat16",
                             allow_safetensors_weights_fp32_bf6_bidirectional_cast=True))
    pm = llm.pipeline.pipeline_model
    mgr = pm.kv_manager
    p = np.random.default_rng(0).integers(0, len(tok), 21).tolist()
    c = FakeContext("a", p)
    mgr.claim("a")
    try:
        for step in range(3):
            lg = pm.execute(pm.prepare_initial_token_inputs([c], mgr.fetch([c]))).logits.numpy()[0]
            ref = hf_next_logits(model, p)
            assert np.abs(lg - ref).max() <= 2e-2 * (ref.max() - ref.min()), f"step {step}"
            t = int(np.argmax(ref))
            p.append(t)
            c.tokens[c.end_idx] = t
            c.bump_token_indices(start_idx=c.active_idx - c.start_idx, active_idx=1, end_idx=1)
    finally:
        mgr.release("a")
    _free(mgr)


_LFM2_GGUF = {"operator_norm": "attn_norm", "ffn_norm": "ffn_norm", "feed_forward.w1": "ffn_gate",
              "feed_forward.w3": "ffn_up", "feed_forward.w2": "ffn_down", "conv.conv": "shortconv.conv",
              "conv.in_proj": "shortconv.in_proj", "conv.out_proj": "shortconv.out_proj",
              "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.out_proj": "attn_output", "self_attn.q_layernorm": "attn_q_norm",
              "self_attn.k_layernorm": "attn_k_norm"}


def _gguf_tokenizer(w, tok) -> None:
    """The test tokenizer as llama.cpp's ``gpt2`` (byte-level BPE) tokenizer metadata."""
    import json

    tj = json.loads(tok.backend_tokenizer.to_str())
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in sorted(tj["model"]["vocab"].items(), key=lambda kv: kv[1])])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
    w.add_bos_token_id(tok.bos_token_id)
    w.add_eos_token_id(tok.eos_token_id)


def _write_gguf(w, path) -> str:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_lfm2_gguf_copy_matches_transformers(tmp_path):
    """The tiny LFM2 written as llama.cpp's converter names it (``shortconv.*`` with ``[hidden, L]`` conv
    weights, per-layer ``head_count_kv`` marking the attention layers, ``token_embd_norm``) loads through
    the GGUF translation and gives transformers' logits."""

    gguf = pytest.importorskip("gguf")
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig
    from max.pipelines.architectures.lfm2.config import ffn_size

    _, model, tok = tiny("lfm2")
    cfg = model.config
    path = str(tmp_path / "tiny-lfm2.gguf")
    w = gguf.GGUFWriter(path, "lfm2")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(ffn_size(cfg.to_dict()))
    w.add_head_count(cfg.num_attention_heads)
    w.add_array("lfm2.attention.head_count_kv",
                [cfg.num_key_value_heads if t == "full_attention" else 0 for t in cfg.layer_types])
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_uint32("lfm2.shortconv.l_cache", cfg.conv_L_cache)
    _gguf_tokenizer(w, tok)
    for k, v in model.state_dict().items():
        a = v.detach().float().numpy().copy()
        if k == "lm_head.weight":
            continue  # tied
        if k == "model.embed_tokens.weight":
            name = "token_embd.weight"
        elif k == "model.embedding_norm.weight":
            name = "token_embd_norm.weight"
        else:
            _, _, i, rest = k.split(".", 3)
            mod, leaf = rest.rsplit(".", 1)
            name = f"blk.{i}.{_LFM2_GGUF[mod]}.{leaf}"
            if mod == "conv.conv":
                a = a.squeeze(1)
        w.add_tensor(name, a.astype(np.float32))
    llm = LLM(PipelineConfig(model_path=_write_gguf(w, path), max_length=128, max_batch_size=4,
                             kv_cache_page_size=16))
    assert llm.pipeline_config.model_config.architectures == ["Lfm2ForCausalLM"]
    rng = np.random.default_rng(1)
    _steps(llm, model, {"a": rng.integers(0, len(tok), 20).tolist(), "b": rng.integers(0, len(tok), 5).tolist()},
           n_decode=2)
