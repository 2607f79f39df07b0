"""Llama 4's image model: the vision encoder and the multimodal projector, and the image graph.

Encoder: each tile's non-overlapping patches (``unfold``: channel, row, column) through one linear, a learned
class embedding appended after the patches, learned positions, LayerNorm; pre-LayerNorm layers of
bidirectional attention with a 2-D RoPE (interleaved pairs: the first half of each head's pairs turn with the
patch's column + 1, the second half with its row + 1; the class token is not turned) and an exact-GELU MLP;
LayerNorm.  The class row is dropped, each ``s`` x ``s`` patches are joined by the pixel shuffle and go
through the adapter MLP (linear, GELU, linear, GELU, no biases); the projector's linear maps them to the text
width.

Graph input: ``pixel_values`` float32 ``[n_tiles, channels, image_size, image_size]`` (each image's tiles,
then its global view when it has more than one tile).  Output: ``[n_tiles, tokens_per_tile, text_hidden]``.
"""

from __future__ import annotations

import numpy as np

from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, TensorValue, Weight, ops
from max.graph.rope import rope_inv_freq
from max.nn import LayerList, LayerNorm, Module
from max.pipelines.architectures.common.multimodal import image_graph
from max.pipelines.architectures.common.siglip import flatten_patches, full_attention, pixel_shuffle
from max.pipelines.architectures.common.weights import WeightFactory
from max.pipelines.architectures.llama4vision.config import ARCHITECTURE, VisionConfig

__all__ = ["Llama4VisionEncoder", "build_vision_graph", "rope_angles"]


def rope_angles(c: VisionConfig) -> np.ndarray:
    """``[patches + 1, head_dim / 2]`` float64: each position's angle per interleaved pair (the last position
    is the class token: 0)."""
    side, k = c.patches_per_side, c.head_dim // 4
    freq = rope_inv_freq(c.rope_theta, 2 * k)
    idx = np.arange(side * side)
    col, row = idx % side + 1, idx // side + 1
    angles = np.concatenate([col[:, None] * freq, row[:, None] * freq], axis=1)
    return np.concatenate([angles, np.zeros((1, 2 * k))])


