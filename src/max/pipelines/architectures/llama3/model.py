"""The Llama-family decoder as a ``max.nn`` module and graph.

Graph inputs, in order: ``tokens`` int64 ``[total_seq_len]`` (ragged),
``input_row_offsets`` uint32 ``[batch + 1]``, ``return_n_logits`` int64 ``[1]``,
then the KV cache's ``input_symbols()`` (blocks, cache_lengths, lookup_table,
max_lengths).  Output: float32 logits ``[batch, vocab]`` of each request's
last token.
"""

from __future__ import annotations

from typing import Any

from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType
from max.nn import MLP, Embedding, Linear, RMSNorm
from max.nn.attention import AttentionWithRope
from max.nn.kv_cache import FetchPagedKVCacheCollection, KVCacheParams
from max.nn.rotary_embedding import Llama3RopeScalingParams, Llama3RotaryEmbedding, RotaryEmbedding
from max.nn.transformer import ReturnLogits, Transformer, TransformerBlock
from max.pipelines.architectures.llama3.config import DecoderConfig


def kv_params_for(cfg: DecoderConfig, dtype: DType, page_size: int = 128,
                  enable_prefix_caching: bool = True) -> KVCacheParams:
    return KVCacheParams(dtype=dtype, n_kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                         page_size=page_size, enable_prefix_caching=enable_prefix_caching)


def _rope(cfg: DecoderConfig, max_seq_len: int, device: DeviceRef) -> RotaryEmbedding:
    common = dict(dim=cfg.num_attention_heads * cfg.head_dim, n_heads=cfg.num_attention_heads,
                  theta=cfg.rope_theta, max_seq_len=max_seq_len, device=device, head_dim=cfg.head_dim,
                  interleaved=cfg.interleaved_rope)
    sc = cfg.rope_scaling or {}
    kind = sc.get("rope_type") or sc.get("type")
    if kind == "llama3":
        params = Llama3RopeScalingParams(
            factor=float(sc["factor"]), low_freq_factor=float(sc.get("low_freq_factor", 1.0)),
            high_freq_factor=float(sc.get("high_freq_factor", 4.0)),
            orig_max_position=int(sc.get("original_max_position_embeddings", 8192)))
        return Llama3RotaryEmbedding(**common, scaling_params=params)
    if kind not in (None, "default"):
        raise NotImplementedError(f"rope scaling {kind!r} is not supported for {cfg.architecture} yet")
    return RotaryEmbedding(**common)


def build_transformer(cfg: DecoderConfig, kv_params: KVCacheParams, dtype: DType, device: DeviceRef,
                      max_seq_len: int) -> Transformer:
    rope = _rope(cfg, max_seq_len, device)
    layers = []
    for _ in range(cfg.num_hidden_layers):
        attn = AttentionWithRope(
            rope=rope, num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
            hidden_size=cfg.hidden_size, kv_params=kv_params, devices=[device], dtype=dtype,
            has_bias=cfg.attention_bias, head_dim=cfg.head_dim,
            qk_norm_eps=cfg.rms_norm_eps if cfg.qk_norm else None, sliding_window=cfg.sliding_window)
        mlp = MLP(dtype, None, cfg.hidden_size, cfg.intermediate_size, [device])
        layers.append(TransformerBlock(attn, mlp, RMSNorm(cfg.hidden_size, dtype, cfg.rms_norm_eps,
                                                          multiply_before_cast=False),
                                       RMSNorm(cfg.hidden_size, dtype, cfg.rms_norm_eps, multiply_before_cast=False)))
    return Transformer(
        dim=cfg.hidden_size, n_heads=cfg.num_attention_heads, layers=layers,
        norm=RMSNorm(cfg.hidden_size, dtype, cfg.rms_norm_eps, multiply_before_cast=False),
        output=Linear(cfg.hidden_size, cfg.vocab_size, dtype, device),
        embedding=Embedding(cfg.vocab_size, cfg.hidden_size, dtype, device),
        kv_params=kv_params,
        kv_collection_constructor=FetchPagedKVCacheCollection(kv_params, cfg.num_hidden_layers),
        rope=rope, return_logits=ReturnLogits.LAST_TOKEN)


def build_graph(model: Transformer, kv_input_symbols: Any, device: DeviceRef, name: str = "llama3") -> Graph:
    """The decode/prefill step graph (see the module docstring for its inputs)."""
    tokens_t = TensorType(DType.int64, ["total_seq_len"], device)
    offsets_t = TensorType(DType.uint32, ["input_row_offsets_len"], device)
    n_logits_t = TensorType(DType.int64, [1], DeviceRef.CPU())
    kv = list(kv_input_symbols)
    with Graph(name, input_types=[tokens_t, offsets_t, n_logits_t, *kv]) as g:
        tokens, offsets, n_logits, *kv_vals = g.inputs
        (logits,) = model(tokens.tensor, kv_vals, n_logits, offsets.tensor)
        g.output(logits)
    return g


# --------------------------------------------------------------------------- pipeline model
import time as _time  # noqa: E402

import numpy as _np  # noqa: E402
import torch as _torch  # noqa: E402

from max.driver import Buffer as _Buffer  # noqa: E402
from max.pipelines.lib.pipeline import ModelInputs, ModelOutputs, PipelineModel, upper_bounded_default  # noqa: E402


