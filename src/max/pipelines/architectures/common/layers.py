"""The shared decoder: attention over the paged KV cache, gated MLP, decoder layer, and the
builder that assembles them from a :class:`DecoderConfig`.

Every projection and embedding comes from the :class:`WeightFactory` under its module path, so the
modules here never decide how a checkpoint weight is represented.  Module attribute names are the
Hugging Face names (after ``model.`` is dropped), so safetensors checkpoints need no renaming.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from max.dtype import DType
from max.graph import DeviceRef, TensorValue, Weight, ops
from max.nn import kernels
from max.nn.kernels import MHAMaskVariant
from max.nn.kernels_decoder import ragged_attention, ragged_rope_tables
from max.nn.kv_cache import FetchPagedKVCacheCollection, KVCacheParams
from max.nn.layer import LayerList, Module
from max.nn.norm import RMSNorm
from max.nn.rotary_embedding import (
    LinearScalingParams,
    Llama3RopeScalingParams,
    Llama3RotaryEmbedding,
    RotaryEmbedding,
)
from max.nn.transformer import ReturnLogits, Transformer
from max.pipelines.architectures.common.config import DecoderConfig
from max.pipelines.architectures.common.weights import WeightFactory

__all__ = ["DecoderAttention", "DecoderLayer", "GatedMLP", "build_decoder", "make_rope", "rms_norm"]

_ACTS: dict[str, Callable[[TensorValue], TensorValue]] = {
    "silu": ops.silu,
    "swish": ops.silu,
    "gelu": lambda x: ops.gelu(x),
    "gelu_pytorch_tanh": lambda x: ops.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: ops.gelu(x, approximate="tanh"),
    "gelu_tanh": lambda x: ops.gelu(x, approximate="tanh"),
    "relu": ops.relu,
}


def activation(name: str, who: str) -> Callable[[TensorValue], TensorValue]:
    if name not in _ACTS:
        raise NotImplementedError(f"{who}: hidden activation {name!r} is not supported (supported: {sorted(_ACTS)})")
    return _ACTS[name]


def rms_norm(cfg: DecoderConfig, dim: int, dtype: DType) -> RMSNorm:
    return RMSNorm(dim, dtype, cfg.rms_norm_eps, weight_offset=cfg.norm_weight_offset,
                   multiply_before_cast=cfg.norm_multiply_before_cast)


class _Rope:
    """A RoPE table plus the layout of the rotated dims (what attention needs to rotate q and k)."""

    def __init__(self, table: RotaryEmbedding, interleaved: bool) -> None:
        self.table = table
        self.interleaved = interleaved

    def tables(self, positions: TensorValue) -> tuple[TensorValue, TensorValue]:
        return ragged_rope_tables(self.table.freqs_cis, positions)


def make_rope(cfg: DecoderConfig, max_seq_len: int, device: DeviceRef, theta: float | None = None,
              scaling: dict | None | bool = True) -> _Rope:
    """The RoPE of ``cfg`` (``theta``/``scaling`` override the base and the scaling; ``scaling=False``:
    unscaled).  Raises NotImplementedError naming the architecture for an unsupported scaling."""
    rot = int(cfg.head_dim * cfg.partial_rotary_factor)
    rot -= rot % 2
    th = cfg.rope_theta if theta is None else theta
    sc = cfg.rope_scaling if scaling is True else (scaling or None)
    common = dict(dim=cfg.num_attention_heads * cfg.head_dim, n_heads=cfg.num_attention_heads, theta=th,
                  max_seq_len=max_seq_len, device=device, head_dim=rot, interleaved=cfg.interleaved_rope)
    kind = (sc or {}).get("rope_type") or (sc or {}).get("type") or "default"
    if kind == "default":
        table: RotaryEmbedding = RotaryEmbedding(**common)
    elif kind == "llama3":
        table = Llama3RotaryEmbedding(**common, scaling_params=Llama3RopeScalingParams(
            factor=float(sc["factor"]), low_freq_factor=float(sc.get("low_freq_factor", 1.0)),
            high_freq_factor=float(sc.get("high_freq_factor", 4.0)),
            orig_max_position=int(sc.get("original_max_position_embeddings", 8192))))
    elif kind == "linear":
        table = _LinearRotaryEmbedding(**common, scaling_params=LinearScalingParams(factor=float(sc["factor"])))
    elif kind == "longrope":
        table = _LongRotaryEmbedding(**common, scaling=sc, max_position_embeddings=cfg.max_position_embeddings)
    elif kind == "yarn":
        table = _YarnRotaryEmbedding(**common, scaling=sc, max_position_embeddings=cfg.max_position_embeddings)
    else:
        raise NotImplementedError(f"{cfg.architecture}: RoPE scaling {kind!r} is not supported yet "
                                  "(supported: default, linear, llama3, longrope, yarn)")
    return _Rope(table, cfg.interleaved_rope)


class _LinearRotaryEmbedding(RotaryEmbedding):
    """Position interpolation: every frequency divided by ``factor``."""

    def __init__(self, *, scaling_params: LinearScalingParams, **kw: Any) -> None:
        super().__init__(**kw)
        self.scaling_params = scaling_params

    def _inv_freq(self) -> Any:
        return super()._inv_freq() / self.scaling_params.factor


class _LongRotaryEmbedding(RotaryEmbedding):
    """LongRoPE (Phi-3/3.5/4-mini): per-frequency divisors, and the attention factor
    ``sqrt(1 + ln(s) / ln(original_max))`` (``s = max_position_embeddings / original_max`` unless
    ``factor`` is given) folded into the cos/sin table.

    The divisors are chosen once for the model: ``short_factor`` when the longest sequence this model
    runs (``max_seq_len``) fits the original context, ``long_factor`` otherwise (llama.cpp's choice;
    transformers switches per forward pass on the current length, so the two agree whenever every
    sequence stays within the original context or the model's ``max_length`` exceeds it and so does
    the sequence)."""

    def __init__(self, *, scaling: dict, max_position_embeddings: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.scaling = scaling
        self.max_position_embeddings = max_position_embeddings
        half = self._rope_dim() // 2
        for what in ("short_factor", "long_factor"):
            if len(scaling[what]) != half:
                raise ValueError(f"longrope: {what} has {len(scaling[what])} entries, expected rope_dim / 2 = {half}")

    def _table(self) -> Any:
        import numpy as np

        from max.nn.rotary_embedding import _cis_table

        sc = self.scaling
        orig = int(sc["original_max_position_embeddings"])
        factor = sc.get("factor") or self.max_position_embeddings / orig
        att = sc.get("attention_factor")
        if att is None:
            att = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        ext = np.asarray(sc["long_factor"] if self.max_seq_len > orig else sc["short_factor"], np.float64)
        return _cis_table(np.arange(self._num_positions()), super()._inv_freq() / ext, float(att))


class _YarnRotaryEmbedding(RotaryEmbedding):
    """YaRN: frequencies blended between interpolated (``/ factor``) and original over a ramp of dims
    set by ``beta_fast``/``beta_slow``; the attention factor (``attention_factor``, else
    ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)``, else ``0.1 ln(factor) + 1``) folded into
    the cos/sin table.  ``factor`` defaults to ``max_position_embeddings / original_max_position_embeddings``."""

    def __init__(self, *, scaling: dict, max_position_embeddings: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.scaling = scaling
        self.max_position_embeddings = max_position_embeddings

    def _table(self) -> Any:
        import numpy as np

        from max.nn.rotary_embedding import _cis_table, _yarn_inv_freq, _yarn_mscale

        sc = self.scaling
        orig = int(sc.get("original_max_position_embeddings") or self.max_position_embeddings)
        factor = float(sc.get("factor") or self.max_position_embeddings / orig)
        att = sc.get("attention_factor")
        if att is None:
            m, m_all = sc.get("mscale"), sc.get("mscale_all_dim")
            att = _yarn_mscale(factor, m) / _yarn_mscale(factor, m_all) if m and m_all else _yarn_mscale(factor)
        inv = _yarn_inv_freq(self.theta, self._rope_dim(), factor, float(sc.get("beta_fast") or 32),
                             float(sc.get("beta_slow") or 1), orig, bool(sc.get("truncate", True)))
        return _cis_table(np.arange(self._num_positions()), inv, float(att))


class DecoderAttention(Module):
    """Self-attention of one layer over the paged KV cache.

    q/k/v come from the factory's projections (one fused matmul where the factory can fuse them,
    or the checkpoint's own ``qkv_proj``); optional q/k RMSNorm (over the whole projections here, per
    head inside the next kernel), then ``max.nn.kernels.ragged_qkv_store`` (per-head norm, RoPE on the
    first rotary dims, K/V written to the cache), causal (optionally sliding-window) attention over
    each request's cached positions (``ragged_attention`` when the layer has sinks or soft-capping),
    and ``o_proj``.
    """

    def __init__(self, cfg: DecoderConfig, layer: int, factory: WeightFactory, kv_params: KVCacheParams,
                 rope: _Rope | None, window: int | None = None, scale: float | None = None) -> None:
        super().__init__()
        p = f"layers.{layer}.self_attn"
        H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = H, Hkv, D
        self.kv_params = kv_params
        self.layer = layer
        self.rope = rope
        self.window = window
        self.scale = scale if scale is not None else (cfg.attention_scale or 1.0 / math.sqrt(D))
        hidden = cfg.hidden_size
        if cfg.fused_qkv:
            self.qkv_proj = factory.linear(f"{p}.qkv_proj", hidden, (H + 2 * Hkv) * D, cfg.attention_bias)
            qkv: Callable[[TensorValue], TensorValue] = self.qkv_proj
        else:
            self.q_proj = factory.linear(f"{p}.q_proj", hidden, H * D, cfg.attention_bias)
            self.k_proj = factory.linear(f"{p}.k_proj", hidden, Hkv * D, cfg.attention_bias)
            self.v_proj = factory.linear(f"{p}.v_proj", hidden, Hkv * D, cfg.attention_bias)
            qkv = factory.fuse([self.q_proj, self.k_proj, self.v_proj])
        object.__setattr__(self, "_qkv", qkv)  # a function, not a sub-module
        self.o_proj = factory.linear(f"{p}.o_proj", H * D, hidden, cfg.o_proj_bias)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm == "head":
            self.q_norm = rms_norm(cfg, D, factory.dtype)
            self.k_norm = rms_norm(cfg, D, factory.dtype)
        elif cfg.qk_norm == "full":
            self.q_norm = rms_norm(cfg, H * D, factory.dtype)
            self.k_norm = rms_norm(cfg, Hkv * D, factory.dtype)
        elif cfg.qk_norm is not None:
            raise ValueError(f"{cfg.architecture}: qk_norm must be 'head', 'full' or None, got {cfg.qk_norm!r}")
        self.softcap = cfg.attn_logit_softcapping
        self.sinks = Weight("sinks", factory.dtype, [H], factory.device) if cfg.attention_sinks else None
        self.block_groups: TensorValue | None = None
        """Set while a graph is built: an int64 ``[total_seq_len]`` block id per token (-1: none); tokens of
        one block attend to each other both ways (Gemma 3's image tokens), see ``ragged_attention``."""

    def __call__(self, layer_idx: Any, x: TensorValue, kv_collection: Any, freqs_cis: Any,
                 input_row_offsets: TensorValue) -> TensorValue:
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = self._qkv(x)
        if self.qk_norm == "full":  # over the whole projection: before the per-head split
            q, k, v = qkv[:, : H * D], qkv[:, H * D:(H + Hkv) * D], qkv[:, (H + Hkv) * D:]
            qkv = ops.concat([self.q_norm(q), self.k_norm(k), v], axis=-1)
        q_norm = k_norm = None
        eps = 1e-6
        if self.qk_norm == "head":
            q_norm, k_norm, eps = _gamma(self.q_norm), _gamma(self.k_norm), self.q_norm.eps
        # split, per-head QK-norm, RoPE (on the table's first dims of each head) and the K/V write: one op
        q = kernels.ragged_qkv_store(self.kv_params, qkv, input_row_offsets, kv_collection, self.layer, H,
                                     freqs_cis=self.rope.table.freqs_cis if self.rope is not None else None,
                                     interleaved=self.rope.interleaved if self.rope is not None else False,
                                     q_norm=q_norm, k_norm=k_norm, norm_eps=eps)
        if self.sinks is not None or self.softcap or self.block_groups is not None:
            attn = ragged_attention(self.kv_params, q, input_row_offsets, kv_collection, layer_idx, self.scale,
                                    self.window, sinks=self.sinks, softcap=self.softcap, groups=self.block_groups)
        else:
            variant = MHAMaskVariant.SLIDING_WINDOW_CAUSAL_MASK if self.window else MHAMaskVariant.CAUSAL_MASK
            attn = kernels.flash_attention_ragged(self.kv_params, q, input_row_offsets, kv_collection, layer_idx,
                                                  variant, self.scale, local_window_size=self.window or -1)
        return self.o_proj(ops.reshape(attn, [x.shape[0], H * D]))


def _gamma(norm: RMSNorm) -> TensorValue:
    """An RMSNorm's effective weight (``weight + weight_offset``) as the per-head norms of ragged_qkv_store
    take it."""
    w: TensorValue = norm.weight
    return w + norm.weight_offset if norm.weight_offset else w


class GatedMLP(Module):
    """``down_proj(act(gate_proj(x)) * up_proj(x))``; ``fused``: the checkpoint's ``gate_up_proj``
    holds gate then up."""

    def __init__(self, prefix: str, factory: WeightFactory, hidden: int, inter: int, act: str, fused: bool = False,
                 has_bias: bool = False, who: str = "GatedMLP") -> None:
        super().__init__()
        self.inter = inter
        self.fused = fused
        object.__setattr__(self, "_act", activation(act, who))
        if fused:
            self.gate_up_proj = factory.linear(f"{prefix}.gate_up_proj", hidden, 2 * inter, has_bias)
        else:
            self.gate_proj = factory.linear(f"{prefix}.gate_proj", hidden, inter, has_bias)
            self.up_proj = factory.linear(f"{prefix}.up_proj", hidden, inter, has_bias)
        self.down_proj = factory.linear(f"{prefix}.down_proj", inter, hidden, has_bias)

    def __call__(self, x: TensorValue) -> TensorValue:
        if self.fused:
            gu = self.gate_up_proj(x)
            return self.down_proj(self._act(gu[..., : self.inter]) * gu[..., self.inter:])
        return self.down_proj(self._act(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(Module):
    """One decoder layer with the norms of ``cfg.norms`` (pre/post attention, pre/post MLP), residuals
    scaled by ``cfg.residual_multiplier``."""

    def __init__(self, cfg: DecoderConfig, attention: Module, mlp: Module, dtype: DType) -> None:
        super().__init__()
        self.self_attn = attention
        self.mlp = mlp
        self.residual_multiplier = cfg.residual_multiplier
        plan = cfg.norms
        self._norm_names = (plan.pre_attention, plan.post_attention, plan.pre_mlp, plan.post_mlp)
        for name in self._norm_names:
            if name is not None:
                setattr(self, name, rms_norm(cfg, cfg.hidden_size, dtype))

    def _norm(self, which: int, x: TensorValue) -> TensorValue:
        name = self._norm_names[which]
        return x if name is None else getattr(self, name)(x)

    def __call__(self, layer_idx: Any, x: TensorValue, kv_collection: Any, freqs_cis: Any,
                 input_row_offsets: TensorValue) -> TensorValue:
        a = self.self_attn(layer_idx, self._norm(0, x), kv_collection, freqs_cis, input_row_offsets)
        a = self._norm(1, a)
        if self.residual_multiplier != 1.0:
            a = a * self.residual_multiplier
        h = x + a
        m = self._norm(3, self.mlp(self._norm(2, h)))
        if self.residual_multiplier != 1.0:
            m = m * self.residual_multiplier
        return h + m


def _softcap(cap: float) -> Callable[[TensorValue], TensorValue]:
    return lambda logits: ops.tanh(logits / cap) * cap


MlpBuilder = Callable[[DecoderConfig, int, WeightFactory], Module]
AttentionBuilder = Callable[[DecoderConfig, int, WeightFactory, KVCacheParams, int], Module]


def default_mlp(cfg: DecoderConfig, layer: int, factory: WeightFactory) -> Module:
    """The layer's gated MLP, or its mixture of experts when ``cfg.moe`` says so."""
    if cfg.moe is not None and layer not in cfg.moe.dense_layers:
        from max.pipelines.architectures.common.moe import DecoderMoE

        return DecoderMoE(cfg, layer, factory)
    return GatedMLP(f"layers.{layer}.mlp", factory, cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act,
                    fused=cfg.fused_gate_up, has_bias=cfg.mlp_bias, who=cfg.architecture)


def build_decoder(cfg: DecoderConfig, factory: WeightFactory, kv_params: KVCacheParams, max_seq_len: int,
                  make_mlp: MlpBuilder | None = None, make_attention: AttentionBuilder | None = None,
                  return_logits: ReturnLogits = ReturnLogits.LAST_TOKEN, head: Module | None = None) -> Transformer:
    """The whole decoder: embedding (scaled by ``embedding_multiplier``), layers, final norm, lm_head
    (tied to the embedding when ``tie_word_embeddings``), logits divided by ``logits_scaling`` and
    soft-capped by ``final_logit_softcapping``.

    Layers use ``cfg.layer_window(i)``; sliding-window layers use an unscaled RoPE of base
    ``cfg.local_rope_theta`` when it is set.  ``make_mlp`` / ``make_attention`` replace the gated MLP
    or the attention of each layer (MoE, MLA ...).  ``head`` replaces ``lm_head`` (an embedding model's
    pooling head: no vocabulary projection).
    """
    device = factory.device
    rope = make_rope(cfg, max_seq_len, device)
    local_rope = make_rope(cfg, max_seq_len, device, theta=cfg.local_rope_theta, scaling=False) \
        if cfg.local_rope_theta is not None else rope
    layers = []
    for i in range(cfg.num_hidden_layers):
        window = cfg.layer_window(i)
        if make_attention is not None:
            attn = make_attention(cfg, i, factory, kv_params, max_seq_len)
        else:
            attn = DecoderAttention(cfg, i, factory, kv_params, local_rope if window else rope, window)
        mlp = (make_mlp or default_mlp)(cfg, i, factory)
        layers.append(DecoderLayer(cfg, attn, mlp, factory.dtype))
    embedding = factory.embedding("embed_tokens", cfg.vocab_size, cfg.hidden_size)
    lm_head = head if head is not None else factory.linear(
        "lm_head", cfg.hidden_size, cfg.vocab_size, tied_to=embedding if cfg.tie_word_embeddings else None)
    model = Transformer(
        dim=cfg.hidden_size, n_heads=cfg.num_attention_heads, layers=layers,
        norm=rms_norm(cfg, cfg.hidden_size, factory.dtype), output=lm_head, embedding=embedding,
        kv_params=kv_params, kv_collection_constructor=FetchPagedKVCacheCollection(kv_params, cfg.num_hidden_layers),
        rope=rope.table, return_logits=return_logits, embedding_multiplier=cfg.embedding_multiplier,
        logits_scaling=cfg.logits_scaling,
        logits_postprocessor=_softcap(cfg.final_logit_softcapping) if cfg.final_logit_softcapping else None)
    factory.check_paths(model)
    return model


_ = LayerList
