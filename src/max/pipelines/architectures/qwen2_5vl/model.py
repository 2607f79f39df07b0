"""The Qwen2.5-VL pipeline model: the shared decoder (Qwen2: q/k/v biases) with multimodal RoPE, the
vision transformer's embeddings at the image placeholder rows (``common.multimodal``).

M-RoPE: every token has a (temporal, height, width) position; text tokens have the same value on all three
axes and count on from the previous token's largest position; an image's tokens have the same temporal
position and their grid row/column (merged patches) added to where the image starts, and the text after
it starts at that start plus the grid's longer side.  Head frequency ``j`` turns by the axis its
``mrope_section`` assigns it.  Generated tokens keep the prompt's offset (``position = index + delta``).
The step graph's own inputs are the rotations' ``cos``/``sin`` float32 ``[total_seq_len, 1, head_dim/2]``,
computed here per step; attention splits q/k/v, rotates q and k (``ragged_rope``), writes K/V to the
paged cache and attends causally.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from max.dtype import DType
from max.graph import DeviceRef, TensorType, TensorValue, ops
from max.nn import kernels
from max.nn.kernels import MHAMaskVariant
from max.nn.kernels_decoder import ragged_rope, ragged_write_plan, store_kv_ragged
from max.nn.layer import Module
from max.pipelines.architectures.common import DecoderConfig, WeightFactory
from max.pipelines.architectures.common.layers import DecoderAttention, build_decoder
from max.pipelines.architectures.common.multimodal import VisionDecoderPipelineModel
from max.pipelines.architectures.qwen2_5vl.config import (
    ARCHITECTURE,
    config_from_hf,
    inv_freq,
    vision_config_from_hf,
)
from max.pipelines.architectures.qwen2_5vl.vision import (
    Qwen2_5VisionModel,
    build_vision_graph,
    layout_patches,
    vision_layout,
)
from max.pipelines.architectures.qwen2_5vl.weight_adapters import WEIGHT_ADAPTERS, vision_weights


class MRopeAttention(DecoderAttention):
    """Decoder attention whose q/k rotations come from the step's ``rope_cos``/``rope_sin`` inputs."""

    rope_cos: TensorValue | None = None
    rope_sin: TensorValue | None = None

    def __call__(self, layer_idx: Any, x: TensorValue, kv_collection: Any, freqs_cis: Any,
                 input_row_offsets: TensorValue) -> TensorValue:
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = self._qkv(x)
        q, k = ops.reshape(qkv[:, :H * D], [-1, H, D]), ops.reshape(qkv[:, H * D:(H + Hkv) * D], [-1, Hkv, D])
        if self.qk_norm == "head":  # Qwen3-VL: RMSNorm of each head before the rotation
            q, k = self.q_norm(q), self.k_norm(k)
        elif self.qk_norm is not None:
            raise NotImplementedError(f"layer {self.layer}: M-RoPE attention with qk_norm {self.qk_norm!r}")
        q = ragged_rope(q, self.rope_cos, self.rope_sin)
        k = ragged_rope(k, self.rope_cos, self.rope_sin)
        v = ops.reshape(qkv[:, (H + Hkv) * D:], [-1, Hkv, D])
        _, page, offset = ragged_write_plan(input_row_offsets, kv_collection)
        store_kv_ragged(self.kv_params, k, v, kv_collection, page, offset, self.layer)
        variant = MHAMaskVariant.SLIDING_WINDOW_CAUSAL_MASK if self.window else MHAMaskVariant.CAUSAL_MASK
        attn = kernels.flash_attention_ragged(self.kv_params, q, input_row_offsets, kv_collection, layer_idx, variant,
                                              self.scale, local_window_size=self.window or -1)
        return self.o_proj(ops.reshape(attn, [x.shape[0], H * D]))


def _mrope_attention(cfg: DecoderConfig, layer: int, factory: WeightFactory, kv_params: Any,
                     max_seq_len: int) -> Module:
    return MRopeAttention(cfg, layer, factory, kv_params, None, cfg.layer_window(layer))


