"""A tiny transformers Llama written as a llama.cpp-style GGUF file (metadata, BPE vocabulary, q/k rows
in llama.cpp's rotary layout), for the tests that load GGUF files through the pipeline."""

from __future__ import annotations

import json
from typing import Any, Callable

import numpy as np
from gguf import GGUFWriter


def write_llama_gguf(path: Any, model: Any, tok: Any, put: Callable[[GGUFWriter, str, np.ndarray, bool], None],
                     file_type: int | None = None, with_output: bool = True) -> None:
    """Write ``model`` (a transformers Llama) and ``tok`` (its fast tokenizer) to ``path``.

    ``put(writer, gguf_name, float32 array, is_norm)`` adds each tensor (the caller picks its GGML
    kind); ``with_output=False`` leaves out ``output.weight`` (tied embeddings)."""
    cfg = model.config
    sd = {k: v.float().numpy() for k, v in model.state_dict().items()}
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads

    def permute(w: np.ndarray, n_head: int) -> np.ndarray:  # llama.cpp's rotary row layout for q/k
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    w = GGUFWriter(str(path), "llama")
    w.add_name("tiny"); w.add_block_count(cfg.num_hidden_layers); w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size); w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(nh); w.add_head_count_kv(nkv); w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps); w.add_vocab_size(cfg.vocab_size)
    w.add_rope_dimension_count(cfg.hidden_size // nh)
    if file_type is not None:
        w.add_file_type(file_type)
    tj = json.loads(tok.backend_tokenizer.to_str())
    tokens = [t for t, _ in sorted(tj["model"]["vocab"].items(), key=lambda kv: kv[1])]
    special = {a["content"] for a in tj["added_tokens"]}
    w.add_tokenizer_model("gpt2"); w.add_tokenizer_pre("default"); w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 1 for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
    w.add_bos_token_id(tok.bos_token_id); w.add_eos_token_id(tok.eos_token_id); w.add_pad_token_id(tok.pad_token_id)
    w.add_add_bos_token(False)

    put(w, "token_embd.weight", sd["model.embed_tokens.weight"], False)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        put(w, f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"], True)
        put(w, f"blk.{i}.attn_q.weight", permute(sd[p + "self_attn.q_proj.weight"], nh), False)
        put(w, f"blk.{i}.attn_k.weight", permute(sd[p + "self_attn.k_proj.weight"], nkv), False)
        put(w, f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"], False)
        put(w, f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"], False)
        put(w, f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"], True)
        put(w, f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"], False)
        put(w, f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"], False)
        put(w, f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"], False)
    put(w, "output_norm.weight", sd["model.norm.weight"], True)
    if with_output:
        put(w, "output.weight", sd["lm_head.weight"], False)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
