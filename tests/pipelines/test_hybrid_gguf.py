"""Hybrid (recurrent-state) families from GGUF files laid out as llama.cpp's converter writes them (its
tensor names from ``gguf.constants`` / ``gguf.tensor_mapping``, its metadata keys, its layouts: ``A`` stored
as ``-exp(A_log)``, conv weights squeezed, the group norm ``[G, I/G]``, Llama-permuted q/k where the family
uses llama.cpp's NORM rope, Falcon-H1's multipliers folded in): the tiny random checkpoints of
test_hybrid_families written so, loaded through the GGUF path, give transformers' logits and greedy tokens
on the original model; a Q8_0 copy runs the quantised path."""

from __future__ import annotations

import functools
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nn"))

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
import torch  # noqa: E402

from family_support import hf_greedy, hf_next_logits, steps_against_hf  # noqa: E402
from gguf_support import write_hybrid_gguf  # noqa: E402
from support import scheduled_greedy  # noqa: E402
from test_hybrid_families import HYBRID, tiny  # noqa: E402
from test_kv_cache_context import FakeContext  # noqa: E402


def _sd(d: str) -> dict[str, np.ndarray]:
    """The checkpoint as saved (the names and layouts llama.cpp's converter reads)."""
    from safetensors.numpy import load_file

    out: dict[str, np.ndarray] = {}
    for f in sorted(Path(d).glob("*.safetensors")):
        out.update({k: v.astype(np.float32) for k, v in load_file(str(f)).items()})
    return out


def _ssm_tensors(out: dict, i: int, p: str, sd: dict, groups: int) -> None:
    """A Mamba-2 mixer's tensors (HF prefix ``p``) as llama.cpp's converter writes them."""
    out[f"blk.{i}.ssm_in.weight"] = sd[p + "in_proj.weight"]
    out[f"blk.{i}.ssm_conv1d.weight"] = sd[p + "conv1d.weight"].squeeze(1)
    if p + "conv1d.bias" in sd:
        out[f"blk.{i}.ssm_conv1d.bias"] = sd[p + "conv1d.bias"]
    out[f"blk.{i}.ssm_dt.bias"] = sd[p + "dt_bias"]
    out[f"blk.{i}.ssm_a"] = -np.exp(sd[p + "A_log"].astype(np.float64)).astype(np.float32)[:, None]
    out[f"blk.{i}.ssm_d"] = sd[p + "D"][:, None]
    if p + "norm.weight" in sd:
        out[f"blk.{i}.ssm_norm.weight"] = sd[p + "norm.weight"].reshape(groups, -1)
    out[f"blk.{i}.ssm_out.weight"] = sd[p + "out_proj.weight"]


def _ssm_keys(w, heads: int, head_dim: int, groups: int, state: int, kernel: int) -> None:
    w.add_ssm_conv_kernel(kernel); w.add_ssm_inner_size(heads * head_dim); w.add_ssm_state_size(state)
    w.add_ssm_time_step_rank(heads); w.add_ssm_group_count(groups)


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:  # llama.cpp's NORM-rope row layout for q/k
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def mamba2_gguf(path, d, model, tok, quant=None) -> str:
    cfg, sd = model.config, _sd(d)
    t = {"token_embd.weight": sd["backbone.embeddings.weight"], "output_norm.weight": sd["backbone.norm_f.weight"]}
    if not cfg.tie_word_embeddings:
        t["output.weight"] = sd["lm_head.weight"]
    for i in range(cfg.num_hidden_layers):
        t[f"blk.{i}.attn_norm.weight"] = sd[f"backbone.layers.{i}.norm.weight"]
        _ssm_tensors(t, i, f"backbone.layers.{i}.mixer.", sd, cfg.n_groups)

    def keys(w):
        w.add_context_length(2 ** 20); w.add_embedding_length(cfg.hidden_size); w.add_feed_forward_length(0)
        w.add_head_count(0); w.add_block_count(cfg.num_hidden_layers)
        _ssm_keys(w, cfg.num_heads, cfg.head_dim, cfg.n_groups, cfg.state_size, cfg.conv_kernel)
        w.add_layer_norm_rms_eps(cfg.layer_norm_epsilon)

    return write_hybrid_gguf(path, "mamba2", tok, keys, t, quant)


