"""The SigLIP vision transformer as ``max.nn`` modules (the image encoder of Gemma 3 multimodal and
Idefics3): non-overlapping patches (the stride-``patch`` convolution as one matmul over flattened
patches) plus learned position embeddings, pre-LayerNorm encoder layers (bidirectional attention, GELU
MLP), final LayerNorm.  Module names are the checkpoint's below the vision tower's prefix
(``embeddings.*``, ``encoder.layers.N.*``, ``post_layernorm``).
"""

from __future__ import annotations

from dataclasses import dataclass

from max.graph import TensorValue, Weight, ops
from max.nn import LayerList, LayerNorm, Module
from max.pipelines.architectures.common.layers import activation
from max.pipelines.architectures.common.vision_config import SquarePatchGrid
from max.pipelines.architectures.common.weights import WeightFactory

__all__ = ["PatchConv", "SiglipConfig", "SiglipMLP", "SiglipVisionTransformer", "flatten_patches", "full_attention",
           "pixel_shuffle", "siglip_fields", "split_heads"]


@dataclass(frozen=True)
class SiglipConfig(SquarePatchGrid):
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    image_size: int
    patch_size: int
    num_channels: int
    layer_norm_eps: float
    hidden_act: str


def siglip_fields(v: dict) -> dict:
    """:class:`SiglipConfig`'s fields from a Hugging Face vision config dict."""
    return dict(hidden_size=int(v["hidden_size"]), intermediate_size=int(v["intermediate_size"]),
                num_hidden_layers=int(v["num_hidden_layers"]), num_attention_heads=int(v["num_attention_heads"]),
                image_size=int(v["image_size"]), patch_size=int(v["patch_size"]),
                num_channels=int(v.get("num_channels", 3)), layer_norm_eps=float(v.get("layer_norm_eps", 1e-6)),
                hidden_act=str(v.get("hidden_act", "gelu_pytorch_tanh")))


class SiglipEmbeddings(Module):
    def __init__(self, c: SiglipConfig, f: WeightFactory) -> None:
        super().__init__()
        self.c = c
        self.patch_embedding = PatchConv(c, f)
        self.position_embedding = f.embedding("embeddings.position_embedding", c.patches_per_side ** 2, c.hidden_size)

    def __call__(self, pixels: TensorValue) -> TensorValue:
        return self.patch_embedding(flatten_patches(pixels, self.c)) + self.position_embedding.weight


def flatten_patches(pixels: TensorValue, c: SiglipConfig) -> TensorValue:
    """``[n, channels, image_size, image_size]`` -> ``[n, patches, channels * patch * patch]``, patches in row-major
    order, each flattened as the patch convolution reads it (channel, row, column)."""
    g, p = c.patches_per_side, c.patch_size
    n = pixels.shape[0]
    x = ops.reshape(pixels, [n, c.num_channels, g, p, g, p])
    x = ops.permute(x, [0, 2, 4, 1, 3, 5])  # [n, row, col, channel, py, px]
    return ops.reshape(x, [n, g * g, c.num_channels * p * p])


