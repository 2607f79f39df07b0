"""Checkpoint names -> this architecture's module names (``layers.0.self_attn.q_proj.weight`` ...).

Hugging Face safetensors names already match after dropping ``model.``;
GGUF names (``blk.0.attn_q.weight`` ...) are mapped.  Quantised GGUF tensors
are dequantised to the model dtype (bit-exact with ``gguf.quants``) unless the
pipeline runs them quantised.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch

from max.dtype import DType
from max.pipelines.architectures.llama3.config import DecoderConfig

_GGUF = {
    "token_embd.weight": "embed_tokens.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
_BLK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


def gguf_to_module_name(name: str) -> str | None:
    if name in _GGUF:
        return _GGUF[name]
    m = _BLK.match(name)
    if m and m.group(2) in _GGUF_LAYER:
        return f"layers.{m.group(1)}.{_GGUF_LAYER[m.group(2)]}.{m.group(3)}"
    return None


def hf_to_module_name(name: str) -> str | None:
    if name.startswith("model."):
        return name[len("model."):]
    if name == "lm_head.weight":
        return name
    return None


def _to_torch(wd: Any, dtype: DType) -> torch.Tensor:
    """A WeightData (possibly quantised) as a torch tensor of ``dtype``."""
    if getattr(wd, "quantization_encoding", None) is not None:
        wd = wd.astype(DType.float32)
    t = wd.data if isinstance(wd.data, torch.Tensor) else torch.from_dlpack(wd.data) if hasattr(
        wd.data, "__dlpack__") and not isinstance(wd.data, np.ndarray) else torch.from_numpy(np.asarray(wd.data))
    want = dtype.to_torch()
    return t if t.dtype == want else t.to(want)


def state_dict_from_weights(weights: Any, cfg: DecoderConfig, dtype: DType, fmt: str) -> dict[str, torch.Tensor]:
    """All of the architecture's tensors, named as the module names them."""
    from max.graph.weights.protocol import progress

    rename = gguf_to_module_name if fmt == "gguf" else hf_to_module_name
    out: dict[str, torch.Tensor] = {}
    items = [(rename(name), w) for name, w in weights.items()]
    items = [(n, w) for n, w in items if n is not None]
    total = sum(int(np.prod(w.data().shape)) * dtype.size_in_bytes for _, w in items)
    bar = progress(total, "Loading weights", len(items))
    try:
        for new, w in items:
            out[new] = _to_torch(w.data(), dtype)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    if "lm_head.weight" not in out and cfg.tie_word_embeddings:
        out["lm_head.weight"] = out["embed_tokens.weight"]
    return out
