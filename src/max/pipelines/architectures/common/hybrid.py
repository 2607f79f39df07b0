"""Hybrid decoders: layers with recurrent state (Mamba-2 mixers, short convolutions, gated DeltaNet)
beside attention layers, over :class:`max.nn.kv_cache.HybridKVCacheManager` (KV pages of the attention
layers plus per-request state slots).

* :class:`FetchHybridCollection` turns the manager's graph inputs into a :class:`HybridCollection`
  (the paged collection of the attention layers, the batch's slot ids and the state buffers by name);
* :class:`HybridLayer` is one pre-norm residual layer: ``h = x + mixer(norm(x))``, then optionally
  ``h + mlp(ffn_norm(h))``, with the module names of the family's checkpoint;
* :class:`AttentionMixer` runs the shared :class:`DecoderAttention` on the ``k``-th attention layer's
  pages; :class:`Mamba2Mixer` is Mamba-2's SSD mixer (used by Mamba-2, Granite 4, Falcon-H1);
* :class:`HybridPipelineModel` is a family's pipeline model: its ``state_specs`` size the slots, its
  ``attention_layers`` the pages; prefix caching is off (the manager says so), LoRA, tensor
  parallelism and speculative decoding are refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Sequence

from max.dtype import DType
from max.graph import BufferValue, DeviceRef, TensorValue, Weight, ops
from max.nn.kv_cache import FetchPagedKVCacheCollection, KVCacheParams, PagedKVCacheCollection, StateSpec
from max.nn.layer import Module
from max.nn.transformer import ReturnLogits
from max.pipelines.architectures.common.config import DecoderConfig
from max.pipelines.architectures.common.layers import DecoderAttention, rms_norm
from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.pipelines.architectures.common.weights import WeightFactory

__all__ = ["AttentionMixer", "FetchHybridCollection", "GatedGroupRMSNorm", "HybridCollection", "HybridLayer",
           "HybridDecoder", "HybridPipelineModel", "Mamba2Mixer", "Params", "build_hybrid", "mamba2_state_specs"]


@dataclass
class HybridCollection:
    """Graph values of a hybrid cache: ``paged`` (attention layers), ``slots`` int64 ``[batch]`` and
    ``states`` (name -> ``BufferValue [num_slots, ...]``)."""

    paged: PagedKVCacheCollection
    slots: TensorValue
    states: dict[str, BufferValue]


class FetchHybridCollection:
    """Builds a :class:`HybridCollection` from ``HybridKVCacheManager.input_symbols()``'s values."""

    def __init__(self, kv_params: KVCacheParams, n_attention_layers: int, state_names: Sequence[str]) -> None:
        self.paged = FetchPagedKVCacheCollection(kv_params, n_attention_layers)
        self.names = list(state_names)

    def __call__(self, *values: Any) -> HybridCollection:
        if len(values) != 5 + len(self.names):
            raise ValueError(f"FetchHybridCollection: expected {5 + len(self.names)} cache inputs (4 paged, slots, "
                             f"{len(self.names)} states), got {len(values)}")
        paged = self.paged(*values[:4])
        slots = values[4].tensor if hasattr(values[4], "tensor") else values[4]
        return HybridCollection(paged, slots, {n: v.buffer if hasattr(v, "buffer") else v
                                               for n, v in zip(self.names, values[5:])})


class Params(Module):
    """Named raw parameters (``conv1d.weight``, ``A_log`` ...) at a module path."""

    def __init__(self, device: DeviceRef, **shapes: tuple[DType, list[int]]) -> None:
        super().__init__()
        for name, (dt, shape) in shapes.items():
            setattr(self, name, Weight(name, dt, shape, device))


