"""The pipeline model every decoder family uses: config -> weights -> graph -> compiled model with
a paged KV cache sized by ``max.nn.kv_cache.kv_cache_budget`` (the one sizing policy).

Graph inputs, in order: ``tokens`` int64 ``[total_seq_len]`` (ragged), ``input_row_offsets`` uint32
``[batch + 1]``, ``return_n_logits`` int64 ``[1]``, then the KV cache's ``input_symbols()``
(blocks, cache_lengths, lookup_table, max_lengths).  Output: float32 logits ``[batch, vocab]`` of
each request's last token (``[total_seq_len, vocab]``, every position, when the model is built with
``ReturnLogits.ALL``: ``PipelineConfig.enable_echo``).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from max.driver import Buffer
from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType
from max.graph.weights import WeightsFormat
from max.nn.kv_cache import KVCacheParams, kv_cache_budget
from max.nn.layer import Module
from max.nn.transformer import ReturnLogits
from max.pipelines.architectures.common.config import DecoderConfig
from max.pipelines.lib.config import batch_size_for
from max.nn.signals import Signals
from max.pipelines.architectures.common.layers import build_decoder, check_tensor_parallel
from max.pipelines.architectures.common.weights import (
    WeightFactory,
    compute_dtype,
    int4_checkpoint,
    keeps_quantized,
    session_policy,
    load_weights_into,
    standard_adapters,
    storage_dtype,
)
from max.pipelines.lib.pipeline import KVCacheMixin, ModelInputs, ModelOutputs, PipelineModel, upper_bounded_default

__all__ = ["DecoderPipelineModel", "build_graph", "device_refs", "kv_params_for"]


def kv_params_for(cfg: DecoderConfig, dtype: DType, page_size: int = 128, enable_prefix_caching: bool = True,
                  shape: tuple[int, int] | None = None, n_devices: int = 1, kv_cache_config: Any = None
                  ) -> KVCacheParams:
    """The paged cache's parameters for a decoder: ``shape`` = (KV heads, head_dim), by default one K and
    one V row of ``head_dim`` per KV head; under tensor parallelism each of the ``n_devices`` devices
    holds ``KV heads / n_devices`` of them.  ``kv_cache_config`` (a ``KVCacheConfig``) adds the prefix
    cache's host / disk spill tier when it enables ``enable_kvcache_swapping_to_host``."""
    n_kv, head_dim = shape or (cfg.num_key_value_heads, cfg.head_dim)
    spill: dict[str, Any] = {}
    if enable_prefix_caching and getattr(kv_cache_config, "enable_kvcache_swapping_to_host", False):
        spill = dict(enable_kvcache_swapping_to_host=True,
                     host_kvcache_swap_space_gb=kv_cache_config.host_kvcache_swap_space_gb,
                     host_kvcache_spill_dir=kv_cache_config.kv_cache_spill_dir)
    return KVCacheParams(dtype=dtype, n_kv_heads=n_kv, head_dim=head_dim, page_size=page_size,
                         enable_prefix_caching=enable_prefix_caching, n_devices=n_devices, **spill)


def _quantization_config(huggingface_config: Any) -> Any:
    """``quantization_config`` of a Hugging Face config (object or dict), None when it has none."""
    if isinstance(huggingface_config, Mapping):
        return huggingface_config.get("quantization_config")
    return getattr(huggingface_config, "quantization_config", None)


def device_refs(devices: Sequence[Any]) -> list[DeviceRef]:
    """The graph devices of a model over driver ``devices``: accelerators by id; the host CPU, which
    driver-side is one device, as ``cpu:0``, ``cpu:1``... (one logical device per shard, so a
    tensor-parallel graph can be built and checked on a CPU-only host)."""
    refs = []
    for i, d in enumerate(devices):
        r = DeviceRef.from_device(d)
        refs.append(DeviceRef.CPU(i) if r.is_cpu() else r)
    if len(set(refs)) != len(refs):
        raise ValueError(f"devices must be distinct, got {[str(r) for r in refs]}")
    return refs


