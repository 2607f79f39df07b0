"""InternVL's image model: InternViT over each tile, then the projector.

InternViT: the patch convolution, a learned CLS token in front, learned absolute positions (CLS included),
pre-norm encoder layers (LayerNorm or RMSNorm; attention with optional biases and an optional RMSNorm of
the whole query / key width before the heads split; GELU MLP), each branch scaled per channel by its layer
scale (``lambda_1`` / ``lambda_2``) before the residual add; a final LayerNorm only when
``use_mean_pooling`` is off.  ``vision_feature_layer`` picks how many layers run.  Projector: the CLS row
dropped, a pixel shuffle (each ``s`` x ``s`` patches one token), LayerNorm, linear, activation, linear.

Graph input: ``pixel_values`` float32 ``[n_tiles, channels, image_size, image_size]`` (every image's tiles
and thumbnail, as the processor made them).  Output: ``[n_tiles, tokens_per_tile, text_hidden]``.
"""

from __future__ import annotations

from max.graph import DeviceRef, Graph, TensorValue, Weight, ops
from max.nn import LayerList, LayerNorm, Module
from max.nn.norm import RMSNorm
from max.pipelines.architectures.common.layers import activation
from max.pipelines.architectures.common.siglip import (
    PatchConv,
    SiglipMLP,
    build_pixels_graph,
    flatten_patches,
    full_attention,
    pixel_shuffle,
    split_heads,
)
from max.pipelines.architectures.common.weights import WeightFactory
from max.pipelines.architectures.internvl.config import ARCHITECTURE, VisionConfig

__all__ = ["InternVLVisionModel", "build_vision_graph"]


def _norm(c: VisionConfig, f: WeightFactory) -> Module:
    if c.norm_type == "rms_norm":
        return RMSNorm(c.hidden_size, f.dtype, c.layer_norm_eps, multiply_before_cast=False)
    return LayerNorm(c.hidden_size, f.device, f.dtype, eps=c.layer_norm_eps)


class _PatchEmbeddings(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.projection = PatchConv(c, f)


class Embeddings(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.c = c
        self.cls_token = Weight("cls_token", f.dtype, [1, 1, c.hidden_size], f.device)
        self.patch_embeddings = _PatchEmbeddings(c, f)
        if c.use_absolute_position_embeddings:
            self.position_embeddings = Weight("position_embeddings", f.dtype,
                                              [1, c.patches_per_side ** 2 + 1, c.hidden_size], f.device)

    def __call__(self, pixels: TensorValue) -> TensorValue:
        x = self.patch_embeddings.projection(flatten_patches(pixels, self.c))
        cls = ops.broadcast_to(self.cls_token, [x.shape[0], 1, self.c.hidden_size])
        x = ops.concat([cls, x], axis=1)
        return x + self.position_embeddings if self.c.use_absolute_position_embeddings else x


class Attention(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory, p: str) -> None:
        super().__init__()
        h = c.hidden_size
        self.n_heads, self.head_dim = c.num_attention_heads, c.head_dim
        self.q_proj = f.linear(f"{p}.q_proj", h, h, has_bias=c.attention_bias)
        self.k_proj = f.linear(f"{p}.k_proj", h, h, has_bias=c.attention_bias)
        self.v_proj = f.linear(f"{p}.v_proj", h, h, has_bias=c.attention_bias)
        self.projection_layer = f.linear(f"{p}.projection_layer", h, h, has_bias=True)
        self.qk_norm = c.use_qk_norm
        if c.use_qk_norm:  # InternViT's own RMSNorm: eps 1e-6 whatever layer_norm_eps says
            self.q_norm = RMSNorm(h, f.dtype, 1e-6, multiply_before_cast=False)
            self.k_norm = RMSNorm(h, f.dtype, 1e-6, multiply_before_cast=False)

    def __call__(self, x: TensorValue) -> TensorValue:
        q, k = self.q_proj(x), self.k_proj(x)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (split_heads(t, self.n_heads, self.head_dim) for t in (q, k, self.v_proj(x)))
        return self.projection_layer(full_attention(q, k, v))


class EncoderLayer(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory, i: int) -> None:
        super().__init__()
        p = f"encoder.layer.{i}"
        self.layernorm_before = _norm(c, f)
        self.attention = Attention(c, f, f"{p}.attention")
        self.lambda_1 = Weight("lambda_1", f.dtype, [c.hidden_size], f.device)
        self.layernorm_after = _norm(c, f)
        self.mlp = SiglipMLP(c, f, f"{p}.mlp", "InternViT")
        self.lambda_2 = Weight("lambda_2", f.dtype, [c.hidden_size], f.device)

    def __call__(self, x: TensorValue) -> TensorValue:
        x = x + self.lambda_1 * self.attention(self.layernorm_before(x))
        return x + self.lambda_2 * self.mlp(self.layernorm_after(x))


class Encoder(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.layer = LayerList([EncoderLayer(c, f, i) for i in range(c.num_hidden_layers)])
        self.n_used = c.num_layers_used

    def __call__(self, x: TensorValue) -> TensorValue:
        for layer in list(self.layer)[:self.n_used]:
            x = layer(x)
        return x


class Projector(Module):
    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        d = c.hidden_size * c.scale_factor ** 2
        self.layer_norm = LayerNorm(d, f.device, f.dtype, eps=1e-5)  # torch's default eps, as transformers builds it
        self.linear_1 = f.linear("multi_modal_projector.linear_1", d, c.text_hidden_size, has_bias=True)
        self.linear_2 = f.linear("multi_modal_projector.linear_2", c.text_hidden_size, c.text_hidden_size,
                                 has_bias=True)
        object.__setattr__(self, "_act", activation(c.projector_hidden_act, "InternVL projector"))

    def __call__(self, x: TensorValue) -> TensorValue:
        return self.linear_2(self._act(self.linear_1(self.layer_norm(x))))


class InternVLVisionModel(Module):
    """pixels -> InternViT -> projector: ``[n_tiles, tokens_per_tile, text_hidden]``.  Module names are the
    checkpoint's after the family's weight adapter; the layers past ``vision_feature_layer`` are loaded, not run."""

    def __init__(self, c: VisionConfig, f: WeightFactory) -> None:
        super().__init__()
        self.config = c
        self.dtype = f.dtype
        self.embeddings = Embeddings(c, f)
        self.encoder = Encoder(c, f)
        if not c.use_mean_pooling:
            self.layernorm = LayerNorm(c.hidden_size, f.device, f.dtype, eps=c.layer_norm_eps)
        self.multi_modal_projector = Projector(c, f)
        f.check_paths(self)

    def __call__(self, pixel_values: TensorValue) -> TensorValue:
        c = self.config
        x = self.encoder(self.embeddings(ops.cast(pixel_values, self.dtype)))
        if c.final_norm:
            x = self.layernorm(x)
        x = ops.slice_tensor(x, [slice(None), slice(1, None), slice(None)])  # the CLS row is not an image token
        return self.multi_modal_projector(pixel_shuffle(x, c.patches_per_side, c.scale_factor))


def build_vision_graph(model: InternVLVisionModel, device: DeviceRef) -> Graph:
    return build_pixels_graph(model, model.config, device, f"{ARCHITECTURE}.vision")