def granite_gguf(path, d, model, tok, quant=None) -> str:
    cfg, sd = model.config, _sd(d)
    attn = [i for i, t in enumerate(cfg.layer_types) if t != "linear_attention"]
    t = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"]}
    if not cfg.tie_word_embeddings:
        t["output.weight"] = sd["lm_head.weight"]
    F, S = cfg.intermediate_size, cfg.shared_intermediate_size
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        t[f"blk.{i}.attn_norm.weight"] = sd[p + "input_layernorm.weight"]
        if i in attn:
            t[f"blk.{i}.attn_q.weight"] = _permute(sd[p + "self_attn.q_proj.weight"], cfg.num_attention_heads)
            t[f"blk.{i}.attn_k.weight"] = _permute(sd[p + "self_attn.k_proj.weight"], cfg.num_key_value_heads)
            t[f"blk.{i}.attn_v.weight"] = sd[p + "self_attn.v_proj.weight"]
            t[f"blk.{i}.attn_output.weight"] = sd[p + "self_attn.o_proj.weight"]
        else:
            _ssm_tensors(t, i, p + "mamba.", sd, cfg.mamba_n_groups)
        t[f"blk.{i}.ffn_norm.weight"] = sd[p + "post_attention_layernorm.weight"]
        sh = sd[p + "shared_mlp.input_linear.weight"]  # [2S, H]: gate then up
        if cfg.num_local_experts:
            inp = sd[p + "block_sparse_moe.input_linear.weight"]  # [E, 2F, H]: gate then up
            t[f"blk.{i}.ffn_gate_inp.weight"] = sd[p + "block_sparse_moe.router.layer.weight"]
            t[f"blk.{i}.ffn_gate_exps.weight"] = inp[:, :F]
            t[f"blk.{i}.ffn_up_exps.weight"] = inp[:, F:]
            t[f"blk.{i}.ffn_down_exps.weight"] = sd[p + "block_sparse_moe.output_linear.weight"]
            t[f"blk.{i}.ffn_gate_shexp.weight"] = sh[:S]
            t[f"blk.{i}.ffn_up_shexp.weight"] = sh[S:]
            t[f"blk.{i}.ffn_down_shexp.weight"] = sd[p + "shared_mlp.output_linear.weight"]
        else:  # dense: the shared MLP as a plain feed-forward
            t[f"blk.{i}.ffn_gate.weight"] = sh[:S]
            t[f"blk.{i}.ffn_up.weight"] = sh[S:]
            t[f"blk.{i}.ffn_down.weight"] = sd[p + "shared_mlp.output_linear.weight"]

    def keys(w):
        w.add_block_count(cfg.num_hidden_layers); w.add_context_length(cfg.max_position_embeddings)
        w.add_embedding_length(cfg.hidden_size); w.add_feed_forward_length(F)
        w.add_head_count(cfg.num_attention_heads)
        w.add_head_count_kv([cfg.num_key_value_heads if i in attn else 0 for i in range(cfg.num_hidden_layers)])
        w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
        w.add_rope_scaling_finetuned(cfg.position_embedding_type == "rope")
        w.add_layer_norm_rms_eps(cfg.rms_norm_eps); w.add_vocab_size(cfg.vocab_size)
        w.add_expert_count(cfg.num_local_experts)
        if cfg.num_local_experts:
            w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_shared_feed_forward_length(S)
        w.add_attention_scale(cfg.attention_multiplier); w.add_embedding_scale(cfg.embedding_multiplier)
        w.add_residual_scale(cfg.residual_multiplier); w.add_logit_scale(cfg.logits_scaling)
        _ssm_keys(w, cfg.mamba_n_heads, cfg.mamba_d_head, cfg.mamba_n_groups, cfg.mamba_d_state, cfg.mamba_d_conv)

    return write_hybrid_gguf(path, "granitehybrid", tok, keys, t, quant)