def build_graph(model: Module, kv_input_symbols: Any, device: DeviceRef, name: str = "decoder",
                lora: Any = None, signals: Any = None) -> Graph:
    """The prefill/decode step graph (see the module docstring for its inputs; with ``lora``, a
    ``max.nn.lora.LoRAGraphInputs``, its inputs follow the KV cache's).

    Tensor parallel (``signals``, a :class:`max.nn.Signals`, and ``model`` a ``DistributedTransformer``):
    the inputs are ``tokens, input_row_offsets, return_n_logits``, one signal buffer per device, then
    each device's four KV-cache inputs (``kv_input_symbols``: one symbol set per device)."""
    tokens_t = TensorType(DType.int64, ["total_seq_len"], device)
    offsets_t = TensorType(DType.uint32, ["input_row_offsets_len"], device)
    n_logits_t = TensorType(DType.int64, [1], DeviceRef.CPU())
    if signals is not None:
        if lora is not None:
            raise NotImplementedError("LoRA adapters are not supported with tensor parallelism yet")
        sig_t = signals.input_types()
        per_dev = [list(k) for k in kv_input_symbols]
        with Graph(name, input_types=[tokens_t, offsets_t, n_logits_t, *sig_t, *[t for k in per_dev for t in k]]) as g:
            tokens, offsets, n_logits, *rest = g.inputs
            sigs = [v.buffer for v in rest[:len(sig_t)]]
            kv_vals = rest[len(sig_t):]
            outs = model(tokens.tensor, sigs, kv_vals, n_logits, offsets.tensor)
            g.output(outs[0])
        return g
    kv = list(kv_input_symbols)
    lora_t = lora.input_types() if lora is not None else []
    with Graph(name, input_types=[tokens_t, offsets_t, n_logits_t, *kv, *lora_t]) as g:
        tokens, offsets, n_logits, *rest = g.inputs
        kv_vals = rest[:len(kv)]
        if lora is not None:
            lora.bind(rest[len(kv):])
        outs = model(tokens.tensor, kv_vals, n_logits, offsets.tensor)
        # logits: [batch, vocab] (last token) or [total_seq_len, vocab] (ReturnLogits.ALL); then the hidden
        # states when the model returns them (``Transformer.return_hidden_states``)
        g.output(outs[0], *outs[2:])
    return g


Adapter = Callable[..., Mapping[str, Any]]