def _rotate_pairs(x: TensorValue, cos: TensorValue, sin: TensorValue) -> TensorValue:
    """``x`` ``[n, seq, heads, head_dim]`` with each pair ``(x[2i], x[2i+1])`` turned by its angle (``cos``/``sin``
    ``[seq, 1, head_dim]``, each pair's value twice), in float32."""
    xf = ops.cast(x, DType.float32)
    n, s, h, d = xf.shape
    pairs = ops.reshape(xf, [n, s, h, int(d) // 2, 2])
    rot = ops.reshape(ops.concat([-pairs[..., 1:2], pairs[..., 0:1]], axis=-1), [n, s, h, d])
    return ops.cast(xf * cos + rot * sin, x.dtype)


class _Linear(Module):
    def __init__(self, f: WeightFactory, name: str, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.linear = f.linear(f"{name}.linear", in_dim, out_dim)


class Attention(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory, p: str) -> None:
        super().__init__()
        h = c.hidden_size
        self.n_heads, self.head_dim = c.num_attention_heads, c.head_dim
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self, name, f.linear(f"{p}.{name}", h, h, has_bias=True))

    def __call__(self, x: TensorValue, cos: TensorValue, sin: TensorValue) -> TensorValue:
        n, s = x.shape[0], x.shape[1]

        def heads(t: TensorValue) -> TensorValue:
            return ops.reshape(t, [n, s, self.n_heads, self.head_dim])

        q = _rotate_pairs(heads(self.q_proj(x)), cos, sin)
        k = _rotate_pairs(heads(self.k_proj(x)), cos, sin)
        q, k, v = (ops.transpose(t, 1, 2) for t in (q, k, heads(self.v_proj(x))))
        return self.o_proj(full_attention(q, k, v))


class MLP(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory, p: str) -> None:
        super().__init__()
        self.fc1 = f.linear(f"{p}.fc1", c.hidden_size, c.intermediate_size, has_bias=True)
        self.fc2 = f.linear(f"{p}.fc2", c.intermediate_size, c.hidden_size, has_bias=True)

    def __call__(self, x: TensorValue) -> TensorValue:
        return self.fc2(ops.gelu(self.fc1(x)))


class EncoderLayer(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory, i: int) -> None:
        super().__init__()
        p = f"model.layers.{i}"
        self.input_layernorm = LayerNorm(c.hidden_size, f.device, f.dtype, eps=1e-5)
        self.self_attn = Attention(c, f, f"{p}.self_attn")
        self.post_attention_layernorm = LayerNorm(c.hidden_size, f.device, f.dtype, eps=1e-5)
        self.mlp = MLP(c, f, f"{p}.mlp")

    def __call__(self, x: TensorValue, cos: TensorValue, sin: TensorValue) -> TensorValue:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class _Layers(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.layers = LayerList([EncoderLayer(c, f, i) for i in range(c.num_hidden_layers)])


class _AdapterMLP(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.fc1 = f.linear("vision_adapter.mlp.fc1", c.intermediate_size, c.projector_input_dim)
        self.fc2 = f.linear("vision_adapter.mlp.fc2", c.projector_output_dim, c.projector_output_dim)

    def __call__(self, x: TensorValue) -> TensorValue:
        return ops.gelu(self.fc2(ops.gelu(self.fc1(x))))


class _Adapter(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.mlp = _AdapterMLP(c, f)


class _Projector(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.linear_1 = f.linear("multi_modal_projector.linear_1", c.projector_output_dim, c.text_hidden_size)


class Llama4VisionEncoder(Module):
    """pixels -> encoder -> adapter -> projector: ``[n_tiles, tokens_per_tile, text_hidden]``.  Module names are
    the checkpoint's after the family's vision adapter."""

    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.config = c
        self.dtype = f.dtype
        n_pos = c.patches_per_side ** 2 + 1
        self.patch_embedding = _Linear(f, "patch_embedding", c.num_channels * c.patch_size ** 2, c.hidden_size)
        self.class_embedding = Weight("class_embedding", f.dtype, [c.hidden_size], f.device)
        self.positional_embedding_vlm = Weight("positional_embedding_vlm", f.dtype, [n_pos, c.hidden_size], f.device)
        self.layernorm_pre = LayerNorm(c.hidden_size, f.device, f.dtype, eps=1e-5)
        self.layernorm_post = LayerNorm(c.hidden_size, f.device, f.dtype, eps=1e-5)
        self.model = _Layers(c, f)
        self.vision_adapter = _Adapter(c, f)
        self.multi_modal_projector = _Projector(c, f)
        f.check_paths(self)

    def __call__(self, pixel_values: TensorValue) -> TensorValue:
        c = self.config
        x = self.patch_embedding.linear(flatten_patches(ops.cast(pixel_values, self.dtype), c))
        n = x.shape[0]
        cls = ops.broadcast_to(ops.reshape(self.class_embedding, [1, 1, c.hidden_size]), [n, 1, c.hidden_size])
        x = self.layernorm_pre(ops.concat([x, cls], axis=1) + self.positional_embedding_vlm)
        angles = rope_angles(c)
        dev = pixel_values.device
        cos = ops.constant(np.repeat(np.cos(angles), 2, axis=1)[:, None, :].astype(np.float32), DType.float32, dev)
        sin = ops.constant(np.repeat(np.sin(angles), 2, axis=1)[:, None, :].astype(np.float32), DType.float32, dev)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        x = self.layernorm_post(x)
        x = ops.slice_tensor(x, [slice(None), slice(0, c.patches_per_side ** 2), slice(None)])  # the class row: out
        x = self.vision_adapter.mlp(pixel_shuffle(x, c.patches_per_side, c.scale_factor))
        return self.multi_modal_projector.linear_1(x)


def build_vision_graph(model: Llama4VisionEncoder, device: DeviceRef) -> Graph:
    c = model.config
    t = TensorType(DType.float32, ["n_tiles", c.num_channels, c.image_size, c.image_size], device)
    return image_graph(model, f"{ARCHITECTURE}.vision", [t])
