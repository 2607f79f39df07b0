"""What vision-language families share: a decoder whose input embeddings take image embeddings at the
image placeholder rows, and images encoded once per request.

Step graph inputs: the shared decoder's (``tokens``, ``input_row_offsets``, ``return_n_logits``), then
``image_embeddings`` ``[n_image_tokens, hidden]`` (compute dtype) with ``image_token_rows`` int64
``[n_image_tokens, 1]`` (their rows in this step's ragged tokens), then the family's own step inputs
(:meth:`VisionDecoderPipelineModel.step_input_types`), then the KV cache's inputs.

A family subclasses :class:`VisionDecoderPipelineModel` and sets ``vision_config_from_hf``,
``vision_module``, ``vision_graph`` and ``vision_adapter`` (the image graph, compiled once after the
decoder by ``build_vision``) and ``encode(contexts)`` (that graph over the contexts' images ->
each context's embeddings ``[n_image_tokens, hidden]``, in the order of its placeholder tokens).  A
request's images are encoded on its first step that holds image tokens (one call for every context of
the step that needs it); the embeddings stay on the context (``TextAndVisionContext.vision_embeddings``),
so decode steps and later prefill chunks never re-encode (``vision_encodes`` counts the calls).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from max.driver import Buffer
from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, TensorValue, ops
from max.nn.layer import Module
from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.pipelines.architectures.common.weights import load_weights_into, session_policy
from max.pipelines.lib.pipeline import ModelInputs, ModelOutputs

__all__ = ["VisionDecoderPipelineModel", "image_rows", "split_adapters"]


def split_adapters(route: Callable[[str], tuple[bool, str]]) -> tuple[dict, Callable]:
    """``(decoder weight adapters, vision adapter)`` for safetensors and PyTorch checkpoints.  ``route(name)``
    (the checkpoint name without a leading ``model.``) -> ``(is_vision, module name)``; rotary-embedding
    buffers some checkpoints carry are dropped."""
    from max.graph.weights import WeightsFormat

    def split(state_dict: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        parts: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
        for name, w in state_dict.items():
            n = name[len("model."):] if name.startswith("model.") else name
            if not n.endswith("rotary_emb.inv_freq"):
                is_vision, module_name = route(n)
                parts[is_vision][module_name] = w
        return parts

    def text(state_dict: Mapping[str, Any], **_: Any) -> dict[str, Any]:
        return split(state_dict)[0]

    def vision(state_dict: Mapping[str, Any], **_: Any) -> dict[str, Any]:
        return split(state_dict)[1]

    return {WeightsFormat.safetensors: text, WeightsFormat.pytorch: text}, vision


def image_graph(model: Module, name: str, input_types: Sequence[TensorType]) -> Graph:
    """The graph of a family's image encoder: ``model`` called on the graph's inputs (``input_types``, in
    order), its output the graph's."""
    with Graph(name, input_types=list(input_types)) as g:
        g.output(model(*(v.tensor for v in g.inputs)))
    return g


def image_rows(c: Any) -> np.ndarray:
    """Positions of the image tokens among ``c``'s tokens of this step (``[start_idx, active_idx)``)."""
    idx = getattr(c, "image_token_indices", None)
    if idx is None or not len(idx):
        return np.zeros(0, np.int64)
    idx = np.asarray(idx, np.int64)
    return idx[(idx >= c.start_idx) & (idx < c.active_idx)]


