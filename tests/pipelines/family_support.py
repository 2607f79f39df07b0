"""Shared harness for the per-family tests: a tiny random checkpoint made with transformers' own config
class, loaded through the real pipeline (PipelineConfig -> registry -> family folder), and compared with
transformers on the same weights.

``FAMILIES`` maps a test id to a function returning the family's transformers config for the shared
tiny dimensions; ``tweak`` functions make rarely-non-zero parameters (biases, norm weights) matter.
"""

from __future__ import annotations

import functools
import os
import tempfile
from typing import Any, Callable, Optional

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

from test_hf_utils import make_bpe_tokenizer  # noqa: E402

DIMS = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=256, initializer_range=0.2)


def _randomize(model: Any, *suffixes: str, std: float = 0.5) -> None:
    """Give every parameter whose name ends with one of ``suffixes`` random values (biases, norms...)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(suffixes):
                p.normal_(0, std) if not name.endswith("norm.weight") else p.uniform_(-0.5, 0.5)


def _randomize_buffers(model: Any, *suffixes: str, std: float = 0.5) -> None:
    """Random values for the buffers (saved with the weights) whose names end with one of ``suffixes``."""
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith(suffixes):
                b.normal_(0, std)


FamilySpec = tuple[Callable[[dict], Any], Callable[[Any], None] | None]

FAMILIES: dict[str, FamilySpec] = {
    "llama": (lambda d: transformers.LlamaConfig(**d, tie_word_embeddings=False), None),
    "mistral": (lambda d: transformers.MistralConfig(**d, sliding_window=8, tie_word_embeddings=False), None),
    "qwen2": (lambda d: transformers.Qwen2Config(**d, tie_word_embeddings=True),
              lambda m: _randomize(m, "q_proj.bias", "k_proj.bias", "v_proj.bias")),
    "qwen3": (lambda d: transformers.Qwen3Config(**d, head_dim=32, tie_word_embeddings=True),
              lambda m: _randomize(m, "q_norm.weight", "k_norm.weight")),
    # sliding + global layer, each with its own RoPE (global one linearly scaled), final soft-capping
    "gemma3": (lambda d: transformers.Gemma3TextConfig(
        **d, head_dim=32, query_pre_attn_scalar=24, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"], final_logit_softcapping=3.0,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
               lambda m: _randomize(m, "norm.weight", "layernorm.weight")),
    "phi3": (lambda d: transformers.Phi3Config(**d, tie_word_embeddings=False), None),
    # Phi-4-mini-style: half of each head rotates, LongRoPE (short factors: max_length 128 <= 128)
    "phi3-longrope": (lambda d: transformers.Phi3Config(**d, original_max_position_embeddings=128, rope_parameters=dict(
        rope_type="longrope", rope_theta=1e4, partial_rotary_factor=0.5, original_max_position_embeddings=128,
        short_factor=[1.0, 1.5, 2.0, 4.0], long_factor=[2.0, 3.0, 5.0, 9.0])), None),
    # LongRoPE with max_length 128 above the original context 16: factors per sequence by its length
    "phi3-longrope-switch": (lambda d: transformers.Phi3Config(
        **d, original_max_position_embeddings=16, rope_parameters=dict(
        rope_type="longrope", rope_theta=1e4, partial_rotary_factor=0.5, original_max_position_embeddings=16,
        short_factor=[1.0, 1.5, 2.0, 4.0], long_factor=[2.0, 3.0, 5.0, 9.0])), None),
    "granite": (lambda d: transformers.GraniteConfig(**d, embedding_multiplier=3.0, residual_multiplier=0.5,
                                                     attention_multiplier=0.1, logits_scaling=4.0), None),
    "olmo2": (lambda d: transformers.Olmo2Config(**d), lambda m: _randomize(m, "norm.weight", "layernorm.weight")),
    "gpt_oss": (lambda d: transformers.GptOssConfig(**d, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                                    sliding_window=8, attn_implementation="eager"),
                lambda m: _randomize(m, "sinks", "_bias", ".bias", std=1.0)),
    # MLA (q_lora, YaRN with mscale), MoE with shared experts and group-limited routing; layer 0 dense
    "deepseek_v2": (lambda d: transformers.DeepseekV2Config(
        **{**d, "num_key_value_heads": 4}, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, qk_nope_head_dim=16,
        v_head_dim=12, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
        first_k_dense_replace=1, topk_method="group_limited_greedy", n_group=2, topk_group=1,
        routed_scaling_factor=1.5, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                    "original_max_position_embeddings": 64, "mscale": 0.707,
                                                    "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1}),
        lambda m: _randomize(m, "layernorm.weight")),
    "mixtral": (lambda d: transformers.MixtralConfig(**d, num_local_experts=4, num_experts_per_tok=2), None),
    # layer 0 dense (mlp_only_layers), layer 1 experts with renormalised top-2 weights
    "qwen3_moe": (lambda d: transformers.Qwen3MoeConfig(**d, head_dim=16, num_experts=4, num_experts_per_tok=2,
                                                         moe_intermediate_size=32, norm_topk_prob=True,
                                                         mlp_only_layers=[0]), None),
    # weightless LayerNorms, q/k/v clamped
    "olmo": (lambda d: transformers.OlmoConfig(**d, clip_qkv=0.3), None),
    # sliding layer with its own RoPE base, global layer with YaRN
    "olmo3": (lambda d: transformers.Olmo3Config(
        **d, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "yarn", "rope_theta": 5e5, "factor": 2.0,
                                            "original_max_position_embeddings": 128},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
              lambda m: _randomize(m, "norm.weight", "layernorm.weight")),
    # layer 1 is NoPE
    "smollm3": (lambda d: transformers.SmolLM3Config(**d, no_rope_layers=[1, 0]), None),
    "glm4": (lambda d: transformers.Glm4Config(**d, head_dim=16),
             lambda m: _randomize(m, "_proj.bias", "layernorm.weight")),
    # sliding layer with RoPE, global NoPE layer, per-head q/k norms
    "exaone4": (lambda d: transformers.Exaone4Config(**d, sliding_window=8,
                                                     layer_types=["sliding_attention", "full_attention"]),
                lambda m: _randomize(m, "norm.weight", "layernorm.weight")),
    # MLA as V2 (interleaved RoPE, YaRN); sigmoid routing with correction bias, 2 groups of 2, best group only
    "deepseek_v3": (lambda d: transformers.DeepseekV3Config(
        **{**d, "num_key_value_heads": 4}, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, qk_nope_head_dim=16,
        v_head_dim=12, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
        first_k_dense_replace=1, n_group=2, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64, "mscale": 0.707, "mscale_all_dim": 0.707,
                         "beta_fast": 32, "beta_slow": 1}),
        lambda m: (_randomize(m, "layernorm.weight", "mlp.gate.weight"),
                   _randomize_buffers(m, "e_score_correction_bias", std=0.3))),
    # layer 0: RoPE (Llama 3 scaled), L2 q/k norm, dense MLP; layer 1: NoPE with temperature tuning, top-1 MoE
    # + shared expert (floor_scale 4: the temperature changes within the test's lengths)
    "llama4": (lambda d: transformers.Llama4TextConfig(
        **{**d, "intermediate_size": 48}, head_dim=16, intermediate_size_mlp=96, num_local_experts=4,
        num_experts_per_tok=1, interleave_moe_layer_step=2, no_rope_layers=[1, 0], attention_chunk_size=192,
        floor_scale=4, attn_scale=0.5, rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
                                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                        "original_max_position_embeddings": 64}),
        lambda m: _randomize(m, "layernorm.weight", "router.weight")),
    # chunked local attention in chunks of 8 on the RoPE layer 0 (NoPE layer 1 global): prompts cross chunks
    "llama4-chunked": (lambda d: transformers.Llama4TextConfig(
        **{**d, "intermediate_size": 48}, head_dim=16, intermediate_size_mlp=96, num_local_experts=4,
        num_experts_per_tok=1, interleave_moe_layer_step=2, no_rope_layers=[1, 0], attention_chunk_size=8,
        floor_scale=4, attn_scale=0.5, rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
        lambda m: _randomize(m, "layernorm.weight", "router.weight")),
    # sliding layer (head 16, 2 KV heads, RoPE 1e4) and global layer (head 32, 1 KV head whose keys are the
    # values, proportional RoPE on a quarter of the head); q/k/v norms, layer scalars, final soft-capping
    "gemma4": (lambda d: transformers.Gemma4TextConfig(
        **d, head_dim=16, global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
        hidden_size_per_layer_input=0, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
        final_logit_softcapping=3.0),
               lambda m: (_randomize(m, "norm.weight", "layernorm.weight"),
                          _randomize_buffers(m, "layer_scalar", std=0.5))),
    # Gemma 4 E2B/E4B-style per-layer input embeddings (a smaller per-layer vocabulary table than the main one)
    "gemma4-ple": (lambda d: transformers.Gemma4TextConfig(
        **d, head_dim=16, global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
        hidden_size_per_layer_input=8, vocab_size_per_layer_input=d["vocab_size"], sliding_window=8,
        layer_types=["sliding_attention", "full_attention"], final_logit_softcapping=3.0),
                   lambda m: (_randomize(m, "norm.weight", "layernorm.weight"),
                              _randomize_buffers(m, "layer_scalar", std=0.5))),
    # E2B's layout: per-layer inputs, the last two layers reuse the keys/values of the first two (one per
    # attention type) and have double-width MLPs
    "gemma4-kvshare": (lambda d: transformers.Gemma4TextConfig(
        **{**d, "num_hidden_layers": 4}, head_dim=16, global_head_dim=32, hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=d["vocab_size"], sliding_window=8, num_kv_shared_layers=2,
        use_double_wide_mlp=True, final_logit_softcapping=3.0,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"]),
                       lambda m: (_randomize(m, "norm.weight", "layernorm.weight"),
                                  _randomize_buffers(m, "layer_scalar", std=0.5))),
    # 26B-A4B's layout: routed experts (top 2 of 4, per-expert scales) beside each layer's dense MLP
    "gemma4-moe": (lambda d: transformers.Gemma4TextConfig(
        **d, head_dim=16, global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
        hidden_size_per_layer_input=0, enable_moe_block=True, num_experts=4, top_k_experts=2,
        moe_intermediate_size=32, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
        final_logit_softcapping=3.0),
                   lambda m: (_randomize(m, "norm.weight", "layernorm.weight", "layernorm_1.weight",
                                         "layernorm_2.weight", "router.scale", "per_expert_scale"),
                              _randomize_buffers(m, "layer_scalar", std=0.5))),
    "granitemoe": (lambda d: transformers.GraniteMoeConfig(**d, num_local_experts=4, num_experts_per_tok=2,
                                                           embedding_multiplier=3.0, residual_multiplier=0.5,
                                                           attention_multiplier=0.1, logits_scaling=4.0), None),
}


@functools.lru_cache(maxsize=None)
def tiny_family(name: str) -> tuple[str, Any, Any]:
    """``(folder, hf_model, tokenizer)``: the family's tiny random checkpoint saved with a BPE tokenizer."""
    make_config, tweak = FAMILIES[name]
    tok = transformers.AutoTokenizer.from_pretrained(make_bpe_tokenizer())
    ids = dict(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id)
    cfg = make_config({**DIMS, **ids})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval().float()
    if tweak is not None:
        tweak(model)
    d = tempfile.mkdtemp(prefix=f"libremax-family-{name}-")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d, model, tok


