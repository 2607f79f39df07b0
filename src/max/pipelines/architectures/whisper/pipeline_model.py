"""The compiled Whisper model: weights loaded once into one module, the encoder graph and the decoder step
graph compiled from it, the decoder's paged KV cache (prefix caching off: a decoder's keys depend on its
audio through cross-attention, so equal token prefixes of two requests do not share pages), and the cross
cache: a second paged cache (same layout) holding each window's encoder keys/values for every decoder
layer, which ``cross_attention_ragged`` reads in place."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import torch

from max.driver import Buffer
from max.dtype import DType
from max.graph import BufferType, DeviceRef, TensorType
from max.graph.weights import WeightsFormat
from max.nn.kv_cache import KVCacheParams, PagedKVCacheManager, kv_cache_budget
from max.pipelines.architectures.common.weights import WeightFactory, compute_dtype, load_weights_into, session_policy
from max.pipelines.architectures.whisper.cache_seq import CacheSeq
from max.pipelines.architectures.whisper.config import (
    ARCHITECTURE,
    N_FRAMES,
    WhisperConfig,
    config_from_hf,
    generation_settings,
)
from max.pipelines.architectures.whisper.model import Whisper, build_decoder_graph, build_encoder_graph
from max.pipelines.lib.pipeline import ModelOutputs, PipelineModel, upper_bounded_default

__all__ = ["CrossCache", "WEIGHT_ADAPTERS", "WhisperPipelineModel"]


def _adapt(state_dict: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    """Checkpoint names minus ``model.``; ``proj_out`` is the tied token embedding and is not loaded."""
    out = {}
    for name, w in state_dict.items():
        if name.startswith("proj_out."):
            continue
        out[name[len("model."):] if name.startswith("model.") else name] = w
    return out


WEIGHT_ADAPTERS = {WeightsFormat.safetensors: _adapt, WeightsFormat.pytorch: _adapt}


@dataclass
class CrossCache:
    """The cross-attention keys/values of a batch of windows, in the cross cache: one claimed request per window
    (``ids``) and its page table rows (``lookup`` uint32 ``[windows, pages]``).  :meth:`rows` selects windows (in
    the decoder batch's order); :meth:`WhisperPipelineModel.release_cross` frees them."""

    ids: list[str]
    lookup: torch.Tensor
    keys: Optional[torch.Tensor] = None
    values: Optional[torch.Tensor] = None
    """The windows' cross keys/values ``[windows, layers, source_len, heads, head_dim]`` (what
    :meth:`WhisperPipelineModel.encode` returned; for word timestamps)."""

    def rows(self, idx: Sequence[int]) -> "CrossCache":
        sel = torch.as_tensor(list(idx), dtype=torch.long)
        pick = (lambda t: None if t is None else t[sel])
        return CrossCache([self.ids[i] for i in idx], self.lookup[sel], pick(self.keys), pick(self.values))


def _hf_dict(pipeline_config: Any) -> dict:
    hf = pipeline_config.model_config.huggingface_config
    return hf.to_dict() if hasattr(hf, "to_dict") else dict(hf)


class WhisperPipelineModel(PipelineModel):
    """Whisper's graphs and cache; :class:`~max.pipelines.architectures.whisper.transcribe.WhisperPipeline`
    drives them."""

    weight_adapters = WEIGHT_ADAPTERS
    batch_workload = "transcription"

    def __init__(self, pipeline_config: Any, session: Any, huggingface_config: Any, encoding: Any, devices: list,
                 kv_cache_config: Any, weights: Any, adapter: Any, return_logits: Any) -> None:
        super().__init__(pipeline_config, session, huggingface_config, encoding, devices, kv_cache_config, weights,
                         adapter, return_logits)
        t0 = time.perf_counter()
        hf = _hf_dict(pipeline_config)
        cfg: WhisperConfig = config_from_hf(hf)
        self.config = cfg
        self.settings = generation_settings(str(pipeline_config.model_config.model_path or ""), cfg, hf)
        dev = DeviceRef.from_device(devices[0])
        self._torch_device = getattr(devices[0], "_torch_device", None) or "cpu"
        dt = compute_dtype(encoding, dev, session_policy(session))
        self.compute_dtype = dt
        self.max_seq_len = self.calculate_max_seq_len(pipeline_config, huggingface_config)
        kvc = kv_cache_config
        kvc.refuse_kv_cache_dtype(ARCHITECTURE, allowed=(DType.float32, DType.bfloat16, DType.float16),
                                  why="its self- and cross-attention read a float cache")
        kvc.refuse_swapping(ARCHITECTURE)
        kv_params = KVCacheParams(dtype=kvc.cache_dtype or dt, n_kv_heads=cfg.decoder_attention_heads,
                                  head_dim=cfg.head_dim, page_size=kvc.kv_cache_page_size, enable_prefix_caching=False)
        self.kv_params = kv_params
        self.max_batch = self.batch_limit()
        self.kv_manager = PagedKVCacheManager(
            kv_params, max_batch_size=self.max_batch, max_seq_len=self.max_seq_len, num_layers=cfg.decoder_layers,
            devices=devices, session=session,
            available_cache_memory=kv_cache_budget(kv_params, cfg.decoder_layers, self.max_batch, self.max_seq_len,
                                                   devices, kv_cache_memory=kvc.kv_cache_memory,
                                                   device_memory_utilization=kvc.device_memory_utilization))
        # the cross cache: pages for exactly max_batch windows of max_source_positions encoder positions
        self.cross_params = cp = KVCacheParams(
            dtype=dt, n_kv_heads=cfg.decoder_attention_heads, head_dim=cfg.head_dim,
            page_size=kvc.kv_cache_page_size, enable_prefix_caching=False)
        S = cfg.max_source_positions
        self.cross_pages = math.ceil(S / cp.page_size)
        self.cross_manager = PagedKVCacheManager(
            cp, max_batch_size=self.max_batch, max_seq_len=S, num_layers=cfg.decoder_layers,
            devices=devices, session=session, total_num_pages=self.max_batch * self.cross_pages)
        adapt = adapter or WEIGHT_ADAPTERS.get(pipeline_config.model_config.weights_format)
        if adapt is None:
            raise ValueError(f"{ARCHITECTURE}: no weight adapter for "
                             f"{pipeline_config.model_config.weights_format.value} checkpoints")
        checkpoint = adapt(dict(weights.items()))
        module = Whisper(cfg, WeightFactory(dt, dev, checkpoint), kv_params, self.cross_params)
        load_weights_into(module, checkpoint, ARCHITECTURE)
        self.weights_seconds = time.perf_counter() - t0
        t1 = time.perf_counter()
        registry = module.state_dict()
        self.decoder_weights = {k: w for k, w in registry.items() if k.startswith("decoder.")}
        self.encoder = session.load(build_encoder_graph(module, dev), weights_registry=registry)
        symbols = list(self.kv_manager.input_symbols()[0])
        blocks = self.cross_manager.input_symbols()[0].kv_blocks
        cross_symbols = [BufferType(blocks.dtype, list(blocks.shape), dev),
                         TensorType(DType.uint32, ["batch_size"], dev),
                         TensorType(DType.uint32, ["batch_size", self.cross_pages], dev),
                         TensorType(DType.uint32, ["cross_steps", 2], DeviceRef.CPU())]
        self.decoder = session.load(build_decoder_graph(module, symbols, cross_symbols, dev),
                                    weights_registry=registry)
        self.compile_seconds = time.perf_counter() - t1
        self.encodes = 0
        self._cross_inputs: dict[int, tuple] = {}

    @classmethod
    def calculate_max_seq_len(cls, pipeline_config: Any, huggingface_config: Any) -> int:
        cfg = config_from_hf(_hf_dict(pipeline_config))
        return upper_bounded_default(cfg.max_target_positions, pipeline_config.max_length)

    # ------------------------------------------------------------------ running
    def _buffer(self, t: Any) -> Buffer:
        if isinstance(t, np.ndarray):
            t = torch.from_numpy(np.ascontiguousarray(t))
        return Buffer.from_dlpack(t.contiguous().to(self._torch_device))

    def encode(self, features: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention keys and values, each ``[n, layers, 1500, heads, head_dim]``, of ``n`` windows of
        features ``[n, n_mels, 3000]`` (one encoder call)."""
        f = np.asarray(features, np.float32)
        want = (self.config.num_mel_bins, N_FRAMES)
        if f.ndim != 3 or f.shape[1:] != want:
            raise ValueError(f"{ARCHITECTURE}: input features must be [n, {want[0]}, {want[1]}], got {list(f.shape)}")
        k, v = self.encoder.execute(self._buffer(f))
        self.encodes += 1
        return k._torch(), v._torch()

    def encode_cross(self, features: np.ndarray, request_ids: Sequence[str]) -> CrossCache:
        """Encode ``n`` windows (:meth:`encode`) and store each one's keys/values in the cross cache under its
        request id (claimed here; :meth:`release_cross` frees them)."""
        k, v = self.encode(features)
        S = self.config.max_source_positions
        seqs = [CacheSeq(rid, np.zeros(S, np.int64), 0, S) for rid in request_ids]
        mgr = self.cross_manager
        claimed = []
        try:
            for q in seqs:
                mgr.external_claim(q.request_id)
                claimed.append(q.request_id)
            inputs = mgr.fetch(seqs)[0]
        except Exception:
            for rid in claimed:
                mgr.release(rid)
            raise
        lookup = inputs.lookup_table._torch()
        blocks = inputs.blocks._torch()  # [pages, 2 (K | V), layers, page_size, heads, head_dim]
        n, L, _, H, D = k.shape
        P, ps = self.cross_pages, self.cross_params.page_size
        pages = lookup.to(torch.long).reshape(-1)
        for plane, x in ((0, k), (1, v)):
            if P * ps != S:  # the last page's tail is never read (each window has S positions)
                x = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, P * ps - S))
            blocks[pages, plane] = x.reshape(n, L, P, ps, H, D).transpose(1, 2).reshape(n * P, L, ps, H, D)
        for q in seqs:
            q.start_idx = S
        mgr.step(seqs)
        return CrossCache(list(request_ids), lookup, k, v)

    def release_cross(self, cross: CrossCache) -> None:
        for rid in cross.ids:
            self.cross_manager.release(rid)

    def decode_step(self, seqs: Sequence[Any], cross: CrossCache) -> torch.Tensor:
        """One decoder step over ``seqs`` (each with ``request_id``, ``tokens``, ``start_idx``, ``active_idx``;
        already claimed in the KV cache) whose windows are ``cross``'s rows in the same order: float32 logits
        ``[len(seqs), vocab]`` of each one's last token.  The KV cache is advanced."""
        kv = self.kv_manager.fetch(list(seqs), 1)[0]
        toks = [np.asarray(s.tokens[s.start_idx:s.active_idx], np.int64) for s in seqs]
        n = len(seqs)
        offsets = np.zeros(n + 1, np.uint32)
        np.cumsum([len(t) for t in toks], out=offsets[1:])
        fixed = self._cross_inputs.get(n)
        if fixed is None:  # per batch size: each window's positions and lengths in the cross cache
            S = self.config.max_source_positions
            fixed = self._cross_inputs[n] = (self._buffer(np.arange(n + 1, dtype=np.uint32) * S),
                                             self._buffer(np.full(n, S, np.uint32)),
                                             Buffer.from_numpy(np.array([[1, S]], np.uint32)))
        cross_offsets, cross_lengths, cross_max = fixed
        cross_in = [self.cross_manager.device_buffers[0], cross_lengths, Buffer.from_dlpack(cross.lookup), cross_max]
        (logits,) = self.decoder.execute(self._buffer(np.concatenate(toks)), self._buffer(offsets), cross_offsets,
                                         *kv, *cross_in)
        for s in seqs:
            s.start_idx = s.active_idx
        self.kv_manager.step(list(seqs))
        return logits._torch().float()

    # ------------------------------------------------------------------ PipelineModel contract
    def prepare_initial_token_inputs(self, context_batch: Sequence[Any], kv_cache_inputs: Any = None,
                                     return_n_logits: int = 1) -> Any:
        raise NotImplementedError(f"{ARCHITECTURE} is a speech recognition model: run it with `max transcribe` "
                                  "or serve it for /v1/audio/transcriptions, not as a text generator")

    def execute(self, model_inputs: Any) -> ModelOutputs:
        raise NotImplementedError(f"{ARCHITECTURE}: use WhisperPipeline.transcribe")

