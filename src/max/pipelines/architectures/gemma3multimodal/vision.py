"""The SigLIP vision tower and Gemma 3's multimodal projector as ``max.nn`` modules, and the image graph.

Graph input: ``pixel_values`` float32 ``[n_images, channels, image_size, image_size]`` (the processor's
output).  Output: ``[n_images, mm_tokens_per_image, text_hidden]`` image embeddings in the compute dtype,
the rows that replace the image placeholder tokens of the text sequence.

SigLIP: non-overlapping patches (the stride-``patch`` convolution as one matmul over flattened patches)
plus learned position embeddings, pre-LayerNorm encoder layers (bidirectional attention, GELU MLP),
final LayerNorm.  Projector: average pool of the patch grid to ``tokens_per_side``\\ :sup:`2` tokens,
Gemma RMSNorm (``1 + weight``), ``x @ mm_input_projection_weight``.
"""

from __future__ import annotations

from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, TensorValue, Weight, ops
from max.nn import LayerList, LayerNorm, Module
from max.nn.norm import RMSNorm
from max.pipelines.architectures.common.layers import activation
from max.pipelines.architectures.common.weights import WeightFactory
from max.pipelines.architectures.gemma3multimodal.config import ARCHITECTURE, VisionConfig

__all__ = ["Gemma3VisionModel", "build_vision_graph"]


class SiglipEmbeddings(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.c = c
        self.patch_embedding = _Conv(c, f)
        self.position_embedding = f.embedding("embeddings.position_embedding", c.patches_per_side ** 2, c.hidden_size)

    def __call__(self, pixels: TensorValue) -> TensorValue:
        c = self.c
        g, p = c.patches_per_side, c.patch_size
        n = pixels.shape[0]
        x = ops.reshape(pixels, [n, c.num_channels, g, p, g, p])
        x = ops.permute(x, [0, 2, 4, 1, 3, 5])  # [n, row, col, channel, py, px]: a patch's pixels as the conv reads them
        x = ops.reshape(x, [n, g * g, c.num_channels * p * p])
        return self.patch_embedding(x) + self.position_embedding.weight


class _Conv(Module):
    """The patch convolution (kernel = stride = patch): ``weight`` ``[hidden, channels, patch, patch]``."""

    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.weight = Weight("weight", f.dtype, [c.hidden_size, c.num_channels, c.patch_size, c.patch_size], f.device)
        self.bias = Weight("bias", f.dtype, [c.hidden_size], f.device)
        self.fan_in = c.num_channels * c.patch_size * c.patch_size

    def __call__(self, patches: TensorValue) -> TensorValue:
        w = ops.reshape(self.weight, [self.weight.shape[0], self.fan_in])
        return patches @ ops.transpose(w, 0, 1) + self.bias


class SiglipAttention(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory, p: str) -> None:
        super().__init__()
        h = c.hidden_size
        self.n_heads, self.head_dim = c.num_attention_heads, c.head_dim
        self.q_proj = f.linear(f"{p}.q_proj", h, h, has_bias=True)
        self.k_proj = f.linear(f"{p}.k_proj", h, h, has_bias=True)
        self.v_proj = f.linear(f"{p}.v_proj", h, h, has_bias=True)
        self.out_proj = f.linear(f"{p}.out_proj", h, h, has_bias=True)

    def _heads(self, x: TensorValue) -> TensorValue:
        return ops.transpose(ops.reshape(x, [x.shape[0], x.shape[1], self.n_heads, self.head_dim]), 1, 2)

    def __call__(self, x: TensorValue) -> TensorValue:
        n, s = x.shape[0], x.shape[1]
        q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
        scores = (q @ ops.transpose(k, -1, -2)) * (float(self.head_dim) ** -0.5)
        ctx = ops.softmax(scores) @ v  # one SDPA call after the engine's fusion
        return self.out_proj(ops.reshape(ops.transpose(ctx, 1, 2), [n, s, self.n_heads * self.head_dim]))


class SiglipMLP(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory, p: str) -> None:
        super().__init__()
        self.fc1 = f.linear(f"{p}.fc1", c.hidden_size, c.intermediate_size, has_bias=True)
        self.fc2 = f.linear(f"{p}.fc2", c.intermediate_size, c.hidden_size, has_bias=True)
        object.__setattr__(self, "_act", activation(c.hidden_act, ARCHITECTURE))

    def __call__(self, x: TensorValue) -> TensorValue:
        return self.fc2(self._act(self.fc1(x)))


class SiglipEncoderLayer(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory, i: int) -> None:
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
    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.layers = LayerList([SiglipEncoderLayer(c, f, i) for i in range(c.num_hidden_layers)])

    def __call__(self, x: TensorValue) -> TensorValue:
        for layer in self.layers:
            x = layer(x)
        return x


class MultiModalProjector(Module):
    """Average pool of the ``patches_per_side``\\ :sup:`2` grid to ``tokens_per_side``\\ :sup:`2` tokens,
    RMSNorm (``1 + weight``, float32), projection to the text width."""

    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.c = c
        self.mm_soft_emb_norm = RMSNorm(c.hidden_size, f.dtype, c.layer_norm_eps, weight_offset=1.0,
                                        multiply_before_cast=True)
        self.mm_input_projection_weight = Weight("mm_input_projection_weight", f.dtype,
                                                 [c.hidden_size, c.text_hidden_size], f.device)

    def __call__(self, x: TensorValue) -> TensorValue:
        c = self.c
        n, t = x.shape[0], c.tokens_per_side
        k = c.patches_per_side // t
        x = ops.reshape(x, [n, t, k, t, k, c.hidden_size])  # patch (row, col) = (tr * k + kr, tc * k + kc)
        x = ops.reshape(ops.permute(x, [0, 1, 3, 5, 2, 4]), [n, t * t, c.hidden_size, k * k])
        pooled = ops.reshape(ops.mean(x, axis=-1), [n, t * t, c.hidden_size])
        return self.mm_soft_emb_norm(pooled) @ self.mm_input_projection_weight


class Gemma3VisionModel(Module):
    """pixels -> SigLIP -> projector: ``[n_images, mm_tokens_per_image, text_hidden]``.  Module names are the
    checkpoint's after ``weight_adapters.split`` (``embeddings.*``, ``encoder.layers.*``, ``post_layernorm``,
    ``multi_modal_projector.*``)."""

    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.config = c
        self.dtype = f.dtype
        self.embeddings = SiglipEmbeddings(c, f)
        self.encoder = SiglipEncoder(c, f)
        self.post_layernorm = LayerNorm(c.hidden_size, f.device, f.dtype, eps=c.layer_norm_eps)
        self.multi_modal_projector = MultiModalProjector(c, f)
        f.check_paths(self)

    def __call__(self, pixel_values: TensorValue) -> TensorValue:
        x = self.embeddings(ops.cast(pixel_values, self.dtype))
        return self.multi_modal_projector(self.post_layernorm(self.encoder(x)))


def build_vision_graph(model: Gemma3VisionModel, device: DeviceRef) -> Graph:
    c = model.config
    t = TensorType(DType.float32, ["n_images", c.num_channels, c.image_size, c.image_size], device)
    with Graph(f"{ARCHITECTURE}.vision", input_types=[t]) as g:
        g.output(model(g.inputs[0].tensor))
    return g
