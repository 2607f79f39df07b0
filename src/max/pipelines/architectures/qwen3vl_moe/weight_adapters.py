"""Qwen3-VL-MoE checkpoints: Qwen3-VL's routing (``qwen3vl.weight_adapters``), the experts stored stacked --
``mlp.experts.gate_up_proj`` (gate then up) and ``mlp.experts.down_proj`` -- either as transformers holds them
(``[experts, 2 * moe_dim, hidden]``, ``[experts, hidden, moe_dim]``) or transposed as the released
checkpoints are (``[experts, hidden, 2 * moe_dim]``, ``[experts, moe_dim, hidden]``); which one is read off
the pair's shapes (they cannot fit both)."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.common.weights import Derived
from max.pipelines.architectures.qwen3vl.weight_adapters import WEIGHT_ADAPTERS as _DENSE
from max.pipelines.architectures.qwen3vl.weight_adapters import vision_weights

__all__ = ["WEIGHT_ADAPTERS", "vision_weights"]


def _transposed(gate_up: torch.Tensor, down: torch.Tensor) -> bool:
    """Whether the pair is stored ``[E, hidden, 2 * moe_dim]`` / ``[E, moe_dim, hidden]``."""
    if gate_up.shape[2] == down.shape[1] and gate_up.shape[1] == 2 * down.shape[2]:
        return False
    if gate_up.shape[1] == down.shape[2] and gate_up.shape[2] == 2 * down.shape[1]:
        return True
    raise ValueError(f"experts: gate_up_proj {list(gate_up.shape)} and down_proj {list(down.shape)} do not fit "
                     "together")


def _expert(which: str, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """``[E, out, in]`` of ``which`` (gate / up / down)."""
    if _transposed(gate_up, down):
        gate_up, down = gate_up.transpose(1, 2), down.transpose(1, 2)
    half = gate_up.shape[1] // 2
    return {"gate": gate_up[:, :half], "up": gate_up[:, half:], "down": down}[which].contiguous()


def _text(state_dict: Mapping[str, Any], **kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    state = _DENSE[WeightsFormat.safetensors](state_dict, **kw)
    for name, w in state.items():
        if name.endswith(".mlp.experts.gate_up_proj"):
            p = name[: -len("gate_up_proj")]
            down = state.get(p + "down_proj")
            if down is None:
                raise ValueError(f"{name}: the checkpoint has no {p}down_proj")
            for which in ("gate", "up", "down"):
                out[f"{p}{which}_proj.weight"] = Derived(lambda gu, dn, which=which: _expert(which, gu, dn), w, down)
        elif not name.endswith(".mlp.experts.down_proj"):
            out[name] = w
    return out


WEIGHT_ADAPTERS = {WeightsFormat.safetensors: _text, WeightsFormat.pytorch: _text}