class GatedGroupRMSNorm(Module):
    """Mamba-2's gated norm: ``y = x * silu(gate)``, RMS-normalised over groups of ``dim / groups``
    channels, times ``weight`` (computed in float32)."""

    def __init__(self, dim: int, groups: int, eps: float, dtype: DType, norm_before_gate: bool = False) -> None:
        super().__init__()
        self.dim, self.groups, self.eps, self.norm_before_gate = dim, groups, eps, norm_before_gate
        self.weight = Weight("weight", dtype, [dim], DeviceRef.CPU())

    def __call__(self, x: TensorValue, gate: TensorValue | None) -> TensorValue:
        dt = x.dtype
        if dt == DType.float32 and (gate is None or gate.dtype == DType.float32):  # one fused op
            return ops.gated_rms_norm(x, gate, self.weight.to(x.device), self.eps, self.groups,
                                      self.norm_before_gate)
        h = x.cast(DType.float32)
        if gate is not None and not self.norm_before_gate:
            h = h * ops.silu(gate.cast(DType.float32))
        T = h.shape[0]
        g = ops.reshape(h, [T, self.groups, self.dim // self.groups])
        g = g * ops.rsqrt(ops.mean(g * g, axis=-1) + self.eps)
        if self.norm_before_gate:  # Falcon-H1: weight and gate after the norm, in float32
            y = ops.reshape(g, [T, self.dim]) * self.weight.to(x.device).cast(DType.float32)
            return (y * ops.silu(gate.cast(DType.float32)) if gate is not None else y).cast(dt)
        return ops.reshape(g, [T, self.dim]).cast(dt) * self.weight.to(x.device).cast(dt)


def mixer_from_mamba_keys(hf: dict, inner: int, who: str, **extra: Any) -> SimpleNamespace:
    """:class:`Mamba2Mixer`'s sizes from the ``mamba_*`` keys of hybrid configs (Falcon-H1, Granite 4 hybrid):
    ``inner`` is the family's mixer width; ``extra`` adds the optional fields (``rms_norm``, ...)."""
    heads = int(hf.get("mamba_n_heads", 128))
    head_dim = hf.get("mamba_d_head", "auto")
    head_dim = inner // heads if head_dim in (None, "auto") else int(head_dim)
    if hf.get("hidden_act", "silu") not in ("silu", "swish"):
        raise NotImplementedError(f"{who}: activation {hf.get('hidden_act')!r} is not supported")
    lim = tuple(float(v) for v in (hf.get("time_step_limit") or (0.0, float("inf"))))
    return SimpleNamespace(heads=heads, head_dim=head_dim, groups=int(hf.get("mamba_n_groups", 1)),
                           state=int(hf.get("mamba_d_state", 256)), kernel=int(hf.get("mamba_d_conv", 4)),
                           inner=inner, eps=float(hf["rms_norm_eps"]),
                           chunk=min(int(hf.get("mamba_chunk_size") or 64), 64),
                           bias=bool(hf.get("mamba_proj_bias", False)),
                           conv_bias=bool(hf.get("mamba_conv_bias", True)), dt_limit=lim, **extra)


def mamba2_state_specs(layers: Any, m: SimpleNamespace) -> list[StateSpec]:
    """The conv window and SSM state of the Mamba-2 mixers of ``layers`` (sizes ``m``, as :class:`Mamba2Mixer`)."""
    conv_dim = m.inner + 2 * m.groups * m.state  # x, B and C go through the convolution
    return [spec for layer in layers for spec in (
        StateSpec(f"layers.{layer}.conv", (conv_dim, m.kernel - 1)),
        StateSpec(f"layers.{layer}.ssm", (m.heads, m.head_dim, m.state)))]


class Mamba2Mixer(Module):
    """Mamba-2's mixer (Hugging Face ``Mamba2Mixer`` names): ``in_proj`` -> (gate, xBC, dt); depthwise
    causal conv + SiLU on xBC; SSD scan of x with ``dt = clamp(softplus(dt + dt_bias))``, ``A =
    -exp(A_log)``, ``D`` skip; gated group RMSNorm; ``out_proj``.  ``m`` holds the sizes (``heads``,
    ``head_dim``, ``groups``, ``state``, ``kernel``, ``inner``, ``eps``, ``chunk``, ``bias``,
    ``conv_bias``, ``dt_limit``; optionally ``rms_norm`` (False: the scan output is only gated by
    ``silu(gate)``), ``norm_before_gate`` and ``out_bias``: Falcon-H1)."""

    def __init__(self, prefix: str, layer: int, hidden: int, factory: WeightFactory, m: SimpleNamespace) -> None:
        super().__init__()
        self.layer = layer
        self.m = m
        I, G, N, H = m.inner, m.groups, m.state, m.heads
        self.conv_dim = I + 2 * G * N
        self.in_proj = factory.linear(f"{prefix}.in_proj", hidden, I + self.conv_dim + H, m.bias)
        conv = {"weight": (factory.dtype, [self.conv_dim, 1, m.kernel])}
        if m.conv_bias:
            conv["bias"] = (factory.dtype, [self.conv_dim])
        self.conv1d = Params(factory.device, **conv)
        self.dt_bias = Weight("dt_bias", factory.dtype, [H], factory.device)
        self.A_log = Weight("A_log", factory.dtype, [H], factory.device)
        self.D = Weight("D", factory.dtype, [H], factory.device)
        self.has_norm = getattr(m, "rms_norm", True)
        if self.has_norm:
            self.norm = GatedGroupRMSNorm(I, G, m.eps, factory.dtype, getattr(m, "norm_before_gate", False))
        self.out_proj = factory.linear(f"{prefix}.out_proj", I, hidden, getattr(m, "out_bias", m.bias))

    def __call__(self, x: TensorValue, coll: HybridCollection, offsets: TensorValue) -> TensorValue:
        return self.mix(self.in_proj(x), coll, offsets)

    def mix(self, zxbcdt: TensorValue, coll: HybridCollection, offsets: TensorValue) -> TensorValue:
        """The mixer after ``in_proj``: ``zxbcdt`` is ``in_proj(x)`` (a caller may compute it in one matmul
        with other projections of ``x``)."""
        m = self.m
        I, G, N, H, P = m.inner, m.groups, m.state, m.heads, m.head_dim
        T = zxbcdt.shape[0]
        gate = zxbcdt[:, :I]
        xbc = zxbcdt[:, I:I + self.conv_dim]
        dt = zxbcdt[:, I + self.conv_dim:]
        w = ops.reshape(self.conv1d.weight, [self.conv_dim, m.kernel])
        xbc = ops.causal_conv1d(xbc, w, coll.states[f"layers.{self.layer}.conv"], coll.slots, offsets,
                                bias=self.conv1d.bias if m.conv_bias else None, activation="silu")
        xs = ops.reshape(xbc[:, :I], [T, H, P])
        B = ops.reshape(xbc[:, I:I + G * N], [T, G, N])
        C = ops.reshape(xbc[:, I + G * N:], [T, G, N])
        f32 = DType.float32
        A = -ops.exp(self.A_log.cast(f32))
        # dt = clamp(softplus(dt + dt_bias), *dt_limit), taken by the op
        y = ops.selective_scan(xs.cast(f32), dt.cast(f32), A, B.cast(f32), C.cast(f32),
                               coll.states[f"layers.{self.layer}.ssm"], coll.slots, offsets, D=self.D.cast(f32),
                               chunk_size=m.chunk, dt_bias=self.dt_bias.cast(f32), dt_limit=m.dt_limit)
        y = ops.reshape(y, [T, I])
        y = self.norm(y, gate) if self.has_norm else y * ops.silu(gate.cast(f32))
        return self.out_proj(y.cast(zxbcdt.dtype))


class AttentionMixer(Module):
    """The shared attention of model layer ``layer`` on the pages of attention layer ``kv_layer``
    (weights under ``layers.{layer}.self_attn``: the caller assigns it there)."""

    def __init__(self, attention: DecoderAttention, kv_layer: int) -> None:
        super().__init__()
        attention.layer = kv_layer  # the K/V write goes to the page pool's attention-layer index
        self.attn = attention
        self.kv_layer = kv_layer

    def __call__(self, x: TensorValue, coll: HybridCollection, offsets: TensorValue) -> TensorValue:
        idx = ops.constant(self.kv_layer, DType.uint32, x.device)
        return self.attn(idx, x, coll.paged, None, offsets)


class HybridLayer(Module):
    """``h = x + mixer(norm(x))`` (``residual`` scales the branch), then ``h + mlp(ffn_norm(h))`` when the
    layer has an MLP.  ``names``: attribute names of (norm, mixer, ffn_norm, mlp) in the checkpoint;
    a mixer that is an :class:`AttentionMixer` is stored as its attention module under the mixer name.
    ``mlp`` may be a tuple of modules (their outputs summed; ``names[3]`` a tuple of their names:
    Granite 4's experts plus shared MLP)."""

    def __init__(self, names: tuple, norm: Module, mixer: Module, ffn_norm: Module | None = None,
                 mlp: Module | tuple | None = None, residual: float = 1.0) -> None:
        super().__init__()
        setattr(self, names[0], norm)
        setattr(self, names[1], mixer.attn if isinstance(mixer, AttentionMixer) else mixer)
        object.__setattr__(self, "_mixer", mixer)
        mlps = () if mlp is None else (mlp if isinstance(mlp, tuple) else (mlp,))
        mlp_names = names[3] if isinstance(names[3], tuple) else (names[3],)
        if mlps:
            setattr(self, names[2], ffn_norm)
            for n, m in zip(mlp_names, mlps):
                setattr(self, n, m)
        self._names = (names[0], names[1], names[2], mlp_names[:len(mlps)])
        self.residual = residual

    def __call__(self, layer_idx: Any, x: TensorValue, coll: Any, freqs: Any, offsets: TensorValue) -> TensorValue:
        a = self._mixer(getattr(self, self._names[0])(x), coll, offsets)
        h = x + (a * self.residual if self.residual != 1.0 else a)
        if self._names[3]:
            n = getattr(self, self._names[2])(h)
            outs = [getattr(self, name)(n) for name in self._names[3]]
            m = outs[0]
            for o in outs[1:]:
                m = m + o
            h = h + (m * self.residual if self.residual != 1.0 else m)
        return h


class HybridDecoder(Module):
    """Embedding -> layers -> final RMSNorm -> ``lm_head``: float32 logits of each request's last token
    (of every token with ``return_logits = ReturnLogits.ALL``).

    Called like :class:`max.nn.transformer.Transformer` (``tokens, cache inputs, return_n_logits,
    input_row_offsets``); the embedding and final norm sit under the checkpoint's names."""

    def __init__(self, cfg: DecoderConfig, layers: list[Module], embedding: Module, norm: Module, lm_head: Module,
                 collection: FetchHybridCollection, embedding_name: str, norm_name: str) -> None:
        super().__init__()
        from max.nn.layer import LayerList

        self._names = (embedding_name, norm_name)
        setattr(self, embedding_name, embedding)
        self.layers = LayerList(list(layers))
        setattr(self, norm_name, norm)
        self.lm_head = lm_head
        self.embedding_multiplier = cfg.embedding_multiplier
        self.logits_scaling = cfg.logits_scaling
        self.return_logits = ReturnLogits.LAST_TOKEN
        """``ALL``: every position's logits (``PipelineConfig.enable_echo``)."""
        object.__setattr__(self, "_collection", collection)

    def __call__(self, tokens: Any, kv_cache_inputs: Sequence[Any], return_n_logits: Any,
                 input_row_offsets: Any) -> tuple:
        from max.nn.transformer.transformer import finish_logits

        h = getattr(self, self._names[0])(tokens)
        if self.embedding_multiplier != 1.0:
            h = h * self.embedding_multiplier
        coll = self._collection(*kv_cache_inputs)
        offsets = input_row_offsets.tensor if hasattr(input_row_offsets, "tensor") else input_row_offsets
        for i, layer in enumerate(self.layers):
            h = layer(i, h, coll, None, offsets)
        mode = ReturnLogits(self.return_logits)
        if mode is ReturnLogits.VARIABLE:
            raise NotImplementedError("hybrid decoders: ReturnLogits.VARIABLE is not supported")
        if mode is ReturnLogits.LAST_TOKEN:
            h = ops.gather(h, offsets.cast(DType.int64)[1:] - 1, axis=0)
        logits = finish_logits(self.lm_head(getattr(self, self._names[1])(h)), self.logits_scaling)
        return (logits,) if mode is ReturnLogits.LAST_TOKEN else (logits, offsets)


def build_hybrid(cfg: DecoderConfig, factory: WeightFactory, kv_params: KVCacheParams, layers: list[Module],
                 n_attention_layers: int, specs: Sequence[StateSpec], embedding_name: str = "embed_tokens",
                 norm_name: str = "norm") -> HybridDecoder:
    """The whole model over the hybrid cache (see :class:`HybridDecoder`); ``lm_head`` tied to the
    embedding when ``cfg.tie_word_embeddings``."""
    embedding = factory.embedding(embedding_name, cfg.vocab_size, cfg.hidden_size)
    lm_head = factory.linear("lm_head", cfg.hidden_size, cfg.vocab_size,
                             tied_to=embedding if cfg.tie_word_embeddings else None)
    model = HybridDecoder(cfg, layers, embedding, rms_norm(cfg, cfg.hidden_size, factory.dtype), lm_head,
                          FetchHybridCollection(kv_params, max(1, n_attention_layers), [s.name for s in specs]),
                          embedding_name, norm_name)
    factory.check_paths(model)
    return model


class HybridPipelineModel(DecoderPipelineModel):
    """A hybrid family's pipeline model.  A family sets ``config_from_hf``, ``weight_adapters`` and
    ``build_module`` (via :func:`build_hybrid`) and overrides :meth:`state_specs` and
    :meth:`attention_layers`."""

    @classmethod
    def attention_layers(cls, cfg: DecoderConfig) -> list[int]:
        """The model layers with attention (their K/V go to the page pool, in this order)."""
        return []

    @classmethod
    def state_specs(cls, cfg: DecoderConfig) -> list[StateSpec]:
        raise NotImplementedError

    @classmethod
    def kv_cache_shape(cls, cfg: DecoderConfig) -> tuple[int, int]:
        if not cls.attention_layers(cfg):  # a token-sized placeholder pool: no attention layer reads it
            return 1, 1
        return cfg.num_key_value_heads, cfg.head_dim

    attention_free_max_length = 16384
    """``max_length`` of a model without attention layers when none is given (it has no position limit,
    but its placeholder page pool is sized by ``max_length``)."""

    @classmethod
    def calculate_max_seq_len(cls, pipeline_config: Any, huggingface_config: Any) -> int:
        cfg = cls.decoder_config(pipeline_config)
        if not cls.attention_layers(cfg) and getattr(pipeline_config, "max_length", None) is None:
            return min(cfg.max_position_embeddings, cls.attention_free_max_length)
        return super().calculate_max_seq_len(pipeline_config, huggingface_config)

    def __init__(self, pipeline_config: Any, *args: Any, **kw: Any) -> None:
        if getattr(pipeline_config, "lora_config", None) is not None:
            arch = (getattr(pipeline_config.model_config, "architectures", None) or [type(self).__name__])[0]
            raise NotImplementedError(f"{arch}: LoRA adapters are not supported for models with recurrent layers "
                                      "yet")
        if getattr(pipeline_config, "draft_model_path", None):
            arch = (getattr(pipeline_config.model_config, "architectures", None) or [type(self).__name__])[0]
            raise NotImplementedError(f"{arch}: speculative decoding is not supported for models with recurrent "
                                      "layers (rejected draft tokens would have to be rewound out of the state)")
        super().__init__(pipeline_config, *args, **kw)

    def make_kv_manager(self, kv_params: KVCacheParams, max_batch: int, cfg: DecoderConfig, devices: list,
                        session: Any, kvc: Any) -> Any:
        from max.nn.kv_cache import HybridKVCacheManager, kv_cache_budget, state_bytes, state_slots_for

        specs = self.state_specs(cfg)
        n_attn = max(1, len(self.attention_layers(cfg)))
        budget = kv_cache_budget(kv_params, n_attn, max_batch, self.max_seq_len, devices,
                                 kv_cache_memory=kvc.kv_cache_memory,
                                 device_memory_utilization=kvc.device_memory_utilization,
                                 state_bytes=state_bytes(specs, state_slots_for(
                                     max_batch, kv_params.enable_prefix_caching)))
        return HybridKVCacheManager(kv_params, max_batch_size=max_batch, max_seq_len=self.max_seq_len,
                                    num_layers=n_attn, devices=devices, session=session,
                                    available_cache_memory=budget, state_specs=specs)