def pixel_shuffle(x: TensorValue, side: int, s: int) -> TensorValue:
    """``[n, side * side, d]`` (a row-major patch grid) -> ``[n, (side / s)^2, d * s * s]``: each ``s`` x ``s`` block of
    patches joined into one token (its patches row by row, each row's ``s`` patches side by side), as the
    Idefics3 connector and InternVL's ``pixel_shuffle`` do."""
    n, d = x.shape[0], x.shape[2]
    x = ops.permute(ops.reshape(x, [n, side, side // s, d * s]), [0, 2, 1, 3])  # [n, col block, row, s cols]
    x = ops.permute(ops.reshape(x, [n, side // s, side // s, d * s * s]), [0, 2, 1, 3])  # [n, row blk, col blk, ..]
    return ops.reshape(x, [n, (side // s) ** 2, d * s * s])


class PatchConv(Module):
    """The patch convolution (kernel = stride = patch): ``weight`` ``[hidden, channels, patch, patch]``."""

    def __init__(self, c: SiglipConfig, f: WeightFactory) -> None:
        super().__init__()
        self.weight = Weight("weight", f.dtype, [c.hidden_size, c.num_channels, c.patch_size, c.patch_size], f.device)
        self.bias = Weight("bias", f.dtype, [c.hidden_size], f.device)
        self.fan_in = c.num_channels * c.patch_size * c.patch_size

    def __call__(self, patches: TensorValue) -> TensorValue:
        w = ops.reshape(self.weight, [self.weight.shape[0], self.fan_in])
        return patches @ ops.transpose(w, 0, 1) + self.bias


def split_heads(x: TensorValue, n_heads: int, head_dim: int) -> TensorValue:
    """``[n, s, n_heads * head_dim]`` -> ``[n, n_heads, s, head_dim]``."""
    return ops.transpose(ops.reshape(x, [x.shape[0], x.shape[1], n_heads, head_dim]), 1, 2)


def full_attention(q: TensorValue, k: TensorValue, v: TensorValue) -> TensorValue:
    """Bidirectional (unmasked) attention of ``[n, heads, s, head_dim]`` queries, keys and values, the heads
    joined again: ``[n, s, heads * head_dim]``."""
    head_dim = int(q.shape[-1])
    scores = (q @ ops.transpose(k, -1, -2)) * (float(head_dim) ** -0.5)
    ctx = ops.softmax(scores) @ v  # one SDPA call after the engine's fusion
    return ops.reshape(ops.transpose(ctx, 1, 2), [q.shape[0], q.shape[2], int(q.shape[1]) * head_dim])


class SiglipAttention(Module):
    def __init__(self, c: SiglipConfig, f: WeightFactory, p: str) -> None:
        super().__init__()
        h = c.hidden_size
        self.n_heads, self.head_dim = c.num_attention_heads, c.head_dim
        self.q_proj = f.linear(f"{p}.q_proj", h, h, has_bias=True)
        self.k_proj = f.linear(f"{p}.k_proj", h, h, has_bias=True)
        self.v_proj = f.linear(f"{p}.v_proj", h, h, has_bias=True)
        self.out_proj = f.linear(f"{p}.out_proj", h, h, has_bias=True)

    def __call__(self, x: TensorValue) -> TensorValue:
        q, k, v = (split_heads(p(x), self.n_heads, self.head_dim) for p in (self.q_proj, self.k_proj, self.v_proj))
        return self.out_proj(full_attention(q, k, v))


class SiglipMLP(Module):
    """``fc2(act(fc1(x)))`` with biases (``who`` names the model in an unsupported-activation error)."""

    def __init__(self, c: SiglipConfig, f: WeightFactory, p: str, who: str = "SigLIP") -> None:
        super().__init__()
        self.fc1 = f.linear(f"{p}.fc1", c.hidden_size, c.intermediate_size, has_bias=True)
        self.fc2 = f.linear(f"{p}.fc2", c.intermediate_size, c.hidden_size, has_bias=True)
        object.__setattr__(self, "_act", activation(c.hidden_act, who))

    def __call__(self, x: TensorValue) -> TensorValue:
        return self.fc2(self._act(self.fc1(x)))


class SiglipEncoderLayer(Module):
    def __init__(self, c: SiglipConfig, f: WeightFactory, i: int) -> None:
        super().__init__()
        p = f"encoder.layers.{i}"
        self.layer_norm1 = LayerNorm(c.hidden_size, f.device, f.dtype, eps=c.layer_norm_eps)
        self.self_attn = SiglipAttention(c, f, f"{p}.self_attn")
        self.layer_norm2 = LayerNorm(c.hidden_size, f.device, f.dtype, eps=c.layer_norm_eps)
        self.mlp = SiglipMLP(c, f, f"{p}.mlp")

    def __call__(self, x: TensorValue) -> TensorValue:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class SiglipEncoder(Module):
    def __init__(self, c: SiglipConfig, f: WeightFactory) -> None:
        super().__init__()
        self.layers = LayerList([SiglipEncoderLayer(c, f, i) for i in range(c.num_hidden_layers)])

    def __call__(self, x: TensorValue) -> TensorValue:
        for layer in self.layers:
            x = layer(x)
        return x


class SiglipVisionTransformer(Module):
    """pixels ``[n, channels, image_size, image_size]`` (compute dtype) -> ``[n, patches, hidden]``.  A
    family's vision module subclasses it and adds its projector (the modules stay at the checkpoint's paths)."""

    def __init__(self, c: SiglipConfig, f: WeightFactory) -> None:
        super().__init__()
        self.config = c
        self.dtype = f.dtype
        self.embeddings = SiglipEmbeddings(c, f)
        self.encoder = SiglipEncoder(c, f)
        self.post_layernorm = LayerNorm(c.hidden_size, f.device, f.dtype, eps=c.layer_norm_eps)

    def encode(self, pixel_values: TensorValue) -> TensorValue:
        return self.post_layernorm(self.encoder(self.embeddings(ops.cast(pixel_values, self.dtype))))


def build_pixels_graph(model: Module, c: SiglipConfig, device: object, name: str) -> object:
    """A graph over ``pixel_values`` float32 ``[n_images, channels, image_size, image_size]`` -> ``model(...)``."""
    from max.dtype import DType
    from max.graph import Graph, TensorType

    t = TensorType(DType.float32, ["n_images", c.num_channels, c.image_size, c.image_size], device)
    with Graph(name, input_types=[t]) as g:
        g.output(model(g.inputs[0].tensor))
    return g
