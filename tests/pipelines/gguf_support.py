"""A tiny transformers Llama written as a llama.cpp-style GGUF file (metadata, BPE vocabulary, q/k rows
in llama.cpp's rotary layout), for the tests that load GGUF files through the pipeline."""

from __future__ import annotations

import json
import math
from typing import Any, Callable

import numpy as np
from gguf import GGUFWriter


def llama3_rope_freqs(cfg: Any) -> np.ndarray:
    """The ``rope_freqs.weight`` llama.cpp's converter writes for a config with ``llama3`` RoPE scaling: base
    frequencies in float32, then per pair 1 (wavelength below ``original / high_freq_factor``), ``factor``
    (above ``original / low_freq_factor``) or ``1 / ((1 - s) / factor + s)`` with
    ``s = (original / wavelength - low) / (high - low)``.  (The converter reads ``original`` from the
    config's top level, 8192 when absent there; here it is the RoPE parameters' value, which the
    tests' configs also hold.)"""
    rp = cfg.rope_parameters
    base = float(rp["rope_theta"])
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    freqs = (1.0 / (np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))).astype(np.float32)
    factor, low, high = float(rp["factor"]), float(rp["low_freq_factor"]), float(rp["high_freq_factor"])
    old = float(rp["original_max_position_embeddings"])
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / float(f)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, np.float32)


