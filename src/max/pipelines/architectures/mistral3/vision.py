"""Mistral 3's image model: the Pixtral encoder and the multimodal projector as ``max.nn`` modules, the
image graph, and the host-side layout of a batch of images of different sizes.

Pixtral: each image's ``patch x patch`` patches through one matmul (the stride-``patch`` convolution),
RMSNorm (``ln_pre``), then pre-norm layers (RMSNorm, attention with 2-D RoPE, RMSNorm, gated MLP).  A
patch at grid (row, col) rotates the first quarter of frequencies of each half-head by its row and the
second quarter by its column (frequency ``j`` of the usual ``theta ** (-2j / head_dim)`` goes to the row
for even ``j``, to the column for odd ``j``).  Attention is bidirectional within an image and never
across images (block-diagonal: ragged attention over the images' patch runs).  Projector: RMSNorm, the
patch merger (each ``merge x merge`` block of patches concatenated channel-major then projected back to
the vision width), then linear, activation, linear to the text width (Llava over a Pixtral tower, e.g.
Pixtral 12B: the two linear layers alone, no merge).

Graph inputs, one row per image token (a merge block of ``merge**2`` patches): ``patches`` float32
``[n_tokens, merge**2 * channels * patch**2]`` (each image's merge blocks row-major, the block's patches
row-major inside a row, images one after another), ``cos``/``sin`` float32 ``[n_tokens, merge**2 *
head_dim / 2]`` (the patches' rotation angles) and ``image_offsets`` uint32 ``[n_images + 1]`` (each
image's first patch).  Output: ``[n_tokens, text_hidden]`` in the compute dtype, one row per image token in the
prompt's order (each image's merged tokens row-major).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, TensorValue, Weight, ops
from max.nn import LayerList, Module
from max.nn.kernels import MHAMaskVariant
from max.nn.kernels_attention import flash_attention_ragged_gpu
from max.nn.kernels_decoder import ragged_rope
from max.nn.norm import RMSNorm
from max.pipelines.architectures.common.layers import GatedMLP, activation
from max.pipelines.architectures.common.multimodal import image_graph
from max.pipelines.architectures.common.weights import WeightFactory
from max.pipelines.architectures.mistral3.config import ARCHITECTURE, VisionConfig
from max.pipelines.architectures.qwen2_5vl.config import inv_freq

__all__ = ["ImageLayout", "Mistral3VisionModel", "build_vision_graph", "image_layout"]

_EPS = 1e-5  # Pixtral's RMSNorm epsilon


class PixtralAttention(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory, p: str) -> None:
        super().__init__()
        self.n_heads, self.head_dim = c.num_attention_heads, c.head_dim
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            f.linear(f"{p}.{n}", c.hidden_size, c.hidden_size) for n in ("q_proj", "k_proj", "v_proj", "o_proj"))

    def __call__(self, x: TensorValue, cos: TensorValue, sin: TensorValue, offsets: TensorValue) -> TensorValue:
        s, H, D = x.shape[0], self.n_heads, self.head_dim
        q, k, v = (ops.reshape(proj(x), [s, H, D]) for proj in (self.q_proj, self.k_proj, self.v_proj))
        out = flash_attention_ragged_gpu(ragged_rope(q, cos, sin), ragged_rope(k, cos, sin), v, offsets, 0,
                                         MHAMaskVariant.NULL_MASK, float(D) ** -0.5)
        return self.o_proj(ops.reshape(out, [s, H * D]))


class PixtralLayer(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory, i: int) -> None:
        super().__init__()
        p = f"transformer.layers.{i}"
        self.attention_norm = RMSNorm(c.hidden_size, f.dtype, _EPS)
        self.attention = PixtralAttention(c, f, f"{p}.attention")
        self.ffn_norm = RMSNorm(c.hidden_size, f.dtype, _EPS)
        self.feed_forward = GatedMLP(f"{p}.feed_forward", f, c.hidden_size, c.intermediate_size, c.hidden_act,
                                     who=ARCHITECTURE)

    def __call__(self, x: TensorValue, cos: TensorValue, sin: TensorValue, offsets: TensorValue) -> TensorValue:
        x = x + self.attention(self.attention_norm(x), cos, sin, offsets)
        return x + self.feed_forward(self.ffn_norm(x))


class _Transformer(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.layers = LayerList([PixtralLayer(c, f, i) for i in range(c.num_hidden_layers)])


class _PatchConv(Module):
    """The patch convolution's weight ``[hidden, channels, patch, patch]`` (no bias)."""

    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.weight = Weight("weight", f.dtype, [c.hidden_size, c.num_channels, c.patch_size, c.patch_size], f.device)