@functools.lru_cache(maxsize=None)
def family_llm(name: str) -> Any:
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    d, _, _ = tiny_family(name)
    return LLM(PipelineConfig(model_path=d, max_length=128, max_batch_size=4, kv_cache_page_size=16))


def hf_next_logits(model: Any, seq: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([seq])).logits[0, -1].double().numpy()


def hf_greedy(model: Any, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        g = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                           max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return g[0, len(ids):].tolist()


def assert_close(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    span = float(ref.max() - ref.min())
    err = float(np.abs(ours - ref).max())
    assert err <= 1e-4 * span, f"{what}: max |diff| {err:.3g} > 1e-4 of the logit range {span:.3g}"


def steps_against_hf(llm: Any, model: Any, prompts: dict, n_decode: int, chunk: Optional[int] = None) -> Any:
    """Run ``prompts`` together through ``llm``'s pipeline model (prompts in pieces of ``chunk`` tokens when
    given: chunked prefill), then ``n_decode`` greedy steps; every step's last-token logits must equal
    transformers' (:func:`assert_close`).  Calls the model's ``prepare_contexts`` hook before each fetch, as
    the pipeline does.  Releases the requests and returns the KV manager (for the caller's checks)."""
    from test_kv_cache_context import FakeContext

    pm = llm.pipeline.pipeline_model
    mgr = pm.kv_manager
    ctxs = [FakeContext(rid, p) for rid, p in prompts.items()]
    seqs = {rid: list(p) for rid, p in prompts.items()}
    prepare = getattr(pm, "prepare_contexts", None)
    for c in ctxs:
        mgr.claim(c.request_id)
    try:
        if chunk is not None:  # all but the last piece of each prompt, one piece per step
            while any(c.active_idx - c.start_idx > chunk for c in ctxs):
                part = [c for c in ctxs if c.active_idx - c.start_idx > chunk]
                for c in part:
                    c.set_token_indices(active_idx=c.start_idx + chunk)
                pm.execute(pm.prepare_initial_token_inputs(part, mgr.fetch(part)))
                for c in part:
                    c.set_token_indices(start_idx=c.active_idx, active_idx=len(seqs[c.request_id]))
                mgr.step(part)
        for step in range(n_decode + 1):
            if prepare is not None:
                prepare(ctxs)
            logits = pm.execute(pm.prepare_initial_token_inputs(ctxs, mgr.fetch(ctxs))).logits.numpy()
            for b, c in enumerate(ctxs):
                assert_close(logits[b], hf_next_logits(model, seqs[c.request_id]), f"{c.request_id} step {step}")
                tok = int(np.argmax(logits[b]))
                seqs[c.request_id].append(tok)
                c.tokens[c.end_idx] = tok
                c.bump_token_indices(start_idx=c.active_idx - c.start_idx, active_idx=1, end_idx=1)
            mgr.step(ctxs)
    finally:
        for c in ctxs:
            mgr.release(c.request_id)
    return mgr


# --------------------------------------------------------------------------- GGUF copies (llama.cpp layout)
# family -> (llama.cpp architecture, transformers config for what GGUF can express, q/k rows permuted,
#            norms stored as 1 + w, extra per-layer name map HF -> llama.cpp, extra metadata)
GGUF_FAMILIES: dict[str, tuple] = {
    "llama": ("llama", lambda d: transformers.LlamaConfig(**d, tie_word_embeddings=False), True, False, {}, {}),
    "mistral": ("mistral", lambda d: transformers.MistralConfig(**d, sliding_window=8), True, False, {},
                {"attention.sliding_window": 8}),
    "qwen2": ("qwen2", lambda d: transformers.Qwen2Config(**d, tie_word_embeddings=True), False, False, {}, {}),
    "qwen3": ("qwen3", lambda d: transformers.Qwen3Config(**d, head_dim=32), False, False, {}, {}),
    "gemma3": ("gemma3", lambda d: transformers.Gemma3TextConfig(**d, head_dim=32, query_pre_attn_scalar=32,
                                                                  sliding_window=8), False, True,
               {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                "post_feedforward_layernorm": "post_ffw_norm"}, {"attention.sliding_window": 8}),
    "phi3": ("phi3", lambda d: transformers.Phi3Config(**d, tie_word_embeddings=False), False, False,
             {"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"}, {}),
    "granite": ("granite", lambda d: transformers.GraniteConfig(**d, embedding_multiplier=3.0, residual_multiplier=0.5,
                                                                 attention_multiplier=0.1, logits_scaling=4.0),
                True, False, {}, {"embedding_scale": 3.0, "residual_scale": 0.5, "attention.scale": 0.1,
                                  "logit_scale": 4.0}),
    # weightless LayerNorms (no norm tensors), q/k permuted as Llama's, clip_qkv as attention.clamp_kqv
    "olmo": ("olmo", lambda d: transformers.OlmoConfig(**d, clip_qkv=0.3), True, False, {},
             {"attention.clamp_kqv": 0.3, "attention.layer_norm_epsilon": 1e-5}),
    # Granite's multipliers; experts as llama.cpp stacks them (input_linear split into gate and up)
    "granitemoe": ("granitemoe", lambda d: transformers.GraniteMoeConfig(
        **d, num_local_experts=4, num_experts_per_tok=2, embedding_multiplier=3.0, residual_multiplier=0.5,
        attention_multiplier=0.1, logits_scaling=4.0), True, False, {"block_sparse_moe.router": "ffn_gate_inp"},
        {"embedding_scale": 3.0, "residual_scale": 0.5, "attention.scale": 0.1, "logit_scale": 4.0,
         "expert_count": 4, "expert_used_count": 2}),
    # 4 layers: the last is NoPE (the config class's default pattern, which llama.cpp also assumes)
    "smollm3": ("smollm3", lambda d: transformers.SmolLM3Config(**{**d, "num_hidden_layers": 4},
                                                                 tie_word_embeddings=False), True, False, {}, {}),
    # half of each head rotated (adjacent pairs: no permutation), q/k/v biases, fused gate/up as ffn_up
    "glm4": ("glm4", lambda d: transformers.Glm4Config(**d, head_dim=16), False, False,
             {"post_self_attn_layernorm": "post_attention_norm", "post_mlp_layernorm": "post_ffw_norm",
              "mlp.gate_up_proj": "ffn_up"}, {"rope.dimension_count": 8}),
    "olmo2": ("olmo2", lambda d: transformers.Olmo2Config(**d), False, False,
              {"post_attention_layernorm": "post_attention_norm", "post_feedforward_layernorm": "post_ffw_norm"}, {}),
    # sliding layer with RoPE, global NoPE layer (per-layer pattern in the metadata), post-norms, no permutation
    "exaone4": ("exaone4", lambda d: transformers.Exaone4Config(
        **d, sliding_window=8, layer_types=["sliding_attention", "full_attention"]), False, False,
        {"post_attention_layernorm": "post_attention_norm", "post_feedforward_layernorm": "post_ffw_norm"},
        {"attention.sliding_window": 8, "attention.sliding_window_pattern": [True, False]}),
    # EXAONE 4 without a sliding window (every layer global with RoPE), Llama 3-style scaling as rope_freqs
    "exaone4-rope-freqs": ("exaone4", lambda d: transformers.Exaone4Config(
        **d, sliding_window=None, layer_types=["full_attention"] * d["num_hidden_layers"], rope_parameters={
            "rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}), False, False,
        {"post_attention_layernorm": "post_attention_norm", "post_feedforward_layernorm": "post_ffw_norm"}, {}),
    # Llama 3.1-style scaling (original context 64) as llama.cpp stores it: a rope_freqs tensor, no metadata
    "llama-rope-freqs": ("llama", lambda d: transformers.LlamaConfig(**d, tie_word_embeddings=False, rope_parameters={
        "rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}), True, False, {}, {}),
    # Phi-3 128k-style LongRoPE (original context 16, half of each head rotated) as rope_factors_* tensors
    "phi3-longrope": ("phi3", lambda d: transformers.Phi3Config(
        **d, tie_word_embeddings=False, original_max_position_embeddings=16, rope_parameters=dict(
            rope_type="longrope", rope_theta=1e4, partial_rotary_factor=0.5, original_max_position_embeddings=16,
            short_factor=[1.0, 1.5, 2.0, 4.0], long_factor=[2.0, 3.0, 5.0, 9.0])), False, False,
        {"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"}, {"rope.dimension_count": 8}),
}

_LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
          "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
          "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def _gguf_name(hf_name: str, extra: dict) -> str:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    _, _, i, rest = hf_name.split(".", 3)
    mod, leaf = rest.rsplit(".", 1)
    return f"blk.{i}.{extra.get(mod) or _LAYER[mod]}.{leaf}"


def _stacked_experts(hf_name: str, a: np.ndarray, extra: dict | None = None) -> list:
    """llama.cpp's tensors for one of transformers' tensors: the experts' fused ``gate_up_proj``
    ``[experts, 2 * moe_dim, hidden]`` as ``ffn_gate_exps`` and ``ffn_up_exps``, ``down_proj`` as
    ``ffn_down_exps``; any other tensor under its one name."""
    if ".experts.gate_up_proj" in hf_name or ".experts.down_proj" in hf_name:
        blk = f"blk.{hf_name.split('.')[2]}"
        if hf_name.endswith("gate_up_proj"):
            half = a.shape[1] // 2
            return [(f"{blk}.ffn_gate_exps.weight", a[:, :half]), (f"{blk}.ffn_up_exps.weight", a[:, half:])]
        return [(f"{blk}.ffn_down_exps.weight", a)]
    return [(_gguf_name(hf_name, extra or {}), a)]


@functools.lru_cache(maxsize=None)
def tiny_gguf(name: str) -> tuple[str, Any, Any]:
    """``(gguf path, hf_model, tokenizer)``: a tiny random model of the family written as llama.cpp would
    (its names, q/k permutation, Gemma's 1 + w norms), float32 tensors and a byte-level BPE vocabulary."""
    import json

    import gguf
    from gguf_support import rope_scaling_gguf_parts

    arch, make_config, permuted, plus_one, extra, meta = GGUF_FAMILIES[name]
    tok = transformers.AutoTokenizer.from_pretrained(make_bpe_tokenizer())
    cfg = make_config({**DIMS, "vocab_size": len(tok), "bos_token_id": tok.bos_token_id,
                       "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval().float()
    _randomize(model, "norm.weight", "layernorm.weight", "_proj.bias")
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // nh
    path = os.path.join(tempfile.mkdtemp(prefix=f"libremax-gguf-{name}-"), f"tiny-{name}.gguf")
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    if "rope.dimension_count" not in meta:  # partial rotary families give theirs
        w.add_rope_dimension_count(head_dim)
    rope = cfg.rope_parameters.get("full_attention", cfg.rope_parameters)
    w.add_rope_freq_base(float(rope["rope_theta"]))
    if getattr(cfg, "rms_norm_eps", None) is not None:  # OLMo's LayerNorms store their epsilon in the metadata
        w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    rope_tensors, rope_meta = rope_scaling_gguf_parts(cfg)  # RoPE scaling llama.cpp stores as tensors
    for k, v in {**meta, **rope_meta}.items():
        key = f"{arch}.{k}"
        if isinstance(v, list):
            w.add_array(key, v)
        else:
            w.add_uint32(key, v) if isinstance(v, int) else w.add_float32(key, v)
    tj = json.loads(tok.backend_tokenizer.to_str())
    tokens = [t for t, _ in sorted(tj["model"]["vocab"].items(), key=lambda kv: kv[1])]
    special = {a["content"] for a in tj["added_tokens"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 1 for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
    w.add_bos_token_id(tok.bos_token_id)
    w.add_eos_token_id(tok.eos_token_id)
    w.add_add_bos_token(False)

    def permute(a: np.ndarray, heads: int) -> np.ndarray:
        return a.reshape(heads, 2, a.shape[0] // heads // 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)

    for k, v in model.state_dict().items():
        if k == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        a = v.detach().float().numpy().copy()
        if permuted and (".q_proj." in k or ".k_proj." in k):
            a = permute(a, nh if ".q_proj." in k else nkv)
        if plus_one and k.endswith("norm.weight"):
            a = a + 1.0
        for name, part in _stacked_experts(k, a, extra):
            w.add_tensor(name, part.astype(np.float32))
    for name, a in rope_tensors.items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, model, tok