class DecoderPipelineModel(KVCacheMixin, PipelineModel):
    """A decoder family's compiled model: weights loaded, graph compiled, paged KV cache sized.

    A family subclasses it and sets:

    - ``config_from_hf(hf: dict) -> DecoderConfig`` (its ``config.py``);
    - ``weight_adapters``: ``{WeightsFormat: adapter}`` (its ``weight_adapters.py``); an adapter maps
      the checkpoint's ``{name: tensor handle}`` to ``{module name: tensor handle}`` (default: Hugging
      Face names minus ``model.``, llama.cpp's standard GGUF names);
    - ``gguf_interleaved_rope``: whether llama.cpp stored this family's q/k rows permuted for
      interleaved RoPE (Llama-style ``NORM`` rope);
    - optionally ``build_module(cfg, factory, kv_params, max_seq_len) -> Module`` (default:
      :func:`build_decoder`) and ``kv_cache_shape(cfg)``.
    """

    config_from_hf: Callable[[dict], DecoderConfig]
    weight_adapters: dict[WeightsFormat, Adapter] = standard_adapters()
    gguf_interleaved_rope: bool = False

    @classmethod
    def build_module(cls, cfg: DecoderConfig, factory: WeightFactory, kv_params: KVCacheParams,
                     max_seq_len: int, devices: list[DeviceRef] | None = None) -> Module:
        """The decoder module; ``devices`` (more than one: tensor parallel) is passed only by families
        that keep this default, the others run on one device."""
        return build_decoder(cfg, factory, kv_params, max_seq_len, devices=devices)

    @classmethod
    def kv_cache_shape(cls, cfg: DecoderConfig) -> tuple[int, int]:
        """(KV heads, head_dim) of the paged cache (MLA families store a latent instead)."""
        return cfg.num_key_value_heads, cfg.head_dim

    # -- KVCacheMixin: the cache's parameters from the Hugging Face config alone
    @classmethod
    def _cfg_of(cls, huggingface_config: Any) -> DecoderConfig:
        hf = huggingface_config
        return cls.config_from_hf(hf.to_dict() if hasattr(hf, "to_dict") else dict(hf))

    @classmethod
    def get_kv_params(cls, huggingface_config: Any, n_devices: int, kv_cache_config: Any,
                      cache_dtype: DType) -> KVCacheParams:
        cfg = cls._cfg_of(huggingface_config)
        return kv_params_for(cfg, cache_dtype, page_size=getattr(kv_cache_config, "kv_cache_page_size", 128) or 128,
                             enable_prefix_caching=bool(getattr(kv_cache_config, "enable_prefix_caching", True)),
                             shape=cls.kv_cache_shape(cfg), n_devices=n_devices)

    @classmethod
    def get_num_layers(cls, huggingface_config: Any) -> int:
        return int(cls._cfg_of(huggingface_config).num_hidden_layers)

    @classmethod
    def estimate_kv_cache_size(cls, pipeline_config: Any, available_cache_memory: int, devices: list,
                               huggingface_config: Any, kv_cache_config: Any, cache_dtype: DType) -> int:
        """Bytes of ``max_batch_size`` sequences of the maximum length, at most ``available_cache_memory``."""
        params = cls.get_kv_params(huggingface_config, len(devices), kv_cache_config, cache_dtype)
        layers = cls.get_num_layers(huggingface_config)
        seq = cls.calculate_max_seq_len(pipeline_config, huggingface_config)
        pages = -(-seq // params.effective_page_size) * batch_size_for(pipeline_config.max_batch_size, cls.batch_workload)
        return min(int(available_cache_memory), pages * params.bytes_per_page(layers) * max(1, len(devices)))

    def __init__(self, pipeline_config: Any, session: Any, huggingface_config: Any, encoding: Any, devices: list,
                 kv_cache_config: Any, weights: Any, adapter: Any, return_logits: ReturnLogits) -> None:
        super().__init__(pipeline_config, session, huggingface_config, encoding, devices, kv_cache_config, weights,
                         adapter, return_logits)
        t0 = time.perf_counter()
        cfg = self.decoder_config(pipeline_config)
        self.config = cfg
        refs = device_refs(devices)
        n_dev = len(refs)
        self.device_refs = refs
        if n_dev > 1:  # before any model work: can this model split over these devices?
            if type(self).build_module.__func__ is not DecoderPipelineModel.build_module.__func__:  # type: ignore
                raise NotImplementedError(f"{cfg.architecture}: tensor parallelism is not supported for this "
                                          "architecture yet; run it on one device")
            if getattr(pipeline_config, "lora_config", None) is not None:
                raise NotImplementedError("LoRA adapters are not supported with tensor parallelism yet")
            check_tensor_parallel(cfg, n_dev)
        dev_ref = refs[0]
        policy = session_policy(session)
        dt = compute_dtype(encoding, dev_ref, policy)
        self.compute_dtype = dt
        self.max_seq_len = self.calculate_max_seq_len(pipeline_config, huggingface_config)
        kvc = kv_cache_config
        kv_params = kv_params_for(cfg, kvc.cache_dtype or dt, page_size=kvc.kv_cache_page_size,
                                  enable_prefix_caching=kvc.enable_prefix_caching, shape=self.kv_cache_shape(cfg),
                                  n_devices=n_dev, kv_cache_config=kvc)
        self.kv_params = kv_params
        max_batch = self.batch_limit()
        self.kv_manager = self.make_kv_manager(kv_params, max_batch, cfg, devices, session, kvc)
        fmt = pipeline_config.model_config.weights_format
        adapt = adapter or self.weight_adapters.get(fmt)
        if adapt is None:
            raise ValueError(f"{cfg.architecture}: no weight adapter for {fmt.value} checkpoints")
        checkpoint = adapt(dict(weights.items()), huggingface_config=huggingface_config,
                           pipeline_config=pipeline_config)
        checkpoint = int4_checkpoint(checkpoint, _quantization_config(huggingface_config))
        lora_inputs, lora_targets, startup = _lora_setup(pipeline_config, dt, dev_ref)
        factory = self.weight_factory(pipeline_config, encoding, dt, dev_ref, checkpoint, lora_inputs, lora_targets,
                                      policy=policy)
        module = self.build_module(cfg, factory, kv_params, self.max_seq_len,
                                   **({"devices": refs} if n_dev > 1 else {}))
        if return_logits is not None:
            module.return_logits = ReturnLogits(return_logits)  # ALL: logits of every position (echo)
        load_weights_into(module, checkpoint, cfg.architecture)
        self.weights_seconds = time.perf_counter() - t0
        t1 = time.perf_counter()
        self.signals = Signals(refs) if n_dev > 1 else None
        self._signal_buffers = self.signals.buffers() if self.signals is not None else []
        symbols = self.kv_manager.input_symbols(devices=refs)
        graph = self.build_step_graph(module, symbols if n_dev > 1 else symbols[0], dev_ref, cfg.architecture,
                                      lora_inputs, signals=self.signals)
        self.model = session.load(graph, weights_registry=module.state_dict())
        self.compile_seconds = time.perf_counter() - t1
        self._lora = None
        if lora_inputs is not None:
            from max.pipelines.lib.lora import LoRAManager

            self._lora = LoRAManager({n: (m.in_dim, m.out_dim) for n, m in lora_inputs.modules.items()},
                                     lora_inputs.max_loras, lora_inputs.max_rank, dt.to_torch(),
                                     devices[0]._torch_device if hasattr(devices[0], "_torch_device") else "cpu")
            for lname, lpath in startup:
                self._lora.load(lname, lpath)
        # what the compiled model keeps was repacked or copied; pages of the mapped file it read stay
        # resident otherwise (tensors still viewing the file fault theirs back in on use)
        release = getattr(weights, "release_resident_pages", None)
        if callable(release):
            release()
        self._n_logits = Buffer.from_numpy(np.array([1], np.int64))
        self.decode_graphs: Any = None
        """``DecodeGraphs`` (CUDA-graph decode steps) on one CUDA device; None on the CPU."""
        if self._graphs_apply():
            from max.pipelines.lib.cuda_graph_decode import decode_graphs_for

            self.decode_graphs = decode_graphs_for(self)

    def _graphs_apply(self) -> bool:
        """Whether this family runs the shared step graph as it is (a family that overrides how the step is
        built, prepared or run keeps the eager engine) on a CUDA device."""
        cls, base = type(self), DecoderPipelineModel
        same = all(getattr(cls, m) is getattr(base, m) for m in ("execute", "run_graph", "build_step_graph",
                                                                  "prepare_initial_token_inputs"))
        return same and any(r.is_gpu() for r in self.device_refs)

    def make_kv_manager(self, kv_params: KVCacheParams, max_batch: int, cfg: DecoderConfig, devices: list,
                        session: Any, kvc: Any) -> Any:
        """The cache manager: a paged KV cache of every layer sized by :func:`kv_cache_budget` (a hybrid
        family adds its recurrent-state slots)."""
        from max.nn.kv_cache import PagedKVCacheManager

        return PagedKVCacheManager(
            kv_params, max_batch_size=max_batch, max_seq_len=self.max_seq_len, num_layers=cfg.num_hidden_layers,
            devices=devices, session=session,
            available_cache_memory=kv_cache_budget(kv_params, cfg.num_hidden_layers, max_batch, self.max_seq_len,
                                                   devices, kv_cache_memory=kvc.kv_cache_memory,
                                                   device_memory_utilization=kvc.device_memory_utilization))

    def build_step_graph(self, module: Module, kv_input_symbols: Any, device: DeviceRef, name: str,
                         lora: Any = None, signals: Any = None) -> Graph:
        """The step graph (default :func:`build_graph`; a multimodal family adds its image inputs;
        ``signals``: tensor parallelism's signal buffers)."""
        return build_graph(module, kv_input_symbols, device, name=name, lora=lora, signals=signals)

    @staticmethod
    def weight_factory(pipeline_config: Any, encoding: Any, dt: DType, device: DeviceRef,
                       checkpoint: Mapping[str, Any], lora: Any = None, lora_targets: Any = (),
                       policy: Any = None) -> WeightFactory:
        """The factory for this run's encoding: GGML blocks kept as they are on the CPU (the native
        kernels read them), float weights quantised on load when the chosen encoding asks for it,
        half-precision weights kept half precision; LoRA projections as configured.  ``policy``: the
        session's backend policy (:func:`session_policy`)."""
        keep = keeps_quantized(encoding, device, policy)
        src = getattr(pipeline_config.model_config, "source_encoding", None)
        quantize_to = None
        if keep and src is not None and not src.is_quantized:
            quantize_to = encoding.quantization_encoding
        return WeightFactory(dt, device, checkpoint, storage=storage_dtype(encoding, device, policy),
                             keep_quantized=keep,
                             quantize_to=quantize_to, lora=lora, lora_targets=lora_targets)

    @classmethod
    def decoder_config(cls, pipeline_config: Any) -> DecoderConfig:
        """The family's config from the model's Hugging Face config (``config.json``, or the one
        translated from GGUF metadata), with the GGUF q/k layout where the weights are GGUF."""
        mc = pipeline_config.model_config
        hf = mc.huggingface_config
        cfg = cls.config_from_hf(hf.to_dict() if hasattr(hf, "to_dict") else dict(hf))
        if cls.gguf_interleaved_rope and mc.weight_path and mc.weights_format is WeightsFormat.gguf:
            cfg.interleaved_rope = True
        return cfg

    @classmethod
    def calculate_max_seq_len(cls, pipeline_config: Any, huggingface_config: Any) -> int:
        cfg = cls.decoder_config(pipeline_config)
        return upper_bounded_default(cfg.max_position_embeddings, pipeline_config.max_length)

    def prepare_initial_token_inputs(self, context_batch: Sequence[Any], kv_cache_inputs: Any = None,
                                     return_n_logits: int = 1) -> ModelInputs:
        toks = [c.next_tokens for c in context_batch]
        lens = [len(t) for t in toks]
        offsets = np.zeros(len(toks) + 1, np.uint32)
        np.cumsum(lens, out=offsets[1:])
        flat = np.concatenate(toks).astype(np.int64) if toks else np.zeros(0, np.int64)
        kv = kv_cache_inputs[0] if isinstance(kv_cache_inputs, (list, tuple)) else kv_cache_inputs
        if self.signals is not None:  # tensor parallel: every device's cache inputs, in device order
            kv = [b for per_dev in kv_cache_inputs for b in per_dev]
        inputs = ModelInputs(tokens=Buffer.from_numpy(flat), input_row_offsets=Buffer.from_numpy(offsets),
                             kv_cache_inputs=kv, return_n_logits=self._n_logits)
        if self.decode_graphs is not None and lens and all(n == 1 for n in lens):
            # a CUDA-graph step stages these itself; the eager fallback moves tokens and offsets in execute
            inputs.decode_rows = (flat, [c.start_idx for c in context_batch],
                                  [self.kv_manager.get_req_blocks(c.request_id) for c in context_batch])
        else:
            self._to_device(inputs)
        if self._lora is not None:  # each request's adapter: its model name when that names a loaded one
            names = [getattr(c, "model_name", None) for c in context_batch]
            inputs.lora_inputs = [Buffer.from_dlpack(t) for t in self._lora.inputs(names, lens)]
            inputs.lora_ids = [self._lora.slots.get(n, -1) if n else -1 for n in names]
        return inputs

    @property
    def lora_manager(self) -> Any:
        """The :class:`~max.pipelines.lib.lora.LoRAManager` (None without ``enable_lora``)."""
        return self._lora

    def execute(self, model_inputs: ModelInputs) -> ModelOutputs:
        rows = getattr(model_inputs, "decode_rows", None)
        if rows is not None:  # a decode step on CUDA: the captured graph of its bucket
            got = self.decode_graphs.run(*rows)
            if got is not None:
                return ModelOutputs(logits=got[0], greedy_tokens=got[1])
            self._to_device(model_inputs)
        (logits,) = self.run_graph(model_inputs)
        return ModelOutputs(logits=logits._torch())

    def _to_device(self, inputs: ModelInputs) -> None:
        """Tokens and row offsets onto the graph's device (a no-op on the CPU)."""
        dev = self.devices[0]
        inputs.tokens = inputs.tokens.to(dev)
        inputs.input_row_offsets = inputs.input_row_offsets.to(dev)

    def run_graph(self, model_inputs: ModelInputs) -> list[Any]:
        """The compiled step graph's outputs (driver buffers) for ``model_inputs``."""
        return self.model.execute(model_inputs.tokens, model_inputs.input_row_offsets, model_inputs.return_n_logits,
                                  *self._signal_buffers, *model_inputs.kv_cache_inputs,
                                  *(getattr(model_inputs, "lora_inputs", None) or []))


def _lora_setup(pipeline_config: Any, dtype: DType, device: DeviceRef) -> tuple[Any, set[str], list]:
    """``(LoRAGraphInputs or None, target module names, startup adapters [(name, path)])`` of the
    config's ``lora_config``: the targets are the union of the start-up adapters' (every attention
    and MLP projection when none is given, so any adapter can be loaded later)."""
    lc = getattr(pipeline_config, "lora_config", None)
    if lc is None:
        return None, set(), []
    from max.nn.lora import LoRAGraphInputs
    from max.pipelines.lib.lora import DEFAULT_TARGETS, parse_lora_paths, read_adapter

    startup = parse_lora_paths(lc.lora_paths)
    targets: set[str] = set()
    for lname, lpath in startup:
        targets |= read_adapter(lname, lpath).targets
    if len(startup) > lc.max_num_loras:
        raise ValueError(f"{len(startup)} LoRA adapters given but max_num_loras is {lc.max_num_loras}")
    return LoRAGraphInputs(lc.max_num_loras, lc.max_lora_rank, dtype, device), targets or set(DEFAULT_TARGETS), \
        startup