class VisionDecoderPipelineModel(DecoderPipelineModel):
    """A decoder family's compiled model plus its image graph (see the module docstring)."""

    def __init__(self, pipeline_config: Any, session: Any, huggingface_config: Any, encoding: Any, devices: list,
                 kv_cache_config: Any, weights: Any, adapter: Any, return_logits: Any) -> None:
        if getattr(pipeline_config, "lora_config", None) is not None:
            raise NotImplementedError(f"{type(self).__name__}: LoRA adapters are not supported for vision-language "
                                      "models")
        super().__init__(pipeline_config, session, huggingface_config, encoding, devices, kv_cache_config, weights,
                         adapter, return_logits)
        t0 = time.perf_counter()
        self._torch_device = getattr(devices[0], "_torch_device", None) or "cpu"
        hf = pipeline_config.model_config.huggingface_config
        self.build_vision(hf.to_dict() if hasattr(hf, "to_dict") else dict(hf), pipeline_config, encoding, weights,
                          DeviceRef.from_device(devices[0]))
        self.vision_seconds = time.perf_counter() - t0
        self.vision_encodes = 0

    # ------------------------------------------------------------------ family hooks
    vision_config_from_hf: Callable[[dict], Any]
    vision_module: type
    """``vision_module(vision_config, factory)``: the image model (its ``__call__`` takes the image graph's inputs)."""
    vision_graph: Callable[[Module, DeviceRef], Graph]
    vision_adapter: Callable[..., dict]

    def build_vision(self, hf: dict, pipeline_config: Any, encoding: Any, weights: Any, device: DeviceRef) -> None:
        """``self.vision_config`` and ``self.vision_model`` (the compiled image graph, weights bound)."""
        cls = type(self)
        self.vision_config = cls.vision_config_from_hf(hf)
        checkpoint = cls.vision_adapter(dict(weights.items()))
        factory = self.weight_factory(pipeline_config, encoding, self.compute_dtype, device, checkpoint,
                                      policy=session_policy(self.session))
        vision = cls.vision_module(self.vision_config, factory)
        load_weights_into(vision, checkpoint, f"{self.config.architecture} (vision)")
        self.vision_model = self.session.load(cls.vision_graph(vision, device), weights_registry=vision.state_dict())

    def encode(self, contexts: Sequence[Any]) -> list[torch.Tensor]:
        """Each context's image embeddings ``[n_image_tokens, hidden]`` (one image-graph call).  Default: images
        (or tiles) of one fixed size, ``vision_config.num_channels`` x ``image_size`` x ``image_size``, each giving
        the same number of embedding rows, in the order of the context's ``pixel_values``."""
        pixels = np.stack([p for c in contexts for p in c.pixel_values]).astype(np.float32, copy=False)
        v = self.vision_config
        want = (v.num_channels, v.image_size, v.image_size)
        if pixels.shape[1:] != want:
            raise ValueError(f"{self.config.architecture}: images must be processed to {list(want)}, got "
                             f"{list(pixels.shape[1:])}")
        (out,) = self.vision_model.execute(self.to_device(pixels))
        emb = out._torch()  # [n_images, tokens per image, hidden]
        return [e.reshape(-1, emb.shape[-1]) for e in torch.split(emb, [len(c.pixel_values) for c in contexts])]

    @property
    def image_embedding_width(self) -> int:
        """Columns of an image token's row of ``encode``'s output (default: the decoder's width)."""
        return self.config.hidden_size

    def merge_image_embeddings(self, module: Module, h: TensorValue, img: TensorValue,
                               rows: TensorValue) -> TensorValue:
        """The token embeddings ``h`` with the image embeddings ``img`` written at their ``rows``."""
        return ops.scatter_nd(h, img, rows)

    def step_input_types(self, device: DeviceRef) -> list[TensorType]:
        """The family's extra step-graph inputs (after the image rows)."""
        return []

    def bind_step_inputs(self, module: Module, values: list[TensorValue] | None) -> None:
        """Hand the extra inputs' graph values to the modules that read them (None: graph built)."""

    def step_arrays(self, context_batch: Sequence[Any]) -> list[np.ndarray]:
        """The extra inputs' values for this step, in the order of :meth:`step_input_types`."""
        return []

    # ------------------------------------------------------------------ graph
    def build_step_graph(self, module: Module, kv_input_symbols: Any, device: DeviceRef, name: str,
                         lora: Any = None, signals: Any = None) -> Graph:
        if signals is not None:
            raise NotImplementedError(f"{name}: tensor parallelism is not supported for vision-language models")
        types = [TensorType(DType.int64, ["total_seq_len"], device),
                 TensorType(DType.uint32, ["input_row_offsets_len"], device),
                 TensorType(DType.int64, [1], DeviceRef.CPU()),
                 TensorType(self.compute_dtype, ["n_image_tokens", self.image_embedding_width], device),
                 TensorType(DType.int64, ["n_image_tokens", 1], device)]
        extra = self.step_input_types(device)
        kv = list(kv_input_symbols)
        with Graph(name, input_types=[*types, *extra, *kv]) as g:
            tokens, offsets, n_logits, img, rows, *rest = g.inputs
            self.bind_step_inputs(module, [v.tensor for v in rest[:len(extra)]])
            try:
                h = self.merge_image_embeddings(module, module.embed(tokens.tensor), img.tensor, rows.tensor)
                outs = module.forward_embeddings(h, rest[len(extra):], n_logits, offsets.tensor)
            finally:
                self.bind_step_inputs(module, None)
            g.output(outs[0])
        return g

    # ------------------------------------------------------------------ steps
    def encode_images(self, context_batch: Sequence[Any]) -> None:
        todo = [c for c in context_batch if getattr(c, "pixel_values", ()) and getattr(c, "vision_embeddings", None)
                is None]
        if not todo:
            return
        for c, emb in zip(todo, self.encode(todo)):
            c.mark_vision_encoded(emb)
        self.vision_encodes += 1

    def to_device(self, array: np.ndarray) -> Buffer:
        buf = Buffer.from_numpy(np.ascontiguousarray(array))
        return buf if self._torch_device == "cpu" else buf.to(self.devices[0])

    def prepare_initial_token_inputs(self, context_batch: Sequence[Any], kv_cache_inputs: Any = None,
                                     return_n_logits: int = 1) -> ModelInputs:
        inputs = super().prepare_initial_token_inputs(context_batch, kv_cache_inputs, return_n_logits)
        self.encode_images([c for c in context_batch if image_rows(c).size])
        vocab = self.config.vocab_size
        toks, rows, embeds = [], [], []
        base = 0
        for c in context_batch:
            t = np.asarray(c.next_tokens, np.int64)
            local = image_rows(c)
            if local.size:
                rank = np.searchsorted(np.asarray(c.image_token_indices, np.int64), local)
                embeds.append(c.vision_embeddings[torch.as_tensor(rank, device=c.vision_embeddings.device)])
                rows.append(base + local - c.start_idx)
            toks.append(np.where(t >= vocab, 0, t))  # placeholder ids beyond the vocabulary: any row, replaced
            base += len(t)
        dt = self.compute_dtype.to_torch()
        img = torch.cat(embeds).to(dt) if embeds else torch.zeros(0, self.image_embedding_width, dtype=dt)
        inputs.tokens = self.to_device(np.concatenate(toks) if toks else np.zeros(0, np.int64))
        inputs.image_embeddings = Buffer.from_dlpack(img.contiguous().to(self._torch_device))
        inputs.image_token_rows = self.to_device(
            np.concatenate(rows).astype(np.int64)[:, None] if rows else np.zeros((0, 1), np.int64))
        inputs.step_extra = [self.to_device(a) for a in self.step_arrays(context_batch)]
        return inputs

    def execute(self, model_inputs: ModelInputs) -> ModelOutputs:
        (logits,) = self.model.execute(model_inputs.tokens, model_inputs.input_row_offsets,
                                       model_inputs.return_n_logits, model_inputs.image_embeddings,
                                       model_inputs.image_token_rows, *model_inputs.step_extra,
                                       *model_inputs.kv_cache_inputs)
        return ModelOutputs(logits=logits._torch())