def falcon_h1_gguf(path, d, model, tok, quant=None) -> str:
    """As llama.cpp's converter writes Falcon-H1: every µP multiplier folded into the weights it scales,
    q/k in Hugging Face's row order (NEOX rope)."""
    cfg, sd = model.config, _sd(d)
    I, GN = cfg.mamba_d_ssm, cfg.mamba_n_groups * cfg.mamba_d_state
    a_in = cfg.attention_in_multiplier
    mup = np.concatenate([np.full(n, v, np.float32) for n, v in zip([I, I, GN, GN, cfg.mamba_n_heads],
                                                                      cfg.ssm_multipliers)])
    t = {"token_embd.weight": sd["model.embed_tokens.weight"] * cfg.embedding_multiplier,
         "output_norm.weight": sd["model.final_layernorm.weight"],
         "output.weight": sd["lm_head.weight"] * cfg.lm_head_multiplier}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        t[f"blk.{i}.attn_norm.weight"] = sd[p + "input_layernorm.weight"]
        t[f"blk.{i}.attn_q.weight"] = sd[p + "self_attn.q_proj.weight"] * a_in
        t[f"blk.{i}.attn_k.weight"] = sd[p + "self_attn.k_proj.weight"] * a_in * cfg.key_multiplier
        t[f"blk.{i}.attn_v.weight"] = sd[p + "self_attn.v_proj.weight"] * a_in
        t[f"blk.{i}.attn_output.weight"] = sd[p + "self_attn.o_proj.weight"] * cfg.attention_out_multiplier
        m = {**sd, p + "mamba.in_proj.weight": sd[p + "mamba.in_proj.weight"] * cfg.ssm_in_multiplier * mup[:, None],
             p + "mamba.out_proj.weight": sd[p + "mamba.out_proj.weight"] * cfg.ssm_out_multiplier}
        _ssm_tensors(t, i, p + "mamba.", m, cfg.mamba_n_groups)
        t[f"blk.{i}.ffn_norm.weight"] = sd[p + "pre_ff_layernorm.weight"]
        t[f"blk.{i}.ffn_gate.weight"] = sd[p + "feed_forward.gate_proj.weight"] * cfg.mlp_multipliers[0]
        t[f"blk.{i}.ffn_up.weight"] = sd[p + "feed_forward.up_proj.weight"]
        t[f"blk.{i}.ffn_down.weight"] = sd[p + "feed_forward.down_proj.weight"] * cfg.mlp_multipliers[1]

    def keys(w):
        w.add_block_count(cfg.num_hidden_layers); w.add_context_length(cfg.max_position_embeddings)
        w.add_embedding_length(cfg.hidden_size); w.add_feed_forward_length(cfg.intermediate_size)
        w.add_head_count(cfg.num_attention_heads); w.add_head_count_kv(cfg.num_key_value_heads)
        hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        w.add_key_length(hd); w.add_value_length(hd)
        w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
        w.add_layer_norm_rms_eps(cfg.rms_norm_eps); w.add_vocab_size(cfg.vocab_size)
        _ssm_keys(w, cfg.mamba_n_heads, cfg.mamba_d_head, cfg.mamba_n_groups, cfg.mamba_d_state, cfg.mamba_d_conv)

    return write_hybrid_gguf(path, "falcon-h1", tok, keys, t, quant)


def _tile(a: np.ndarray, axis: int, k_heads: int, per_k: int, size: int) -> np.ndarray:
    """Value heads from Hugging Face's grouped order to llama.cpp's tiled order (its Qwen3.5 converter)."""
    shape = list(a.shape)
    a = a.reshape(*shape[:axis], k_heads, per_k, size, *shape[axis + 1:])
    return np.swapaxes(a, axis, axis + 1).reshape(shape)


