"""A Hugging Face transformers model on the same (dequantised, float32) weights as a libremax model.

Used by bench/generate.py, bench/families.py and the SmolLM2 correctness test as the independent
reference.  ``hf_reference_model(path)``: a model folder loads with ``from_pretrained``; a GGUF file of
any family transformers reads loads with ``from_pretrained(gguf_file=...)`` (transformers' own
metadata reading, name map, q/k un-permutation and dequantisation; needs ``accelerate``).
``hf_model_from_gguf`` is the faster path for Llama/Mistral GGUF files: transformers' config, the
tensors dequantised with the `gguf` package (not libremax), q/k rows un-permuted back to Hugging
Face's rotate-half layout.  (Only the tensor *names* come from libremax's llama.cpp name map.)
"""

from __future__ import annotations

import os

import numpy as np


def hf_model_from_gguf(path: str):
    import torch
    import transformers
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from max.pipelines.architectures.common.weights import rename_gguf

    d, f = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    cfg = transformers.AutoConfig.from_pretrained(d, gguf_file=f)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    permuted = cfg.model_type in ("llama", "mistral")
    reader = GGUFReader(path)
    sd = {}
    for name, t in rename_gguf({t.name: t for t in reader.tensors}).items():
        w = dequantize(t.data, t.tensor_type).astype(np.float32).reshape([int(x) for x in reversed(t.shape.tolist())])
        if permuted and (".q_proj." in name or ".k_proj." in name):
            heads = cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads
            w = w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
        sd[name if name.startswith("lm_head") else "model." + name] = torch.from_numpy(np.ascontiguousarray(w))
    if cfg.tie_word_embeddings:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    return model


def hf_reference_model(path: str):
    """transformers' float32 model for a model folder or a GGUF file (see the module docstring)."""
    import torch
    import transformers

    if os.path.isdir(path):
        return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    cfg = transformers.AutoConfig.from_pretrained(os.path.dirname(os.path.abspath(path)),
                                                  gguf_file=os.path.basename(path))
    if cfg.model_type in ("llama", "mistral"):
        return hf_model_from_gguf(path)
    import importlib.util

    if importlib.util.find_spec("accelerate") is None:
        raise RuntimeError("transformers needs `accelerate` to load a GGUF file: pip install accelerate")
    return transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path), dtype=torch.float32).eval()
