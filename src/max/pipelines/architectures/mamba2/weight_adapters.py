"""Mamba-2 checkpoints: Hugging Face names minus ``backbone.`` (older checkpoints' ``embedding`` is
``embeddings``); llama.cpp's GGUF names (``ssm_*``, :func:`gguf_mamba2_layout` undoing its layouts)."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.common.weights import Derived, rename_gguf, rename_hf


def safetensors(state_dict: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    out = rename_hf(state_dict, prefix="backbone.")
    return {("embeddings.weight" if k == "embedding.weight" else k): v for k, v in out.items()}


GGUF_SSM = {"ssm_in": "in_proj", "ssm_conv1d": "conv1d", "ssm_dt": "dt", "ssm_a": "A", "ssm_d": "D",
            "ssm_norm": "norm", "ssm_out": "out_proj"}
"""llama.cpp's Mamba-2 mixer tensors -> the mixer's module names (``ssm_dt.bias`` is ``dt_bias``, ``ssm_a``
holds ``A`` itself: see :func:`gguf_mamba2_layout`)."""


def gguf_mamba2_layout(out: dict[str, Any], mixer: str) -> dict[str, Any]:
    """Undo llama.cpp's converter layouts in the mixer tensors renamed to ``layers.N.<mixer>.*``: the conv
    weight ``[C, K]`` -> ``[C, 1, K]``, ``A = -exp(A_log)`` ``[H, 1]`` -> ``A_log``, ``D`` ``[H, 1]`` -> ``[H]``,
    ``dt.bias`` -> ``dt_bias``, the group norm ``[G, I/G]`` -> ``[I]``."""
    res: dict[str, Any] = {}
    for k, v in out.items():
        head, _, leaf = k.rpartition(f".{mixer}.")
        if not _:
            res[k] = v
            continue
        p = f"{head}.{mixer}."
        if leaf == "conv1d.weight":
            res[k] = Derived(lambda w: w.reshape(w.shape[0], 1, -1), v)
        elif leaf == "A.weight":
            res[p + "A_log"] = Derived(lambda a: torch.log(-a.double()).float().reshape(-1), v)
        elif leaf == "D.weight":
            res[p + "D"] = Derived(lambda d: d.reshape(-1), v)
        elif leaf == "dt.bias":
            res[p + "dt_bias"] = Derived(lambda b: b.reshape(-1), v)
        elif leaf == "norm.weight":
            res[k] = Derived(lambda w: w.reshape(-1), v)
        else:
            res[k] = v
    return res


def gguf_suffixed(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """llama.cpp names ``A`` and ``D`` without a suffix (``blk.N.ssm_a``): give them ``.weight``."""
    return {(k + ".weight" if k.endswith((".ssm_a", ".ssm_d")) else k): v for k, v in state_dict.items()}


def gguf(state_dict: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    state_dict = gguf_suffixed(state_dict)
    names = {"attn_norm": "norm", **{a: f"mixer.{b}" for a, b in GGUF_SSM.items()}}
    out = rename_gguf(state_dict, names, {"token_embd": "embeddings", "output_norm": "norm_f", "output": "lm_head"})
    return gguf_mamba2_layout(out, "mixer")


WEIGHT_ADAPTERS = {WeightsFormat.safetensors: safetensors, WeightsFormat.pytorch: safetensors,
                   WeightsFormat.gguf: gguf}