def qwen_hybrid_gguf(path, d, model, tok, quant=None) -> str:
    """As llama.cpp's converter writes Qwen3-Next (``qwen3next``: q|k|v|z split into ``attn_qkv`` +
    ``attn_gate``, ``in_proj_ba`` as is) and Qwen3.5 (``qwen35``: value heads in tiled order): norms but the
    DeltaNet's gated one stored ``w + 1``, ``A = -exp(A_log)``, conv weights squeezed, experts stacked."""
    cfg, sd = model.config, {k.replace("model.language_model.", "model."): v for k, v in _sd(d).items()}
    nxt = cfg.model_type == "qwen3_next"
    Hk, Hv, dk, dv = (cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                      cfg.linear_value_head_dim)
    r = Hv // Hk
    tile = (lambda a, axis, size: a) if nxt else (lambda a, axis, size: _tile(a, axis, Hk, r, size))
    step = getattr(cfg, "full_attention_interval", None) or cfg.layer_types.index("full_attention") + 1
    assert cfg.layer_types == ["linear_attention" if (i + 1) % step else "full_attention"
                               for i in range(cfg.num_hidden_layers)]
    t = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"] + 1}
    if not cfg.tie_word_embeddings:
        t["output.weight"] = sd["lm_head.weight"]
    for i in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        t[b + "attn_norm.weight"] = sd[p + "input_layernorm.weight"] + 1
        t[b + "post_attention_norm.weight"] = sd[p + "post_attention_layernorm.weight"] + 1
        if cfg.layer_types[i] == "full_attention":
            for a, h in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("output", "o_proj")):
                t[b + f"attn_{a}.weight"] = sd[p + f"self_attn.{h}.weight"]
            t[b + "attn_q_norm.weight"] = sd[p + "self_attn.q_norm.weight"] + 1
            t[b + "attn_k_norm.weight"] = sd[p + "self_attn.k_norm.weight"] + 1
        else:
            la = p + "linear_attn."
            if nxt:
                w = sd[la + "in_proj_qkvz.weight"].reshape(Hk, 2 * dk + 2 * r * dv, -1)
                q, k, v, z = np.split(w, [dk, 2 * dk, 2 * dk + r * dv], axis=1)
                t[b + "attn_qkv.weight"] = np.concatenate([x.reshape(-1, w.shape[-1]) for x in (q, k, v)])
                t[b + "attn_gate.weight"] = z.reshape(-1, w.shape[-1])
                t[b + "ssm_ba.weight"] = sd[la + "in_proj_ba.weight"]
            else:
                qkv = sd[la + "in_proj_qkv.weight"]
                t[b + "attn_qkv.weight"] = np.concatenate([qkv[:2 * Hk * dk], tile(qkv[2 * Hk * dk:], 0, dv)])
                t[b + "attn_gate.weight"] = tile(sd[la + "in_proj_z.weight"], 0, dv)
                t[b + "ssm_beta.weight"] = tile(sd[la + "in_proj_b.weight"], 0, 1)
                t[b + "ssm_alpha.weight"] = tile(sd[la + "in_proj_a.weight"], 0, 1)
            conv = sd[la + "conv1d.weight"].squeeze(1)
            t[b + "ssm_conv1d.weight"] = np.concatenate([conv[:2 * Hk * dk], tile(conv[2 * Hk * dk:], 0, dv)])
            t[b + "ssm_dt.bias"] = tile(sd[la + "dt_bias"], 0, 1)
            t[b + "ssm_a"] = tile(-np.exp(sd[la + "A_log"].astype(np.float64)).astype(np.float32), 0, 1)
            t[b + "ssm_norm.weight"] = sd[la + "norm.weight"]
            t[b + "ssm_out.weight"] = tile(sd[la + "out_proj.weight"], 1, dv)
        if p + "mlp.gate.weight" in sd:
            t[b + "ffn_gate_inp.weight"] = sd[p + "mlp.gate.weight"]
            for h in ("gate", "up", "down"):
                t[b + f"ffn_{h}_exps.weight"] = np.stack([sd[p + f"mlp.experts.{e}.{h}_proj.weight"]
                                                         for e in range(cfg.num_experts)])
                t[b + f"ffn_{h}_shexp.weight"] = sd[p + f"mlp.shared_expert.{h}_proj.weight"]
            t[b + "ffn_gate_inp_shexp.weight"] = sd[p + "mlp.shared_expert_gate.weight"]
        else:
            for h in ("gate", "up", "down"):
                t[b + f"ffn_{h}.weight"] = sd[p + f"mlp.{h}_proj.weight"]

    def keys(w):
        w.add_block_count(cfg.num_hidden_layers); w.add_context_length(cfg.max_position_embeddings)
        w.add_embedding_length(cfg.hidden_size); w.add_feed_forward_length(cfg.intermediate_size)
        w.add_head_count(cfg.num_attention_heads); w.add_head_count_kv(cfg.num_key_value_heads)
        w.add_key_length(cfg.head_dim); w.add_value_length(cfg.head_dim)
        w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
        w.add_layer_norm_rms_eps(cfg.rms_norm_eps); w.add_vocab_size(cfg.vocab_size)
        if nxt:
            w.add_expert_count(cfg.num_experts); w.add_expert_used_count(cfg.num_experts_per_tok)
            w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
            w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
        w.add_ssm_conv_kernel(cfg.linear_conv_kernel_dim); w.add_ssm_state_size(dk); w.add_ssm_group_count(Hk)
        w.add_ssm_time_step_rank(Hv); w.add_ssm_inner_size(dv * Hv); w.add_full_attention_interval(step)
        w.add_rope_dimension_count(int(cfg.head_dim * cfg.rope_parameters.get("partial_rotary_factor", 0.25)))

    return write_hybrid_gguf(path, "qwen3next" if nxt else "qwen35", tok, keys, t, quant)


# llama.cpp's Mamba-2 layer normalises after the gate: test_hybrid_families' Falcon-H1 (norm before the gate)
# has no GGUF form, so this copy of it normalises after
HYBRID["falcon_h1_gguf"] = (lambda ids: HYBRID["falcon_h1"][0](ids).__class__(
    **{**HYBRID["falcon_h1"][0](ids).to_dict(), "mamba_norm_before_gate": False}), HYBRID["falcon_h1"][1])

