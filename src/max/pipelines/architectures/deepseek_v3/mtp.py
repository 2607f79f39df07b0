"""DeepSeek-V3's multi-token prediction (MTP) layer as a speculative-decoding draft.

The MTP layer (DeepSeek-V3 report, section 2.2) predicts the token after next at position ``i`` from
the main model's representation ``h_i`` and the embedding of the next token ``t_{i+1}``:

    x_i = eh_proj([enorm(embed(t_{i+1})); hnorm(h_i)])
    g_i = decoder_layer(x_i)                  (MLA + MoE, causal over the layer's own cache)
    o_i = shared_head.norm(g_i);  logits_i = shared_head.head(o_i)

``h_i`` is the main model's hidden state after its final norm (what Megatron-LM's MTP reads; the
checkpoints were trained with it) and ``o_i`` is what a further draft step reads in place of ``h``.
The layer keeps its own paged KV cache (one layer, no prefix caching: its entries depend on hidden
states, not on tokens alone).  ``max.pipelines.lib.mtp_draft`` drives it per speculative round.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from max.driver import Buffer
from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, TensorValue, ops
from max.nn.kv_cache import FetchPagedKVCacheCollection, KVCacheParams, PagedKVCacheManager, kv_cache_budget
from max.nn.layer import LayerList, Module
from max.pipelines.architectures.common.config import DecoderConfig
from max.pipelines.architectures.common.layers import DecoderLayer, GatedMLP, rms_norm
from max.pipelines.architectures.common.weights import WeightFactory, load_weights_into

__all__ = ["MTPDraftModel", "MultiTokenPredictor"]


class _SharedHead(Module):
    def __init__(self, cfg: DecoderConfig, factory: WeightFactory) -> None:
        super().__init__()
        self.norm = rms_norm(cfg, cfg.hidden_size, factory.dtype)
        self.head = factory.linear("shared_head.head", cfg.hidden_size, cfg.vocab_size)


class MultiTokenPredictor(Module):
    """The MTP layer of checkpoint layer ``index`` (see the module docstring); its decoder layer is
    ``layers.0`` of its own one-layer KV cache."""

    def __init__(self, cfg: DecoderConfig, factory: WeightFactory, kv_params: KVCacheParams, max_seq_len: int,
                 index: int) -> None:
        super().__init__()
        from max.pipelines.architectures.deepseek_v2.model import MLAttention
        from max.pipelines.architectures.deepseek_v3.model import DeepseekV3MoE

        H, dt = cfg.hidden_size, factory.dtype
        self.kv_params = kv_params
        self.embed_tokens = factory.embedding("embed_tokens", cfg.vocab_size, H)
        self.enorm = rms_norm(cfg, H, dt)
        self.hnorm = rms_norm(cfg, H, dt)
        self.eh_proj = factory.linear("eh_proj", 2 * H, H)
        attn = MLAttention(cfg, 0, factory, kv_params, max_seq_len)
        if index in cfg.moe.dense_layers:
            mlp: Module = GatedMLP("layers.0.mlp", factory, H, cfg.intermediate_size, cfg.hidden_act,
                                   has_bias=cfg.mlp_bias, who=cfg.architecture)
        else:
            mlp = DeepseekV3MoE(cfg, 0, factory)
        self.layers = LayerList([DecoderLayer(cfg, attn, mlp, dt)])
        self.shared_head = _SharedHead(cfg, factory)

    def __call__(self, tokens: TensorValue, hidden: TensorValue, kv_inputs: Any,
                 input_row_offsets: TensorValue) -> tuple[TensorValue, TensorValue]:
        """``tokens`` ``[T]`` (each position's next token), ``hidden`` ``[T, H]`` -> the last row of each
        request: float32 logits ``[batch, vocab]`` and the normed output ``[batch, H]``."""
        kv = FetchPagedKVCacheCollection(self.kv_params, 1)(*kv_inputs)
        x = self.eh_proj(ops.concat([self.enorm(self.embed_tokens(tokens)), self.hnorm(hidden)], axis=-1))
        x = self.layers[0](ops.constant(0, DType.uint32, x.device), x, kv, None, input_row_offsets)
        last = ops.gather(x, input_row_offsets.cast(DType.int64)[1:] - 1, axis=0)
        out = self.shared_head.norm(last)
        return self.shared_head.head(out).cast(DType.float32), out


class MTPDraftModel:
    """The compiled MTP layer and its KV cache manager.

    :meth:`run` takes draft contexts (``next_tokens``: each position's next token, ``start_idx``: the
    layer's cached positions) and their hidden rows, and returns each request's last-row logits and
    normed output (torch tensors)."""

    def __init__(self, cfg: DecoderConfig, checkpoint: dict[str, Any], factory: WeightFactory,
                 kv_params: KVCacheParams, max_seq_len: int, max_batch: int, devices: list, session: Any,
                 device: DeviceRef, index: int, kv_cache_config: Any) -> None:
        self.hidden_size = cfg.hidden_size
        self.dtype = factory.dtype
        module = MultiTokenPredictor(cfg, factory, kv_params, max_seq_len, index)
        load_weights_into(module, checkpoint, f"{cfg.architecture} MTP layer")
        kvc = kv_cache_config
        self.kv_manager = PagedKVCacheManager(
            kv_params, max_batch_size=max_batch, max_seq_len=max_seq_len, num_layers=1, devices=devices,
            session=session, available_cache_memory=kv_cache_budget(
                kv_params, 1, max_batch, max_seq_len, devices, kv_cache_memory=None,
                device_memory_utilization=getattr(kvc, "device_memory_utilization", 0.9)))
        symbols = self.kv_manager.input_symbols(devices=[device])[0]
        types = [TensorType(DType.int64, ["total_seq_len"], device),
                 TensorType(factory.dtype, ["total_seq_len", cfg.hidden_size], device),
                 TensorType(DType.uint32, ["input_row_offsets_len"], device)]
        with Graph(f"{cfg.architecture}_mtp", input_types=[*types, *symbols]) as g:
            tokens, hidden, offsets, *kv = g.inputs
            logits, out = module(tokens.tensor, hidden.tensor, kv, offsets.tensor)
            g.output(logits, out)
        self.model = session.load(g, weights_registry=module.state_dict())
        self._torch_dtype = factory.dtype.to_torch()

    def run(self, draft_contexts: list[Any], hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        toks = [np.asarray(c.next_tokens, np.int64) for c in draft_contexts]
        offsets = np.zeros(len(toks) + 1, np.uint32)
        np.cumsum([len(t) for t in toks], out=offsets[1:])
        if int(offsets[-1]) != hidden.shape[0]:
            raise ValueError(f"MTP draft: {int(offsets[-1])} tokens but {hidden.shape[0]} hidden rows")
        kv = self.kv_manager.fetch(draft_contexts, 1)[0]
        h = hidden.to(self._torch_dtype).contiguous()
        logits, out = self.model.execute(Buffer.from_numpy(np.concatenate(toks)), Buffer.from_dlpack(h),
                                         Buffer.from_numpy(offsets), *kv)
        return logits._torch().float(), out._torch()
