"""The compiled CSM model: the backbone (paged KV cache) and depth decoder graphs, their weights, and the
Mimi codec.  :class:`~max.pipelines.architectures.csm.pipeline.CsmPipeline` drives them."""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from max.driver import Buffer
from max.dtype import DType
from max.graph import DeviceRef
from max.graph.weights import WeightsFormat
from max.nn.kv_cache import PagedKVCacheManager, kv_cache_budget
from max.pipelines.architectures.common.model import kv_params_for
from max.pipelines.architectures.common.weights import WeightFactory, compute_dtype, load_weights_into, session_policy
from max.pipelines.architectures.csm.codec import PREFIX as CODEC_PREFIX
from max.pipelines.architectures.csm.codec import load_codec
from max.pipelines.architectures.csm.config import ARCHITECTURE, CsmConfig, config_from_hf, generation_settings
from max.pipelines.architectures.csm.model import Backbone, DepthDecoder, build_backbone_graph, build_depth_graph
from max.pipelines.lib.pipeline import ModelOutputs, PipelineModel, upper_bounded_default

__all__ = ["WEIGHT_ADAPTERS", "CsmPipelineModel", "split_checkpoint"]

_TIED_AUDIO = ("backbone_model.embed_tokens.embed_audio_tokens.weight", "depth_decoder.model.embed_tokens.weight")


def split_checkpoint(state_dict: Mapping[str, Any]) -> tuple[dict, dict, dict]:
    """``(backbone, depth decoder, codec)`` tensors by module name.  The audio-code table is shared by the
    backbone and the depth decoder (a checkpoint may store it under either name)."""
    bb: dict = {}
    dd: dict = {}
    codec: dict = {}
    for name, w in state_dict.items():
        if name.startswith(CODEC_PREFIX):
            codec[name] = w
        elif name == _TIED_AUDIO[0]:
            bb["embed_audio_tokens.weight"] = w
        elif name.startswith("backbone_model."):
            bb[name[len("backbone_model."):]] = w
        elif name.startswith(("embed_text_tokens.", "lm_head.")):
            bb[name] = w
        elif name.startswith("depth_decoder.model."):
            dd[name[len("depth_decoder.model."):]] = w
        elif name.startswith("depth_decoder.codebooks_head."):
            dd[name[len("depth_decoder."):]] = w
        else:
            raise ValueError(f"{ARCHITECTURE}: unexpected checkpoint tensor {name!r}")
    if "embed_audio_tokens.weight" not in bb and "embed_tokens.weight" in dd:
        bb["embed_audio_tokens.weight"] = dd["embed_tokens.weight"]
    if "embed_tokens.weight" not in dd and "embed_audio_tokens.weight" in bb:
        dd["embed_tokens.weight"] = bb["embed_audio_tokens.weight"]
    return bb, dd, codec


def _identity(state_dict: Mapping[str, Any], **_: Any) -> dict:
    return dict(state_dict)


WEIGHT_ADAPTERS = {WeightsFormat.safetensors: _identity, WeightsFormat.pytorch: _identity}


def _hf_dict(pipeline_config: Any) -> dict:
    hf = pipeline_config.model_config.huggingface_config
    return hf.to_dict() if hasattr(hf, "to_dict") else dict(hf)


def _numpy(w: Any) -> np.ndarray:
    """A checkpoint tensor for the codec: float32 for 16-bit floats (bfloat16 has no numpy type of its own)."""
    if not isinstance(w, np.ndarray):
        t = w.data() if hasattr(w, "data") and callable(w.data) else w
        w = t.to_numpy() if hasattr(t, "to_numpy") else np.asarray(t)
    return w.astype(np.float32) if w.dtype.name in ("bfloat16", "float16") else w


