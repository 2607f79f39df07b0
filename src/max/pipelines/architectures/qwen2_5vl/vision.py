"""The Qwen2.5-VL vision transformer as ``max.nn`` modules, its image graph, and the host-side layout of
a batch of images (window order, 2-D RoPE angles, attention blocks).

Graph inputs, one row per merged token (``merge_size**2`` patches), in window order: ``patches`` float32
``[n_tokens, unit * channels * temporal_patch * patch**2]`` (the processor's flattened patches),
``cos``/``sin`` float32 ``[n_tokens, unit * head_dim]`` (2-D RoPE: a patch's row position rotates the
first half of each half-head, its column the second), ``full_mask`` and ``window_mask`` float32
``[n_tokens, n_tokens]`` (0 inside a block, a large negative number outside: an image's frame for the
full-attention layers, a window for the others), and ``restore`` int64 ``[n_tokens]`` (window order ->
the images' row-major merged-token order).  Output:
``[n_tokens, out_hidden]`` in the compute dtype, one row per image placeholder token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, TensorValue, Weight, ops
from max.nn import LayerList, Module
from max.nn.norm import RMSNorm
from max.pipelines.architectures.common.layers import GatedMLP
from max.pipelines.architectures.common.multimodal import image_graph
from max.pipelines.architectures.common.weights import WeightFactory
from max.pipelines.architectures.qwen2_5vl.config import ARCHITECTURE, VisionConfig, inv_freq

__all__ = ["Qwen2_5VisionModel", "VisionAttention", "VisionLayout", "block_positions", "build_vision_graph",
           "layout_patches", "patch_mask", "rope_angles", "vision_layout"]

_MASKED = -1e30


def _rotate(x: TensorValue, cos: TensorValue, sin: TensorValue) -> TensorValue:
    """Rotate-half RoPE over the whole head, in float32."""
    half = int(x.shape[-1]) // 2
    xf = ops.cast(x, DType.float32)
    rot = ops.concat([-xf[..., half:], xf[..., :half]], axis=-1)
    return ops.cast(xf * cos + rot * sin, x.dtype)


class VisionAttention(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory, p: str) -> None:
        super().__init__()
        self.n_heads, self.head_dim = c.num_heads, c.head_dim
        self.qkv = f.linear(f"{p}.qkv", c.hidden_size, 3 * c.hidden_size, has_bias=True)
        self.proj = f.linear(f"{p}.proj", c.hidden_size, c.hidden_size, has_bias=True)

    def __call__(self, x: TensorValue, cos: TensorValue, sin: TensorValue, mask: TensorValue) -> TensorValue:
        s, H, D = x.shape[0], self.n_heads, self.head_dim
        qkv = ops.reshape(self.qkv(x), [s, 3, H, D])
        q, k, v = (ops.transpose(t, 0, 1) for t in (_rotate(qkv[:, 0], cos, sin), _rotate(qkv[:, 1], cos, sin),
                                                    qkv[:, 2]))  # [H, s, D]
        scores = (q @ ops.transpose(k, -1, -2)) * (float(D) ** -0.5) + ops.cast(mask, x.dtype)
        out = ops.softmax(scores) @ v
        return self.proj(ops.reshape(ops.transpose(out, 0, 1), [s, H * D]))


class VisionBlock(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory, i: int) -> None:
        super().__init__()
        p = f"blocks.{i}"
        self.full = i in c.fullatt_block_indexes
        self.norm1 = RMSNorm(c.hidden_size, f.dtype, 1e-6)
        self.attn = VisionAttention(c, f, f"{p}.attn")
        self.norm2 = RMSNorm(c.hidden_size, f.dtype, 1e-6)
        self.mlp = GatedMLP(f"{p}.mlp", f, c.hidden_size, c.intermediate_size, c.hidden_act, has_bias=True,
                            who=ARCHITECTURE)

    def __call__(self, x: TensorValue, cos: TensorValue, sin: TensorValue, full_mask: TensorValue,
                 window_mask: TensorValue) -> TensorValue:
        x = x + self.attn(self.norm1(x), cos, sin, full_mask if self.full else window_mask)
        return x + self.mlp(self.norm2(x))


class PatchEmbed(Module):
    """The patch convolution (kernel = stride = patch; Qwen2.5-VL: no bias) as one matmul: ``proj.weight``
    ``[hidden, channels, temporal_patch, patch, patch]`` (and ``proj.bias`` ``[hidden]``)."""

    def __init__(self, c: VisionConfig, f: WeightFactory, bias: bool = False) -> None:
        super().__init__()
        self.c = c
        self.proj = _ConvWeight(c, f, bias)

    def __call__(self, patches: TensorValue) -> TensorValue:
        w = ops.reshape(self.proj.weight, [self.c.hidden_size, self.c.patch_dim])
        out = patches @ ops.transpose(w, 0, 1)
        return out if self.proj.bias is None else out + self.proj.bias


class _ConvWeight(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory, bias: bool) -> None:
        super().__init__()
        self.weight = Weight("weight", f.dtype, [c.hidden_size, c.in_channels, c.temporal_patch_size, c.patch_size,
                                                 c.patch_size], f.device)
        self.bias = Weight("bias", f.dtype, [c.hidden_size], f.device) if bias else None


class PatchMerger(Module):
    """RMSNorm, then each ``merge_size**2`` neighbouring patches joined and sent through a GELU MLP."""

    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.c = c
        wide = c.hidden_size * c.merge_unit
        self.ln_q = RMSNorm(c.hidden_size, f.dtype, 1e-6)
        self.fc1 = f.linear("merger.fc1", wide, wide, has_bias=True)
        self.fc2 = f.linear("merger.fc2", wide, c.out_hidden_size, has_bias=True)

    def __call__(self, x: TensorValue) -> TensorValue:
        x = ops.reshape(self.ln_q(x), [-1, self.c.hidden_size * self.c.merge_unit])
        return self.fc2(ops.gelu(self.fc1(x)))


class Qwen2_5VisionModel(Module):
    """Module names are the checkpoint's after ``weight_adapters.split`` (``patch_embed.proj``,
    ``blocks.N.*``, ``merger.*``)."""

    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.config = c
        self.dtype = f.dtype
        self.patch_embed = PatchEmbed(c, f)
        self.blocks = LayerList([VisionBlock(c, f, i) for i in range(c.depth)])
        self.merger = PatchMerger(c, f)
        f.check_paths(self)

    def __call__(self, patches: TensorValue, cos: TensorValue, sin: TensorValue, full_mask: TensorValue,
                 window_mask: TensorValue, restore: TensorValue) -> TensorValue:
        c = self.config
        n = patches.shape[0]  # merged tokens: every row holds one merge block's patches
        s = n * c.merge_unit
        x = self.patch_embed(ops.reshape(ops.cast(patches, self.dtype), [s, c.patch_dim]))
        cos, sin = (ops.reshape(t, [s, 1, c.head_dim]) for t in (cos, sin))
        full, window = (patch_mask(mk, c.merge_unit) for mk in (full_mask, window_mask))
        for block in self.blocks:
            x = block(x, cos, sin, full, window)
        return ops.gather(self.merger(x), restore, axis=0)


def patch_mask(token_mask: TensorValue, unit: int) -> TensorValue:
    """A merged-token mask ``[n, n]`` at patch level ``[n * unit, n * unit]`` (blocks never split a merge unit)."""
    n = token_mask.shape[0]
    m = ops.broadcast_to(ops.reshape(token_mask, [n, 1, n, 1]), [n, unit, n, unit])
    return ops.reshape(m, [n * unit, n * unit])


def build_vision_graph(model: Qwen2_5VisionModel, device: DeviceRef) -> Graph:
    c = model.config
    f32 = DType.float32
    types = [TensorType(f32, ["n_tokens", c.merge_unit * c.patch_dim], device),
             TensorType(f32, ["n_tokens", c.merge_unit * c.head_dim], device),
             TensorType(f32, ["n_tokens", c.merge_unit * c.head_dim], device),
             TensorType(f32, ["n_tokens", "n_tokens"], device), TensorType(f32, ["n_tokens", "n_tokens"], device),
             TensorType(DType.int64, ["n_tokens"], device)]
    return image_graph(model, f"{ARCHITECTURE}.vision", types)


@dataclass
class VisionLayout:
    """A batch of images laid out for the image graph (see the module docstring)."""

    order: np.ndarray
    """Patch permutation: row ``i`` of the graph's patches is the processor's row ``order[i]``."""
    cos: np.ndarray
    sin: np.ndarray
    full_mask: np.ndarray
    window_mask: np.ndarray
    restore: np.ndarray


def vision_layout(c: VisionConfig, grids: np.ndarray) -> VisionLayout:
    """The layout of images with patch grids ``grids`` ``[n, 3]`` (t, h, w), their patches concatenated in
    the processor's order (each merge block's patches together, blocks row-major)."""
    m, vw, unit = c.spatial_merge_size, c.window_tokens, c.merge_unit
    tokens: list[int] = []  # merged tokens in window order
    window_of: list[int] = []  # window id of each of them
    frame_of: list[int] = []  # frame id of each of them
    rows: list[np.ndarray] = []  # (row, col) of every patch in the processor's order
    base = n_win = n_frame = 0
    for g in grids:
        t, h, w = (int(v) for v in g)
        H, W = h // m, w // m
        pos = block_positions(h, w, m)
        for ti in range(t):
            rows.append(pos)
            for r0 in range(0, H, vw):
                for c0 in range(0, W, vw):
                    for r in range(r0, min(H, r0 + vw)):
                        for col in range(c0, min(W, c0 + vw)):
                            tokens.append(base + ti * H * W + r * W + col)
                            window_of.append(n_win)
                            frame_of.append(n_frame)
                    n_win += 1
            n_frame += 1
        base += t * H * W
    order_tok = np.asarray(tokens, np.int64)
    order = (order_tok[:, None] * unit + np.arange(unit)).reshape(-1)
    hw = np.concatenate(rows)[order]  # [n_patches, 2] (row, col) in window order
    ang = rope_angles(c.rope_theta, c.head_dim, hw).reshape(len(order_tok), unit * c.head_dim)

    def blocks(ids: list[int]) -> np.ndarray:
        b = np.asarray(ids)
        return np.where(b[:, None] == b[None, :], 0.0, _MASKED).astype(np.float32)

    return VisionLayout(order=order, cos=np.cos(ang), sin=np.sin(ang), full_mask=blocks(frame_of),
                        window_mask=blocks(window_of), restore=np.argsort(order_tok).astype(np.int64))


def block_positions(h: int, w: int, m: int) -> np.ndarray:
    """``[h * w, 2]`` (row, col) of a frame's patches in the processors' order: ``m x m`` merge blocks
    row-major, each block's patches row-major."""
    by, bx = np.meshgrid(np.arange(h // m), np.arange(w // m), indexing="ij")
    iy, ix = np.meshgrid(np.arange(m), np.arange(m), indexing="ij")
    return np.stack([(by[..., None, None] * m + iy).reshape(-1), (bx[..., None, None] * m + ix).reshape(-1)], -1)


def rope_angles(theta: float, head_dim: int, hw: np.ndarray) -> np.ndarray:
    """2-D RoPE angles ``[n, head_dim]`` of patches at (row, col) ``hw`` ``[n, 2]``: the row turns the first
    quarter of the frequencies, the column the second, repeated for the rotate-half pairs."""
    f = inv_freq(theta, head_dim // 2)
    hw = np.asarray(hw, np.float32)
    ang = np.concatenate([hw[:, :1] * f, hw[:, 1:] * f], axis=-1)
    return np.concatenate([ang, ang], axis=-1)


def layout_patches(c: VisionConfig, patches: np.ndarray, layout: VisionLayout) -> np.ndarray:
    """The processor's patches ``[n_patches, patch_dim]`` as the graph's ``[n_tokens, unit * patch_dim]``."""
    return np.ascontiguousarray(patches[layout.order].reshape(-1, c.merge_unit * c.patch_dim), dtype=np.float32)
