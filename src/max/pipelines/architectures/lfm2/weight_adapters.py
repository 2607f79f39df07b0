"""LFM2 checkpoints: Hugging Face names minus ``model.``, the attention and feed-forward projections under
the shared decoder's names (``out_proj`` -> ``o_proj``, ``q_layernorm`` -> ``q_norm``, ``w1``/``w3``/``w2``
-> ``gate_proj``/``up_proj``/``down_proj``); llama.cpp's GGUF names (``shortconv.*``, the convolution
stored ``[hidden, L]``, ``token_embd_norm`` the final norm)."""

from __future__ import annotations

from typing import Any, Mapping

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.common.weights import GGUF_LAYER_NAMES, Derived, rename_gguf, rename_hf

_RENAMES = {"self_attn.out_proj.": "self_attn.o_proj.", "self_attn.q_layernorm.": "self_attn.q_norm.",
            "self_attn.k_layernorm.": "self_attn.k_norm.", "feed_forward.w1.": "feed_forward.gate_proj.",
            "feed_forward.w3.": "feed_forward.up_proj.", "feed_forward.w2.": "feed_forward.down_proj."}


def safetensors(state_dict: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    out = {}
    for k, v in rename_hf(state_dict).items():
        for a, b in _RENAMES.items():
            k = k.replace(a, b)
        out[k] = v
    return out


GGUF_LAYERS = {**GGUF_LAYER_NAMES, "attn_norm": "operator_norm", "ffn_norm": "ffn_norm",
               "ffn_gate": "feed_forward.gate_proj", "ffn_up": "feed_forward.up_proj",
               "ffn_down": "feed_forward.down_proj", "shortconv_conv": "conv.conv",
               "shortconv_in_proj": "conv.in_proj", "shortconv_out_proj": "conv.out_proj"}


def gguf(state_dict: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    flat = {k.replace(".shortconv.", ".shortconv_"): v for k, v in state_dict.items()}
    out = rename_gguf(flat, GGUF_LAYERS, {"token_embd": "embed_tokens", "token_embd_norm": "embedding_norm",
                                          "output": "lm_head"})
    for k, v in list(out.items()):
        if k.endswith(".conv.conv.weight"):  # [hidden, L] -> the checkpoint layout [hidden, 1, L]
            out[k] = Derived(lambda w: w.unsqueeze(1), v)
    return out


WEIGHT_ADAPTERS = {WeightsFormat.safetensors: safetensors, WeightsFormat.pytorch: safetensors,
                   WeightsFormat.gguf: gguf}
