"""DeepSeek-V3 checkpoints: DeepSeek-V2's (per-expert projections stacked), the router's
``mlp.gate.e_score_correction_bias`` as the MoE's ``mlp.e_score_correction_bias``.  The multi-token
prediction layer some checkpoints carry (``layers.{num_hidden_layers}...``) is left out of the main
model; :func:`mtp_state_dict` gives it to the MTP draft (``mtp.py``)."""

from __future__ import annotations

import re
from typing import Any

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.deepseek_v2.weight_adapters import convert_safetensor_state_dict as v2_convert

MTP_OWN = ("enorm.", "hnorm.", "eh_proj.", "shared_head.", "embed_tokens.")
"""The MTP layer's tensors outside its decoder layer (the rest are a decoder layer's)."""


def _hf_value(huggingface_config: Any, key: str) -> Any:
    if isinstance(huggingface_config, dict):
        return huggingface_config.get(key)
    return getattr(huggingface_config, key, None)


def _convert_all(state_dict: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {name.replace(".mlp.gate.e_score_correction_bias", ".mlp.e_score_correction_bias"): w
            for name, w in v2_convert(state_dict, **kw).items()}


def convert_safetensor_state_dict(state_dict: dict[str, Any], huggingface_config: Any = None,
                                  **kw: Any) -> dict[str, Any]:
    n = _hf_value(huggingface_config, "num_hidden_layers")
    out = {}
    for name, w in _convert_all(state_dict, **kw).items():
        m = re.match(r"layers\.(\d+)\.", name)
        if n is not None and m and int(m.group(1)) >= int(n):
            continue  # multi-token prediction module
        out[name] = w
    return out


def mtp_state_dict(state_dict: dict[str, Any], num_hidden_layers: int, tie_word_embeddings: bool = False
                   ) -> dict[str, Any]:
    """The first MTP layer's tensors (``layers.{num_hidden_layers}.*``) under the MTP module's names: its
    decoder layer as ``layers.0.*``, ``enorm`` / ``hnorm`` / ``eh_proj`` / ``shared_head.{norm,head}`` /
    ``embed_tokens`` as they are.  A checkpoint without its own ``embed_tokens`` or ``shared_head.head``
    (they equal the main model's) gets the main model's embedding and ``lm_head``.  Empty when the
    checkpoint has no MTP layer."""
    prefix = f"layers.{int(num_hidden_layers)}."
    allw = _convert_all(state_dict)
    out: dict[str, Any] = {}
    for name, w in allw.items():
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix):]
        out[rest if rest.startswith(MTP_OWN) else "layers.0." + rest] = w
    if not out:
        return out
    out.setdefault("embed_tokens.weight", allw.get("embed_tokens.weight"))
    head = allw.get("embed_tokens.weight") if tie_word_embeddings else allw.get("lm_head.weight")
    out.setdefault("shared_head.head.weight", head)
    return {k: v for k, v in out.items() if v is not None}


WEIGHT_ADAPTERS = {WeightsFormat.safetensors: convert_safetensor_state_dict,
                   WeightsFormat.pytorch: convert_safetensor_state_dict}
