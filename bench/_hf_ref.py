"""A Hugging Face transformers model on the same (dequantised, float32) weights as a libremax GGUF model.

Used by bench/generate.py and the SmolLM2 correctness test as the independent reference:
the GGUF tensors are dequantised with the `gguf` package (not libremax), the q/k rows
are un-permuted back to Hugging Face's rotate-half layout, and transformers' own
LlamaForCausalLM runs them.
"""

from __future__ import annotations

import numpy as np


def hf_model_from_gguf(path: str):
    import torch
    import transformers
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from max.graph.weights.gguf_meta import read_gguf_metadata
    from max.pipelines.architectures.llama3.config import DecoderConfig
    from max.pipelines.architectures.llama3.weight_adapters import gguf_to_module_name

    meta = read_gguf_metadata(path)
    cfg = DecoderConfig.from_gguf(meta.fields, {t.name for t in meta.tensors})
    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta, max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings, bos_token_id=cfg.bos_token_id,
        eos_token_id=cfg.eos_token_ids[0] if cfg.eos_token_ids else None)
    model = transformers.LlamaForCausalLM(hf_cfg).eval().float()
    reader = GGUFReader(path)
    sd = {}
    for t in reader.tensors:
        name = gguf_to_module_name(t.name)
        if name is None:
            continue
        w = dequantize(t.data, t.tensor_type).astype(np.float32).reshape([int(d) for d in reversed(t.shape.tolist())])
        if ".q_proj." in name or ".k_proj." in name:
            heads = cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads
            w = w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
        sd[("model." + name) if not name.startswith("lm_head") else name] = torch.from_numpy(np.ascontiguousarray(w))
    if cfg.tie_word_embeddings:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    return model