def decoder_config_for(pipeline_config: Any) -> DecoderConfig:
    """The decoder config from the model folder's config.json or the GGUF metadata."""
    mc = pipeline_config.model_config
    meta = mc.gguf_metadata
    if meta is not None:
        return DecoderConfig.from_gguf(meta.fields, {t.name for t in meta.tensors})
    hf = mc.huggingface_config
    return DecoderConfig.from_hf(hf.to_dict() if hasattr(hf, "to_dict") else dict(hf))


class Llama3Model(PipelineModel):
    """Llama/SmolLM/Mistral/Qwen2/Qwen3 decoder: weights loaded, graph compiled, paged KV cache sized."""

    def __init__(self, pipeline_config: Any, session: Any, huggingface_config: Any, encoding: Any, devices: list,
                 kv_cache_config: Any, weights: Any, adapter: Any, return_logits: ReturnLogits) -> None:
        super().__init__(pipeline_config, session, huggingface_config, encoding, devices, kv_cache_config, weights,
                         adapter, return_logits)
        from max.nn.kv_cache import PagedKVCacheManager

        t0 = _time.perf_counter()
        cfg = decoder_config_for(pipeline_config)
        self.config = cfg
        dev_ref = DeviceRef.from_device(devices[0])
        # Quantised GGUF weights are dequantised to float32 on the CPU (bfloat16 on accelerators):
        # the engine's fastest matmuls are dense.
        dt = encoding.dtype if not encoding.is_quantized else (DType.float32 if dev_ref.is_cpu() else DType.bfloat16)
        if dev_ref.is_cpu() and dt is DType.float16:
            dt = DType.float32
        self.compute_dtype = dt
        self.max_seq_len = self.calculate_max_seq_len(pipeline_config, huggingface_config)
        kvc = kv_cache_config
        kv_params = kv_params_for(cfg, kvc.cache_dtype or dt, page_size=kvc.kv_cache_page_size,
                                  enable_prefix_caching=kvc.enable_prefix_caching)
        self.kv_params = kv_params
        max_batch = pipeline_config.max_batch_size or 16
        self.kv_manager = PagedKVCacheManager(
            kv_params, max_batch_size=max_batch, max_seq_len=self.max_seq_len, num_layers=cfg.num_hidden_layers,
            devices=devices, session=session, available_cache_memory=_cache_budget(kv_params, cfg, max_batch,
                                                                                      self.max_seq_len))
        self.module = build_transformer(cfg, kv_params, dt, dev_ref, self.max_seq_len)
        fmt = pipeline_config.model_config.weights_format.value
        from max.pipelines.architectures.llama3.weight_adapters import state_dict_from_weights

        state = state_dict_from_weights(weights, cfg, dt, fmt)
        self.module.load_state_dict(state, strict=True)
        self.weights_seconds = _time.perf_counter() - t0
        t1 = _time.perf_counter()
        graph = build_graph(self.module, self.kv_manager.input_symbols()[0], dev_ref, name=cfg.architecture)
        self.model = session.load(graph, weights_registry=self.module.state_dict())
        self.compile_seconds = _time.perf_counter() - t1
        # the compiled model holds what it needs (some weights folded into new layouts at load)
        self.module = None
        state = None
        self._n_logits = _Buffer.from_numpy(_np.array([1], _np.int64))

    @classmethod
    def calculate_max_seq_len(cls, pipeline_config: Any, huggingface_config: Any) -> int:
        cfg = decoder_config_for(pipeline_config)
        return upper_bounded_default(cfg.max_position_embeddings, pipeline_config.max_length)

    def prepare_initial_token_inputs(self, context_batch: Sequence[Any], kv_cache_inputs: Any = None,
                                     return_n_logits: int = 1) -> ModelInputs:
        toks = [c.next_tokens for c in context_batch]
        lens = [len(t) for t in toks]
        offsets = _np.zeros(len(toks) + 1, _np.uint32)
        _np.cumsum(lens, out=offsets[1:])
        flat = _np.concatenate(toks).astype(_np.int64) if toks else _np.zeros(0, _np.int64)
        kv = kv_cache_inputs[0] if isinstance(kv_cache_inputs, (list, tuple)) else kv_cache_inputs
        return ModelInputs(tokens=_Buffer.from_numpy(flat), input_row_offsets=_Buffer.from_numpy(offsets),
                           kv_cache_inputs=kv, return_n_logits=self._n_logits)

    def execute(self, model_inputs: ModelInputs) -> ModelOutputs:
        (logits,) = self.model.execute(model_inputs.tokens, model_inputs.input_row_offsets,
                                       model_inputs.return_n_logits, *model_inputs.kv_cache_inputs)
        return ModelOutputs(logits=logits._torch())


def _cache_budget(kv_params: KVCacheParams, cfg: DecoderConfig, max_batch: int, max_seq_len: int) -> int:
    """Enough pages for a full batch at max length, plus room for the prefix cache, within 4 GiB."""
    page = kv_params.page_size or 128
    per_page = 2 * cfg.num_hidden_layers * page * kv_params.n_kv_heads_per_device * kv_params.head_dim * \
        kv_params.dtype.size_in_bytes
    pages = max_batch * (-(-max_seq_len // page)) + 8
    return int(min(pages * per_page, 4 << 30))


_ = _torch