def rope_scaling_gguf_parts(cfg: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(tensors, {arch}.* metadata)`` llama.cpp's converter writes for ``cfg``'s RoPE scaling: ``llama3``:
    ``rope_freqs.weight``; ``longrope`` (Phi-3): ``rope_factors_long/short.weight``, the original context
    and the attention factor ``sqrt(1 + ln(s) / ln(original))`` (``s`` = context / original); else nothing."""
    rp = cfg.rope_parameters
    kind = rp.get("rope_type", "default")
    if kind == "llama3":
        return {"rope_freqs.weight": llama3_rope_freqs(cfg)}, {}
    if kind == "longrope":
        orig = int(rp["original_max_position_embeddings"])
        scale = cfg.max_position_embeddings / orig
        attn = math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0
        tensors = {"rope_factors_long.weight": np.asarray(rp["long_factor"], np.float32),
                   "rope_factors_short.weight": np.asarray(rp["short_factor"], np.float32)}
        return tensors, {"rope.scaling.original_context_length": orig, "rope.scaling.attn_factor": attn}
    return {}, {}


def write_llama_gguf(path: Any, model: Any, tok: Any, put: Callable[[GGUFWriter, str, np.ndarray, bool], None],
                     file_type: int | None = None, with_output: bool = True,
                     extra_tensors: dict[str, np.ndarray] | None = None) -> None:
    """Write ``model`` (a transformers Llama) and ``tok`` (its fast tokenizer) to ``path``.

    ``put(writer, gguf_name, float32 array, is_norm)`` adds each tensor (the caller picks its GGML
    kind); ``with_output=False`` leaves out ``output.weight`` (tied embeddings); ``extra_tensors`` are
    written as float32 (``rope_freqs.weight`` ...)."""
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
    for name, a in (extra_tensors or {}).items():
        w.add_tensor(name, np.asarray(a, np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()


def write_sentencepiece_gguf(path: Any, arch: str = "llama", add_bos: bool | None = None, with_merges: bool = False,
                             vocab_size: int = 400) -> str:
    """A GGUF file (one layer, no real weights) whose vocabulary is SentencePiece-style BPE as llama.cpp writes
    it (``tokenizer.ggml.model = llama``): the family's special pieces, 256 byte-fallback pieces, pieces
    learned on the test text (scores by rank; the merges only if ``with_merges``), CONTROL chat pieces,
    a USER_DEFINED ``<think>`` and pieces of plain spaces (which Gemma files hold)."""
    import os

    from tokenizers import SentencePieceBPETokenizer

    text = open(os.path.join(os.path.dirname(__file__), "..", "fixtures", "text", "teacher_forcing.txt")).read()
    t = SentencePieceBPETokenizer()
    t.train_from_iterator([text], vocab_size=vocab_size, min_frequency=2, special_tokens=[], show_progress=False)
    tj = json.loads(t.to_str())
    learned = [tok for tok, _ in sorted(tj["model"]["vocab"].items(), key=lambda kv: kv[1])]
    if arch.startswith("gemma"):
        head = [("<pad>", 3), ("<eos>", 3), ("<bos>", 3), ("<unk>", 2), ("<mask>", 4)]
        named = {"bos": "<bos>", "eos": "<eos>", "unk": "<unk>", "pad": "<pad>"}
    else:
        head = [("<unk>", 2), ("<s>", 3), ("</s>", 3)]
        named = {"bos": "<s>", "eos": "</s>", "unk": "<unk>"}
    pieces = head + [(f"<0x{b:02X}>", 6) for b in range(256)] + [(x, 1) for x in learned if x not in dict(head)] + \
        [("<|user|>", 3), ("<|assistant|>", 3), ("<think>", 4), ("  ", 1), ("   ", 1)]
    names = [x for x, _ in pieces]
    ids = {n: i for i, n in enumerate(names)}
    w = GGUFWriter(str(path), arch)
    w.add_block_count(1); w.add_context_length(128); w.add_embedding_length(64); w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_tokenizer_model("llama"); w.add_tokenizer_pre("default"); w.add_token_list(names)
    w.add_token_types([ty for _, ty in pieces]); w.add_token_scores([float(-i) for i in range(len(names))])
    if with_merges:
        w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
    w.add_bos_token_id(ids[named["bos"]]); w.add_eos_token_id(ids[named["eos"]]); w.add_unk_token_id(ids[named["unk"]])
    if "pad" in named:
        w.add_pad_token_id(ids[named["pad"]])
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    w.add_chat_template("{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}"
                        "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}{{ mask_token }}")
    w.add_tensor("token_embd.weight", np.zeros((len(names), 64), np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return str(path)


def write_hybrid_gguf(path: Any, arch: str, tok: Any, keys: Callable[[GGUFWriter], None],
                      tensors: dict[str, np.ndarray], quant: Any = None) -> str:
    """A GGUF file of general.architecture ``arch``: ``keys(writer)`` adds the model's metadata, ``tok`` (a
    fast BPE tokenizer) becomes a ``gpt2`` vocabulary, and ``tensors`` (llama.cpp names -> float32 arrays in
    the converter's layouts) are written as F32, or as ``quant`` (a ``GGMLQuantizationType``) for the 2-D
    matrices whose rows fit its blocks (llama.cpp keeps norms and SSM vectors in F32 too)."""
    from gguf import GGML_QUANT_SIZES, LlamaFileType, quants

    w = GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_file_type(LlamaFileType.ALL_F32 if quant is None else LlamaFileType[f"MOSTLY_{quant.name}"])
    keys(w)
    tj = json.loads(tok.backend_tokenizer.to_str())
    w.add_tokenizer_model("gpt2"); w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in sorted(tj["model"]["vocab"].items(), key=lambda kv: kv[1])])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
    w.add_bos_token_id(tok.bos_token_id); w.add_eos_token_id(tok.eos_token_id)
    if tok.pad_token_id is not None:
        w.add_pad_token_id(tok.pad_token_id)
    for name, a in tensors.items():
        a = np.ascontiguousarray(a, np.float32)
        if quant is not None and a.ndim >= 2 and a.shape[-1] % GGML_QUANT_SIZES[quant][0] == 0 \
                and "norm" not in name and "ssm_conv1d" not in name:
            w.add_tensor(name, quants.quantize(a, quant), raw_dtype=quant)
        else:
            w.add_tensor(name, a)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return str(path)
