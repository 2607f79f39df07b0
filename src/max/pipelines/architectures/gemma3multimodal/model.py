"""The Gemma 3 multimodal pipeline model: Gemma 3's text decoder (the shared decoder) whose input
embeddings take the image embeddings at the image placeholder positions, and a separate compiled image
graph (``vision.py``) run once per request.

Step graph inputs: the shared decoder's (``tokens``, ``input_row_offsets``, ``return_n_logits``), then
``image_embeddings`` ``[n_image_tokens, hidden]`` (compute dtype) with ``image_token_rows`` int64
``[n_image_tokens, 1]`` (their rows in this step's ragged tokens) and ``attention_blocks`` int64
``[total_seq_len]`` (an image id per token, -1 for text: image tokens attend to each other both ways,
as transformers does with the processor's ``token_type_ids``), then the KV cache's inputs.

A request's images are encoded on its first step that holds image tokens; the embeddings stay on the
context, so decode steps and later prefill chunks never re-encode (``vision_encodes`` counts the calls).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
import torch

from max.driver import Buffer
from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, ops
from max.nn.layer import Module
from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.pipelines.architectures.common.weights import load_weights_into
from max.pipelines.architectures.gemma3multimodal.config import (
    ARCHITECTURE,
    config_from_hf,
    vision_config_from_hf,
)
from max.pipelines.architectures.gemma3multimodal.vision import Gemma3VisionModel, build_vision_graph
from max.pipelines.architectures.gemma3multimodal.weight_adapters import WEIGHT_ADAPTERS, vision_weights
from max.pipelines.lib.pipeline import ModelInputs, ModelOutputs


class Gemma3MultimodalModel(DecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS

    def __init__(self, pipeline_config: Any, session: Any, huggingface_config: Any, encoding: Any, devices: list,
                 kv_cache_config: Any, weights: Any, adapter: Any, return_logits: Any) -> None:
        if getattr(pipeline_config, "lora_config", None) is not None:
            raise NotImplementedError(f"{ARCHITECTURE}: LoRA adapters are not supported for this architecture")
        super().__init__(pipeline_config, session, huggingface_config, encoding, devices, kv_cache_config, weights,
                         adapter, return_logits)
        t0 = time.perf_counter()
        hf = pipeline_config.model_config.huggingface_config
        self.vision_config = vision_config_from_hf(hf.to_dict() if hasattr(hf, "to_dict") else dict(hf))
        dev_ref = DeviceRef.from_device(devices[0])
        checkpoint = vision_weights(dict(weights.items()))
        factory = self.weight_factory(pipeline_config, encoding, self.compute_dtype, dev_ref, checkpoint)
        vision = Gemma3VisionModel(self.vision_config, factory)
        load_weights_into(vision, checkpoint, f"{ARCHITECTURE} (vision tower)")
        self.vision_model = session.load(build_vision_graph(vision, dev_ref), weights_registry=vision.state_dict())
        self.vision_seconds = time.perf_counter() - t0
        self.vision_encodes = 0
        self._torch_device = getattr(devices[0], "_torch_device", None) or "cpu"

    # ------------------------------------------------------------------ graphs
    def build_step_graph(self, module: Module, kv_input_symbols: Any, device: DeviceRef, name: str,
                         lora: Any = None) -> Graph:
        hidden = self.config.hidden_size
        types = [TensorType(DType.int64, ["total_seq_len"], device),
                 TensorType(DType.uint32, ["input_row_offsets_len"], device),
                 TensorType(DType.int64, [1], DeviceRef.CPU()),
                 TensorType(self.compute_dtype, ["n_image_tokens", hidden], device),
                 TensorType(DType.int64, ["n_image_tokens", 1], device),
                 TensorType(DType.int64, ["total_seq_len"], device)]
        kv = list(kv_input_symbols)
        attentions = [layer.self_attn for layer in module.layers]
        with Graph(name, input_types=[*types, *kv]) as g:
            tokens, offsets, n_logits, img, rows, blocks, *kv_vals = g.inputs
            for a in attentions:
                a.block_groups = blocks.tensor
            try:
                h = ops.scatter_nd(module.embed(tokens.tensor), img.tensor, rows.tensor)
                outs = module.forward_embeddings(h, kv_vals, n_logits, offsets.tensor)
            finally:
                for a in attentions:
                    a.block_groups = None
            g.output(outs[0])
        return g

    # ------------------------------------------------------------------ steps
    def encode_images(self, context_batch: Sequence[Any]) -> None:
        """Run the image graph once over the images of every context that has not been encoded yet and keep
        each context's embeddings ``[n_image_tokens, hidden]`` on it."""
        todo = [c for c in context_batch if getattr(c, "pixel_values", ()) and getattr(c, "vision_embeddings", None)
                is None]
        if not todo:
            return
        pixels = np.stack([p for c in todo for p in c.pixel_values]).astype(np.float32, copy=False)
        want = (self.vision_config.num_channels, self.vision_config.image_size, self.vision_config.image_size)
        if pixels.shape[1:] != want:
            raise ValueError(f"{ARCHITECTURE}: images must be processed to {list(want)}, got {list(pixels.shape[1:])}")
        buf = Buffer.from_numpy(pixels)
        if self._torch_device != "cpu":
            buf = buf.to(self.devices[0])
        (out,) = self.vision_model.execute(buf)
        self.vision_encodes += 1
        emb = out._torch()  # [n_images, mm_tokens, hidden]
        i = 0
        for c in todo:
            n = len(c.pixel_values)
            c.mark_vision_encoded(emb[i:i + n].reshape(-1, emb.shape[-1]))
            i += n

    def prepare_initial_token_inputs(self, context_batch: Sequence[Any], kv_cache_inputs: Any = None,
                                     return_n_logits: int = 1) -> ModelInputs:
        inputs = super().prepare_initial_token_inputs(context_batch, kv_cache_inputs, return_n_logits)
        step = [c for c in context_batch if _image_rows(c).size]
        self.encode_images(step)
        vocab = self.config.vocab_size
        toks, rows, blocks, embeds = [], [], [], []
        base = 0
        for c in context_batch:
            t = np.asarray(c.next_tokens, np.int64)
            blk = np.full(len(t), -1, np.int64)
            local = _image_rows(c)  # positions (in the token array) of this step's image tokens
            if local.size:
                all_pos = c.image_token_indices
                rank = np.searchsorted(all_pos, local)  # the rows of the context's embeddings they take
                embeds.append(c.vision_embeddings[torch.as_tensor(rank, device=c.vision_embeddings.device)])
                rows.append(base + local - c.start_idx)
                for k, im in enumerate(c.images):
                    lo, hi = max(im.start_idx, c.start_idx), min(im.end_idx, c.active_idx)
                    if lo < hi:
                        blk[lo - c.start_idx:hi - c.start_idx] = k  # block ids only meet within one request
            toks.append(np.where(t >= vocab, 0, t))  # placeholder ids beyond the vocabulary: any row, replaced
            blocks.append(blk)
            base += len(t)
        flat = np.concatenate(toks) if toks else np.zeros(0, np.int64)
        dt = self.compute_dtype.to_torch()
        img = torch.cat(embeds).to(dt) if embeds else torch.zeros(0, self.config.hidden_size, dtype=dt)
        row_idx = np.concatenate(rows).astype(np.int64)[:, None] if rows else np.zeros((0, 1), np.int64)
        dev = self.devices[0]
        on = (lambda b: b) if self._torch_device == "cpu" else (lambda b: b.to(dev))
        inputs.tokens = on(Buffer.from_numpy(flat))
        inputs.image_embeddings = Buffer.from_dlpack(img.contiguous().to(self._torch_device))
        inputs.image_token_rows = on(Buffer.from_numpy(np.ascontiguousarray(row_idx)))
        inputs.attention_blocks = on(Buffer.from_numpy(np.concatenate(blocks) if blocks else np.zeros(0, np.int64)))
        return inputs

    def execute(self, model_inputs: ModelInputs) -> ModelOutputs:
        (logits,) = self.model.execute(model_inputs.tokens, model_inputs.input_row_offsets,
                                       model_inputs.return_n_logits, model_inputs.image_embeddings,
                                       model_inputs.image_token_rows, model_inputs.attention_blocks,
                                       *model_inputs.kv_cache_inputs)
        return ModelOutputs(logits=logits._torch())


def _image_rows(c: Any) -> np.ndarray:
    """Positions of the image tokens among ``c``'s tokens of this step (``[start_idx, active_idx)``)."""
    idx = getattr(c, "image_token_indices", None)
    if idx is None or not len(idx):
        return np.zeros(0, np.int64)
    idx = np.asarray(idx, np.int64)
    return idx[(idx >= c.start_idx) & (idx < c.active_idx)]
