"""The Qwen3-VL vision transformer as ``max.nn`` modules, its image graph, and the host-side layout of a
batch of images (learned position-embedding taps, 2-D RoPE angles, per-frame attention blocks).

Graph inputs, one row per merged token (``merge_size**2`` patches) in the processor's order: ``patches``
float32 ``[n_tokens, unit * patch_dim]``, ``pos_index`` int64 / ``pos_weight`` float32
``[n_tokens, unit * 4]`` (each patch's four bilinear taps into the ``side x side`` table of learned position
embeddings, resampled to its frame's grid with aligned corners), ``cos``/``sin`` float32
``[n_tokens, unit * head_dim]`` (2-D RoPE as Qwen2.5-VL's) and ``mask`` float32 ``[n_tokens, n_tokens]``
(0 within a frame, a large negative number across frames).  Output ``[n_tokens, out_hidden * (1 + D)]`` in
the compute dtype: the final merger's embedding, then the ``D`` DeepStack mergers' features.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, TensorValue, Weight, ops
from max.nn import LayerList, Module
from max.nn.norm import LayerNorm
from max.pipelines.architectures.common.layers import activation
from max.pipelines.architectures.common.multimodal import image_graph
from max.pipelines.architectures.common.weights import WeightFactory
from max.pipelines.architectures.qwen2_5vl.vision import (
    PatchEmbed,
    VisionAttention,
    block_positions,
    patch_mask,
    rope_angles,
)
from max.pipelines.architectures.qwen3vl.config import ARCHITECTURE, VisionConfig

__all__ = ["Qwen3VisionModel", "VisionLayout", "build_vision_graph", "vision_layout"]

_MASKED = -1e30
TAPS = 4


def _layer_norm(f: WeightFactory, dim: int) -> LayerNorm:
    return LayerNorm(dim, f.device, f.dtype, eps=1e-6)


class VisionMLP(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory, p: str) -> None:
        super().__init__()
        self.linear_fc1 = f.linear(f"{p}.linear_fc1", c.hidden_size, c.intermediate_size, has_bias=True)
        self.linear_fc2 = f.linear(f"{p}.linear_fc2", c.intermediate_size, c.hidden_size, has_bias=True)
        object.__setattr__(self, "_act", activation(c.hidden_act, ARCHITECTURE))

    def __call__(self, x: TensorValue) -> TensorValue:
        return self.linear_fc2(self._act(self.linear_fc1(x)))


class VisionBlock(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory, i: int) -> None:
        super().__init__()
        self.norm1 = _layer_norm(f, c.hidden_size)
        self.attn = VisionAttention(c, f, f"blocks.{i}.attn")
        self.norm2 = _layer_norm(f, c.hidden_size)
        self.mlp = VisionMLP(c, f, f"blocks.{i}.mlp")

    def __call__(self, x: TensorValue, cos: TensorValue, sin: TensorValue, mask: TensorValue) -> TensorValue:
        x = x + self.attn(self.norm1(x), cos, sin, mask)
        return x + self.mlp(self.norm2(x))


class PatchMerger(Module):
    """LayerNorm (per patch, or -- DeepStack's -- over the joined ``merge_size**2`` patches), the patches of
    each merge block joined, then a GELU MLP to the decoder's width."""

    def __init__(self, c: VisionConfig, f: WeightFactory, p: str, postshuffle: bool) -> None:
        super().__init__()
        self.wide = c.hidden_size * c.merge_unit
        self.postshuffle = postshuffle
        self.norm = _layer_norm(f, self.wide if postshuffle else c.hidden_size)
        self.linear_fc1 = f.linear(f"{p}.linear_fc1", self.wide, self.wide, has_bias=True)
        self.linear_fc2 = f.linear(f"{p}.linear_fc2", self.wide, c.out_hidden_size, has_bias=True)

    def __call__(self, x: TensorValue) -> TensorValue:
        x = self.norm(ops.reshape(x, [-1, self.wide])) if self.postshuffle else ops.reshape(self.norm(x),
                                                                                                [-1, self.wide])
        return self.linear_fc2(ops.gelu(self.linear_fc1(x)))


class _Table(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.weight = Weight("weight", f.dtype, [c.num_position_embeddings, c.hidden_size], f.device)


class Qwen3VisionModel(Module):
    """Module names are the checkpoint's without ``visual.`` (``patch_embed.proj``, ``pos_embed``,
    ``blocks.N.*``, ``merger.*``, ``deepstack_merger_list.K.*``)."""

    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.config = c
        self.dtype = f.dtype
        self.patch_embed = PatchEmbed(c, f, bias=True)
        self.pos_embed = _Table(c, f)
        self.blocks = LayerList([VisionBlock(c, f, i) for i in range(c.depth)])
        self.merger = PatchMerger(c, f, "merger", postshuffle=False)
        self.deepstack_merger_list = LayerList([PatchMerger(c, f, f"deepstack_merger_list.{k}", postshuffle=True)
                                                for k in range(len(c.deepstack_visual_indexes))])
        f.check_paths(self)

    def __call__(self, patches: TensorValue, pos_index: TensorValue, pos_weight: TensorValue, cos: TensorValue,
                 sin: TensorValue, mask: TensorValue) -> TensorValue:
        c = self.config
        s = patches.shape[0] * c.merge_unit  # patches
        x = self.patch_embed(ops.reshape(ops.cast(patches, self.dtype), [s, c.patch_dim]))
        taps = ops.gather(ops.cast(self.pos_embed.weight, DType.float32), ops.reshape(pos_index, [s * TAPS]), axis=0)
        pos = ops.sum(ops.reshape(taps, [s, TAPS, c.hidden_size]) * ops.reshape(pos_weight, [s, TAPS, 1]), axis=1)
        x = x + ops.cast(ops.reshape(pos, [s, c.hidden_size]), self.dtype)
        cos, sin = (ops.reshape(t, [s, 1, c.head_dim]) for t in (cos, sin))
        mask = patch_mask(mask, c.merge_unit)
        deep = []
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, mask)
            if i in c.deepstack_visual_indexes:
                deep.append(self.deepstack_merger_list[c.deepstack_visual_indexes.index(i)](x))
        return ops.concat([self.merger(x), *deep], axis=-1) if deep else self.merger(x)


def build_vision_graph(model: Qwen3VisionModel, device: DeviceRef) -> Graph:
    c = model.config
    f32 = DType.float32
    types = [TensorType(f32, ["n_tokens", c.merge_unit * c.patch_dim], device),
             TensorType(DType.int64, ["n_tokens", c.merge_unit * TAPS], device),
             TensorType(f32, ["n_tokens", c.merge_unit * TAPS], device),
             TensorType(f32, ["n_tokens", c.merge_unit * c.head_dim], device),
             TensorType(f32, ["n_tokens", c.merge_unit * c.head_dim], device),
             TensorType(f32, ["n_tokens", "n_tokens"], device)]
    return image_graph(model, f"{ARCHITECTURE}.vision", types)


@dataclass
class VisionLayout:
    """A batch of frames laid out for the image graph (see the module docstring)."""

    pos_index: np.ndarray
    pos_weight: np.ndarray
    cos: np.ndarray
    sin: np.ndarray
    mask: np.ndarray


def _axis_taps(index: np.ndarray, size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Bilinear taps (aligned corners) into a ``side``-long axis for positions ``index`` of a ``size``-long one."""
    src = index.astype(np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))
    lo = np.floor(src)
    offsets = np.arange(2, dtype=np.float32)
    weights = np.clip(1.0 - np.abs(src[:, None] - lo[:, None] - offsets), 0.0, None).astype(np.float32)
    taps = np.clip(lo.astype(np.int64)[:, None] + offsets.astype(np.int64), 0, side - 1)
    return taps, weights


def vision_layout(c: VisionConfig, grids: np.ndarray) -> VisionLayout:
    """The layout of images (or videos) with patch grids ``grids`` ``[n, 3]`` (t, h, w), their patches
    concatenated in the processor's order."""
    m, unit, side = c.spatial_merge_size, c.merge_unit, c.grid_side
    index, weight, hw, frame_of = [], [], [], []
    n_frame = 0
    for g in np.asarray(grids, np.int64).reshape(-1, 3):
        t, h, w = (int(v) for v in g)
        pos = block_positions(h, w, m)
        rt, rw = _axis_taps(pos[:, 0], h, side)
        ct, cw = _axis_taps(pos[:, 1], w, side)
        idx = (rt[:, :, None] * side + ct[:, None, :]).reshape(-1, TAPS)
        wt = (rw[:, :, None] * cw[:, None, :]).reshape(-1, TAPS)
        for _ in range(t):
            index.append(idx)
            weight.append(wt)
            hw.append(pos)
            frame_of.append(np.full(h * w // unit, n_frame))
            n_frame += 1
    n = sum(len(p) for p in hw) // unit
    ang = rope_angles(c.rope_theta, c.head_dim, np.concatenate(hw)).reshape(n, unit * c.head_dim)
    frames = np.concatenate(frame_of)
    return VisionLayout(pos_index=np.concatenate(index).reshape(n, unit * TAPS).astype(np.int64),
                        pos_weight=np.concatenate(weight).reshape(n, unit * TAPS).astype(np.float32),
                        cos=np.cos(ang).astype(np.float32), sin=np.sin(ang).astype(np.float32),
                        mask=np.where(frames[:, None] == frames[None, :], 0.0, _MASKED).astype(np.float32))