def mrope_positions(ctx: Any, merge: int) -> tuple[np.ndarray, int]:
    """``(positions [3, prompt_len], delta)`` of a context's prompt (see the module docstring)."""
    n = int(ctx.prompt_len)
    pos = np.zeros((3, n), np.int64)
    grids = ctx.extra_model_args.get("image_grid_thw") if getattr(ctx, "images", None) else None
    cur = i = 0
    for k, im in enumerate(getattr(ctx, "images", ()) if grids is not None else ()):
        pos[:, i:im.start_idx] = np.arange(im.start_idx - i) + cur
        cur += im.start_idx - i
        t, h, w = (int(v) for v in grids[k])
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h // merge), np.arange(w // merge), indexing="ij")
        pos[:, im.start_idx:im.end_idx] = np.stack([tt.reshape(-1), hh.reshape(-1), ww.reshape(-1)]) + cur
        cur += max(h, w) // merge
        i = im.end_idx
    pos[:, i:] = np.arange(n - i) + cur
    return pos, int(pos.max()) + 1 - n if n else 0


class Qwen2_5VLModel(VisionDecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS

    @classmethod
    def build_module(cls, cfg: DecoderConfig, factory: WeightFactory, kv_params: Any, max_seq_len: int) -> Module:
        return build_decoder(cfg, factory, kv_params, max_seq_len, make_attention=_mrope_attention)

    vision_config_from_hf = staticmethod(vision_config_from_hf)
    vision_module = Qwen2_5VisionModel
    vision_graph = staticmethod(build_vision_graph)
    vision_adapter = staticmethod(vision_weights)

    def build_vision(self, hf: dict, pipeline_config: Any, encoding: Any, weights: Any, device: DeviceRef) -> None:
        super().build_vision(hf, pipeline_config, encoding, weights, device)
        sec = self.config.extra["mrope_section"]
        self._axis = self.mrope_axes(sec, self.config.head_dim // 2)  # the position axis of each head frequency
        self._inv_freq = inv_freq(self.config.rope_theta, self.config.head_dim)

    @staticmethod
    def mrope_axes(section: list[int], half: int) -> np.ndarray:
        """The position axis of each head frequency: consecutive t/h/w sections."""
        if sum(section) != half:
            raise ValueError(f"{ARCHITECTURE}: mrope_section {section} must add up to head_dim / 2 = {half}")
        return np.repeat(np.arange(len(section)) % 3, section)

    def encode(self, contexts: Sequence[Any]) -> list[torch.Tensor]:
        c = self.vision_config
        grids = np.concatenate([np.asarray(x.extra_model_args["image_grid_thw"], np.int64).reshape(-1, 3)
                                for x in contexts])
        patches = np.concatenate([p for x in contexts for p in x.pixel_values]).astype(np.float32, copy=False)
        if patches.shape[1] != c.patch_dim or len(patches) != int(grids.prod(axis=1).sum()):
            raise ValueError(f"{self.config.architecture}: the images' patches {list(patches.shape)} do not match "
                             f"their grids {grids.tolist()} and patch size {c.patch_dim}")
        (out,) = self.vision_model.execute(*(self.to_device(a) for a in self.vision_inputs(patches, grids)))
        emb = out._torch()
        sizes = [int(np.asarray(x.extra_model_args["image_grid_thw"]).reshape(-1, 3).prod(axis=1).sum())
                 // c.merge_unit for x in contexts]
        return list(torch.split(emb, sizes))

    def vision_inputs(self, patches: np.ndarray, grids: np.ndarray) -> tuple[np.ndarray, ...]:
        """The image graph's inputs for the step's patches ``[n, patch_dim]`` and grids ``[images, 3]``."""
        c = self.vision_config
        lay = vision_layout(c, grids)
        return layout_patches(c, patches, lay), lay.cos, lay.sin, lay.full_mask, lay.window_mask, lay.restore

    def step_input_types(self, device: DeviceRef) -> list[TensorType]:
        t = TensorType(DType.float32, ["total_seq_len", 1, self.config.head_dim // 2], device)
        return [t, t]

    def bind_step_inputs(self, module: Module, values: list[TensorValue] | None) -> None:
        for layer in module.layers:
            layer.self_attn.rope_cos, layer.self_attn.rope_sin = values if values else (None, None)

    def step_arrays(self, context_batch: Sequence[Any]) -> list[np.ndarray]:
        angles = []
        for c in context_batch:
            cached = getattr(c, "_mrope", None)
            if cached is None:
                cached = mrope_positions(c, self.vision_config.spatial_merge_size)
                c._mrope = cached
            prompt, delta = cached
            idx = np.arange(c.start_idx, c.active_idx)
            pos = np.where(idx < prompt.shape[1], prompt[:, np.minimum(idx, prompt.shape[1] - 1)], idx + delta)
            angles.append(pos[self._axis].T.astype(np.float32) * self._inv_freq)  # [n, head_dim / 2]
        ang = np.concatenate(angles)[:, None, :] if angles else np.zeros((0, 1, len(self._inv_freq)), np.float32)
        return [np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)]