# llama.cpp's qwen3next places attention every full_attention_interval-th layer and experts in every layer:
# test_hybrid_families' Qwen3-Next (attention first, a dense layer 0) has no GGUF form, so this one has
# DeltaNet, attention, DeltaNet, attention (interval 2), experts throughout
HYBRID["qwen3_next_gguf"] = (lambda ids: HYBRID["qwen3_next"][0](ids).__class__(
    **{**HYBRID["qwen3_next"][0](ids).to_dict(), "num_hidden_layers": 4, "mlp_only_layers": [],
       "full_attention_interval": 2, "layer_types": ["linear_attention", "full_attention"] * 2}),
    HYBRID["qwen3_next"][1])

# Granite 4 without experts (the shared MLP alone, written as ffn_gate / ffn_up / ffn_down)
HYBRID["granite_dense_gguf"] = (lambda ids: HYBRID["granitemoehybrid"][0](ids).__class__(
    **{**HYBRID["granitemoehybrid"][0](ids).to_dict(), "num_local_experts": 0}), HYBRID["granitemoehybrid"][1])

WRITERS = {"mamba2": mamba2_gguf, "granitemoehybrid": granite_gguf, "granite_dense_gguf": granite_gguf, "falcon_h1_gguf": falcon_h1_gguf,
           "qwen3_next_gguf": qwen_hybrid_gguf, "qwen3_5": qwen_hybrid_gguf}


@functools.lru_cache(maxsize=None)
def gguf_llm(family: str, quant=None):
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    src, model, tok = tiny(family)
    d = tempfile.mkdtemp(prefix=f"libremax-hybrid-gguf-{family}-")
    path = WRITERS[family](Path(d) / f"tiny-{family}.gguf", src, model, tok, quant)
    return LLM(PipelineConfig(model_path=path, max_length=128, max_batch_size=4, kv_cache_page_size=16))


def _free(mgr) -> None:
    assert mgr.num_free_pages == mgr.total_num_pages
    assert mgr.state_slots_used == 0
    mgr.check_invariants()


@pytest.mark.parametrize("family", sorted(WRITERS))
def test_gguf_copy_logits_and_greedy_match_transformers(family):
    _, model, tok = tiny(family)
    llm = gguf_llm(family)
    assert llm.pipeline_config.model_config.architectures == [model.config.architectures[0]]
    rng = np.random.default_rng(1)
    prompts = {"a": rng.integers(0, len(tok), 19).tolist(), "b": rng.integers(0, len(tok), 5).tolist()}
    _free(steps_against_hf(llm, model, prompts, n_decode=2))
    texts = ["def forward(self, x): return x + 1; ", "import os"]
    assert scheduled_greedy(llm, texts, 4) == [hf_greedy(model, tok(p)["input_ids"], 4) for p in texts]
    _free(llm.pipeline.kv_managers[0])


@pytest.mark.parametrize("family", ["mamba2", "granitemoehybrid"])
def test_q8_0_copy_runs_the_quantised_path(family):
    """The same checkpoint with its matrices as Q8_0 (norms, conv and SSM vectors F32, as llama.cpp keeps
    them): the weights stay quantised, and prefill + decode logits stay within 3% of the range of
    transformers' on the float weights."""
    _, model, tok = tiny(family)
    llm = gguf_llm(family, gguf.GGMLQuantizationType.Q8_0)
    assert llm.pipeline_config.model_config.quantization_encoding.name.lower() == "q8_0"
    pm = llm.pipeline.pipeline_model
    consts = [c for c in pm.model._consts if isinstance(c, torch.Tensor)]
    packed = sum(c.numel() for c in consts if not c.is_floating_point())
    floats = sum(c.numel() * c.element_size() for c in consts if c.is_floating_point())
    assert packed > 0 and floats < 0.5 * sum(p.numel() for p in model.parameters()) * 4  # resident, no float copy
    mgr = pm.kv_manager
    p = np.random.default_rng(3).integers(0, len(tok), 17).tolist()
    c = FakeContext("a", p)
    mgr.claim("a")
    try:
        for step in range(3):
            lg = pm.execute(pm.prepare_initial_token_inputs([c], mgr.fetch([c]))).logits.numpy()[0]
            ref = hf_next_logits(model, p)
            err = np.abs(lg - ref).max() / (ref.max() - ref.min())
            assert err <= 3e-2, f"step {step}: {err:.4f} of the range"
            t = int(np.argmax(ref))
            p.append(t)
            c.tokens[c.end_idx] = t
            c.bump_token_indices(start_idx=c.active_idx - c.start_idx, active_idx=1, end_idx=1)
    finally:
        mgr.release("a")
    _free(mgr)