class _PatchMerger(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.merging_layer = f.linear("multi_modal_projector.patch_merger.merging_layer",
                                      c.hidden_size * c.merge_unit, c.hidden_size)


class MultiModalProjector(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.c = c
        if c.merger:
            self.norm = RMSNorm(c.hidden_size, f.dtype, c.projector_norm_eps)
            self.patch_merger = _PatchMerger(c, f)
        p = "multi_modal_projector"
        self.linear_1 = f.linear(f"{p}.linear_1", c.hidden_size, c.text_hidden_size, c.projector_bias)
        self.linear_2 = f.linear(f"{p}.linear_2", c.text_hidden_size, c.text_hidden_size, c.projector_bias)
        object.__setattr__(self, "_act", activation(c.projector_act, ARCHITECTURE))

    def __call__(self, x: TensorValue, n_tokens: Any) -> TensorValue:
        if self.c.merger:
            unit, d = self.c.merge_unit, self.c.hidden_size
            x = ops.reshape(self.norm(x), [n_tokens, unit, d])  # one row per merge block, its patches row-major
            x = ops.reshape(ops.permute(x, [0, 2, 1]), [n_tokens, d * unit])  # channel-major: c * unit + k
            x = self.patch_merger.merging_layer(x)
        return self.linear_2(self._act(self.linear_1(x)))


class Mistral3VisionModel(Module):
    """Module names are the checkpoint's after the family's weight adapter (``patch_conv``, ``ln_pre``,
    ``transformer.layers.N.*``, ``multi_modal_projector.*``)."""

    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.config = c
        self.dtype = f.dtype
        self.patch_conv = _PatchConv(c, f)
        self.ln_pre = RMSNorm(c.hidden_size, f.dtype, _EPS)
        self.transformer = _Transformer(c, f)
        self.multi_modal_projector = MultiModalProjector(c, f)
        f.check_paths(self)

    def __call__(self, patches: TensorValue, cos: TensorValue, sin: TensorValue,
                 offsets: TensorValue) -> TensorValue:
        c = self.config
        n = patches.shape[0]
        s = n * c.merge_unit
        w = ops.reshape(self.patch_conv.weight, [c.hidden_size, c.patch_dim])
        x = self.ln_pre(ops.reshape(ops.cast(patches, self.dtype), [s, c.patch_dim]) @ ops.transpose(w, 0, 1))
        cos, sin = (ops.reshape(t, [s, 1, c.head_dim // 2]) for t in (cos, sin))
        for layer in list(self.transformer.layers)[:c.feature_layer]:  # later layers do not feed the projector
            x = layer(x, cos, sin, offsets)
        return self.multi_modal_projector(x, n)


def build_vision_graph(model: Mistral3VisionModel, device: DeviceRef) -> Graph:
    c = model.config
    f32 = DType.float32
    rot = TensorType(f32, ["n_tokens", c.merge_unit * c.head_dim // 2], device)
    types = [TensorType(f32, ["n_tokens", c.merge_unit * c.patch_dim], device), rot, rot,
             TensorType(DType.uint32, ["n_images_plus_1"], device)]
    return image_graph(model, f"{ARCHITECTURE}.vision", types)


@dataclass
class ImageLayout:
    """A batch of images laid out for the image graph (see the module docstring)."""

    patches: np.ndarray
    cos: np.ndarray
    sin: np.ndarray
    offsets: np.ndarray
    tokens: list[int]
    """Image tokens (graph output rows) of each image."""


def image_layout(c: VisionConfig, images: list[np.ndarray]) -> ImageLayout:
    """The layout of ``images`` (each ``[channels, height, width]``, sides multiples of ``token_pixels``),
    in the order given."""
    p, m = c.patch_size, c.spatial_merge_size
    half = c.head_dim // 2
    inv = inv_freq(c.rope_theta, c.head_dim)
    inv_row, inv_col = inv[0::2], inv[1::2]
    rows, angles, offsets, tokens = [], [], [0], []
    for i, im in enumerate(images):
        ch, h, w = im.shape
        if ch != c.num_channels or h % c.token_pixels or w % c.token_pixels or not h or not w:
            raise ValueError(f"{ARCHITECTURE}: image {i} is {list(im.shape)}; the vision encoder takes "
                             f"{c.num_channels} channels and sides that are non-zero multiples of {c.token_pixels} "
                             "pixels (the processor's patch size times spatial_merge_size)")
        bh, bw = h // (p * m), w // (p * m)
        x = np.asarray(im, np.float32).reshape(ch, bh, m, p, bw, m, p)
        rows.append(x.transpose(1, 4, 2, 5, 0, 3, 6).reshape(-1, c.patch_dim))  # [bh, bw, ki, kj] x [ch, py, px]
        by, bx, ki, kj = np.meshgrid(np.arange(bh), np.arange(bw), np.arange(m), np.arange(m), indexing="ij")
        r = (by * m + ki).reshape(-1, 1).astype(np.float32)
        col = (bx * m + kj).reshape(-1, 1).astype(np.float32)
        angles.append(np.concatenate([r * inv_row, col * inv_col], axis=-1))
        offsets.append(offsets[-1] + bh * bw * m * m)
        tokens.append(bh * bw)
    unit = c.merge_unit
    ang = np.concatenate(angles).reshape(-1, unit * half) if angles else np.zeros((0, unit * half), np.float32)
    return ImageLayout(patches=np.ascontiguousarray(np.concatenate(rows).reshape(-1, unit * c.patch_dim), np.float32),
                       cos=np.cos(ang).astype(np.float32), sin=np.sin(ang).astype(np.float32),
                       offsets=np.asarray(offsets, np.uint32), tokens=tokens)