class CsmPipelineModel(PipelineModel):
    """CSM's graphs, paged KV cache (prefix caching off: a prompt's audio positions share one token id but not
    their codes) and codec."""

    weight_adapters = WEIGHT_ADAPTERS
    batch_workload = "audio_generation"

    @staticmethod
    def pipeline_class() -> type:
        """The pipeline the registry builds for this model (``PipelineTask.AUDIO_GENERATION``)."""
        from max.pipelines.architectures.csm.pipeline import CsmPipeline

        return CsmPipeline

    def __init__(self, pipeline_config: Any, session: Any, huggingface_config: Any, encoding: Any, devices: list,
                 kv_cache_config: Any, weights: Any, adapter: Any, return_logits: Any) -> None:
        super().__init__(pipeline_config, session, huggingface_config, encoding, devices, kv_cache_config, weights,
                         adapter, return_logits)
        t0 = time.perf_counter()
        c: CsmConfig = config_from_hf(_hf_dict(pipeline_config))
        self.config = c
        self.settings = generation_settings(str(pipeline_config.model_config.model_path or ""))
        dev = DeviceRef.from_device(devices[0])
        self._torch_device = getattr(devices[0], "_torch_device", None) or "cpu"
        dt = compute_dtype(encoding, dev, session_policy(session))
        self.max_seq_len = self.calculate_max_seq_len(pipeline_config, huggingface_config)
        kvc = kv_cache_config
        kvc.refuse_kv_cache_dtype(ARCHITECTURE, allowed=(DType.float32, DType.bfloat16, DType.float16),
                                  why="its backbone's attention reads a float cache")
        kvc.refuse_swapping(ARCHITECTURE)
        kv_params = kv_params_for(c.backbone, kvc.cache_dtype or dt, kvc.kv_cache_page_size,
                                  enable_prefix_caching=False)
        self.kv_params = kv_params
        self.max_batch = self.batch_limit()
        n_layers = c.backbone.num_hidden_layers
        self.kv_manager = PagedKVCacheManager(
            kv_params, max_batch_size=self.max_batch, max_seq_len=self.max_seq_len, num_layers=n_layers,
            devices=devices, session=session,
            available_cache_memory=kv_cache_budget(kv_params, n_layers, self.max_batch, self.max_seq_len, devices,
                                                   kv_cache_memory=kvc.kv_cache_memory,
                                                   device_memory_utilization=kvc.device_memory_utilization))
        adapt = adapter or WEIGHT_ADAPTERS.get(pipeline_config.model_config.weights_format)
        if adapt is None:
            raise ValueError(f"{ARCHITECTURE}: no weight adapter for "
                             f"{pipeline_config.model_config.weights_format.value} checkpoints")
        bb_w, dd_w, codec_w = split_checkpoint(adapt(dict(weights.items())))
        backbone = Backbone(c, WeightFactory(dt, dev, bb_w), kv_params, self.max_seq_len)
        load_weights_into(backbone, bb_w, ARCHITECTURE + " backbone")
        depth = DepthDecoder(c, WeightFactory(dt, dev, dd_w))
        load_weights_into(depth, dd_w, ARCHITECTURE + " depth decoder")
        self.codec = load_codec(c.codec, {k: _numpy(v) for k, v in codec_w.items()})
        if int(self.codec.num_codebooks) < c.num_codebooks:
            raise ValueError(f"{ARCHITECTURE}: the codec has {self.codec.num_codebooks} codebooks, the model "
                             f"writes {c.num_codebooks}")
        self.weights_seconds = time.perf_counter() - t0
        t1 = time.perf_counter()
        symbols = list(self.kv_manager.input_symbols()[0])
        self.backbone = session.load(build_backbone_graph(backbone, symbols, dev),
                                     weights_registry=backbone.state_dict())
        self.depth = session.load(build_depth_graph(depth, dev), weights_registry=depth.state_dict())
        self._depth_dtype = dt.to_torch()
        self.compile_seconds = time.perf_counter() - t1
        n = c.num_codebooks
        self._offsets = (np.arange(n, dtype=np.int64) * c.codebook_vocab)[None, :]
        self._mask = np.triu(np.full((n + 1, n + 1), -np.inf, np.float32), 1)

    @classmethod
    def calculate_max_seq_len(cls, pipeline_config: Any, huggingface_config: Any) -> int:
        hf = _hf_dict(pipeline_config)
        return upper_bounded_default(int(hf.get("max_position_embeddings") or 2048), pipeline_config.max_length)

    # ------------------------------------------------------------------ running
    def _buffer(self, a: Any) -> Buffer:
        t = torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a
        return Buffer.from_dlpack(t.contiguous().to(self._torch_device))

    def backbone_step(self, seqs: Sequence[Any], rows: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """One backbone step over ``seqs`` (claimed in the KV cache; each one's positions ``start_idx`` to
        ``active_idx`` are computed) whose inputs are ``rows``: per sequence ``(text [n], codes [n, N],
        is_audio [n])`` of those positions.  Returns float32 ``(hidden [batch, hidden], logits [batch,
        codebook_vocab])`` of each one's last position."""
        kv = self.kv_manager.fetch(list(seqs), 1)[0]
        lens = [len(r[0]) for r in rows]
        offsets = np.zeros(len(seqs) + 1, np.uint32)
        np.cumsum(lens, out=offsets[1:])
        text = np.concatenate([r[0] for r in rows]).astype(np.int64)
        codes = np.concatenate([r[1] for r in rows]).astype(np.int64) + self._offsets
        audio = np.concatenate([r[2] for r in rows]).astype(np.float32)[:, None]
        hidden, logits = self.backbone.execute(self._buffer(text), self._buffer(codes), self._buffer(audio),
                                               self._buffer(offsets), *kv)
        return hidden._torch().float(), logits._torch().float()

    def depth_frame(self, hidden: torch.Tensor, c0: np.ndarray, pick: Any) -> np.ndarray:
        """Each row's frame ``[batch, num_codebooks]``: codebook 0 is ``c0``; codebook ``k`` is
        ``pick(k, logits [batch, codebook_vocab])`` (an int array ``[batch]``), from the depth decoder run over
        the backbone's ``hidden`` state and codebooks 0..k-1 (with a cache kept for this frame only)."""
        c, d = self.config, self.config.depth
        b, N = hidden.shape[0], c.num_codebooks
        codes = np.zeros((b, N), np.int64)
        codes[:, 0] = c0
        empty = torch.zeros((d.num_hidden_layers, b, d.num_key_value_heads, 0, d.head_dim), dtype=self._depth_dtype)
        past_k, past_v = self._buffer(empty), self._buffer(empty)
        h = self._buffer(hidden.contiguous())
        ids = np.stack([np.zeros(b, np.int64), codes[:, 0]], axis=1)
        for k in range(1, N):
            n = ids.shape[1]
            p = k + 1 - n  # positions already in the cache
            mask = np.zeros((n, p + n), np.float32)
            mask[:, p:] = self._mask[:n, :n]
            first = np.zeros((n, 1), np.float32)
            if p == 0:
                first[0] = 1.0
            positions = np.tile(np.arange(p, p + n, dtype=np.int64), b)
            logits, past_k, past_v = self.depth.execute(
                self._buffer(ids), h, self._buffer(positions), self._buffer(mask), self._buffer(first),
                self._buffer(np.array([n - 1], np.int64)), self._buffer(np.array([k - 1], np.int64)), past_k, past_v)
            codes[:, k] = pick(k, logits._torch().float())
            ids = (codes[:, k] + k * c.codebook_vocab)[:, None]
        return codes

    # ------------------------------------------------------------------ PipelineModel contract
    def prepare_initial_token_inputs(self, context_batch: Sequence[Any], kv_cache_inputs: Any = None,
                                     return_n_logits: int = 1) -> Any:
        raise NotImplementedError(f"{ARCHITECTURE} is a text-to-speech model: run it with `max generate --output "
                                  "x.wav` or serve it for /v1/audio/speech, not as a text generator")

    def execute(self, model_inputs: Any) -> ModelOutputs:
        raise NotImplementedError(f"{ARCHITECTURE}: use CsmPipeline.next_chunk")
