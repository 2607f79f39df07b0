"""Gemma 4's attention, scaled decoder layer and pipeline model (see the package docstring).

Global and sliding-window layers may differ in head size and KV heads; the paged cache holds the
largest of each.  A layer with smaller heads writes its q/k/v zero-padded to the cache's head size
(zeros change no dot product and give zero output dims, which are dropped), and a layer with fewer KV
heads writes each head repeated (query head ``h`` still reads its own group's keys).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from max.dtype import DType
from max.graph import DeviceRef, TensorValue, Weight, ops
from max.nn import kernels
from max.nn.kernels import MHAMaskVariant
from max.nn.kernels_decoder import ragged_rope, ragged_rope_tables, ragged_write_plan
from max.nn.kv_cache import FetchPagedKVCacheCollection, KVCacheParams
from max.nn.layer import Module
from max.nn.norm import RMSNorm
from max.nn.rotary_embedding import rope_from_hf
from max.pipelines.architectures.common.config import DecoderConfig
from max.nn.transformer import Transformer
from max.pipelines.architectures.common.layers import DecoderLayer, GatedMLP, activation, build_decoder, rms_norm
from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.graph.weights import WeightsFormat
from max.pipelines.architectures.common.weights import WeightFactory, rename_hf, standard_adapters
from max.pipelines.architectures.gemma4.config import config_from_hf
from max.pipelines.architectures.gemma4.moe import Gemma4Experts, split_experts


class Gemma4Attention(Module):
    """One layer's attention: q/k/v projections of the layer's head size, per-head RMSNorm of q and k and
    a weightless one of v, RoPE of the layer's kind, softmax scale 1, the layer's window (sliding
    layers); global layers with ``attention_k_eq_v`` take the keys' projection as values."""

    def __init__(self, cfg: DecoderConfig, layer: int, factory: WeightFactory, kv_params: KVCacheParams,
                 max_seq_len: int) -> None:
        super().__init__()
        e = cfg.extra
        kind = cfg.layer_types[layer]
        H, d, hkv, hidden = cfg.num_attention_heads, e["head_dims"][layer], e["kv_heads"][layer], cfg.hidden_size
        self.H, self.d, self.hkv, self.layer, self.kv_params = H, d, hkv, layer, kv_params
        self.source = int(e["kv_sources"][layer])
        """The layer whose cache entries this one reads: itself, or (KV sharing) an earlier layer of its type,
        whose keys and values this layer uses without computing or writing any."""
        self.window = cfg.layer_window(layer)
        self.eps = cfg.rms_norm_eps
        p = f"layers.{layer}.self_attn"
        bias = cfg.attention_bias
        self.q_proj = factory.linear(f"{p}.q_proj", hidden, H * d, bias)
        self.k_eq_v = bool(e["k_eq_v"]) and kind == "full_attention"
        if self.source == layer:
            self.k_proj = factory.linear(f"{p}.k_proj", hidden, hkv * d, bias)
            if not self.k_eq_v:
                self.v_proj = factory.linear(f"{p}.v_proj", hidden, hkv * d, bias)
            self.k_norm = RMSNorm(d, factory.dtype, cfg.rms_norm_eps, multiply_before_cast=True)
        self.o_proj = factory.linear(f"{p}.o_proj", H * d, hidden, cfg.o_proj_bias)
        self.q_norm = RMSNorm(d, factory.dtype, cfg.rms_norm_eps, multiply_before_cast=True)
        rp = dict(e["rope_parameters"][kind])
        theta = float(rp.get("rope_theta") or (1e6 if kind == "full_attention" else 1e4))
        try:
            self.rope = rope_from_hf(rp, max_position_embeddings=cfg.max_position_embeddings, dim=H * d, n_heads=H,
                                     theta=theta, max_seq_len=max_seq_len, device=factory.device, head_dim=d,
                                     interleaved=False)
        except NotImplementedError as err:
            raise NotImplementedError(f"{cfg.architecture}: {err}") from None

    def _v_norm(self, v: TensorValue) -> TensorValue:
        vf = v.cast(DType.float32)
        return (vf * ops.rsqrt(ops.mean(vf * vf, axis=-1) + self.eps)).cast(v.dtype)

    def _to_cache(self, x: TensorValue, heads: int) -> TensorValue:
        """``[T, n, d]`` -> ``[T, heads * D]``: heads repeated to ``heads``, dims zero-padded to the cache's."""
        T, n, D = x.shape[0], int(x.shape[1]), self.kv_params.head_dim
        if heads != n:
            r = heads // n
            x = ops.reshape(ops.broadcast_to(ops.unsqueeze(x, 2), [T, n, r, self.d]), [T, heads, self.d])
        if D != self.d:
            zeros = ops.broadcast_to(ops.constant(0.0, x.dtype, x.device), [T, heads, D - self.d])
            x = ops.concat([x, zeros], axis=-1)
        return ops.reshape(x, [T, heads * D])

    def __call__(self, layer_idx: Any, x: TensorValue, kv_collection: Any, freqs_cis: Any,
                 input_row_offsets: TensorValue) -> TensorValue:
        H, d, hkv = self.H, self.d, self.hkv
        T = x.shape[0]
        q = self.q_norm(ops.reshape(self.q_proj(x), [T, H, d]))
        positions, _, _ = ragged_write_plan(input_row_offsets, kv_collection)
        cos, sin = ragged_rope_tables(self.rope.freqs_cis, positions)
        q = ragged_rope(q, cos, sin, False)
        if self.source != self.layer:  # KV sharing: the source layer's cache entries (written earlier this step)
            qs = ops.reshape(self._to_cache(q, H), [T, H, self.kv_params.head_dim])
            layer_idx = ops.constant(self.source, DType.uint32, x.device)
        else:
            k_raw = ops.reshape(self.k_proj(x), [T, hkv, d])
            v = self._v_norm(k_raw if self.k_eq_v else ops.reshape(self.v_proj(x), [T, hkv, d]))
            k = ragged_rope(self.k_norm(k_raw), cos, sin, False)
            heads = self.kv_params.n_kv_heads
            qkv = ops.concat([self._to_cache(q, H), self._to_cache(k, heads), self._to_cache(v, heads)], axis=-1)
            qs = kernels.ragged_qkv_store(self.kv_params, qkv, input_row_offsets, kv_collection, self.layer, H)
        variant = MHAMaskVariant.SLIDING_WINDOW_CAUSAL_MASK if self.window else MHAMaskVariant.CAUSAL_MASK
        o = kernels.flash_attention_ragged(self.kv_params, qs, input_row_offsets, kv_collection, layer_idx, variant,
                                           1.0, local_window_size=self.window or -1)
        return self.o_proj(ops.reshape(o[:, :, :d], [T, H * d]))


class Gemma4Layer(DecoderLayer):
    """The decoder layer (Gemma 3's four norms), then with per-layer input embeddings
    ``h + norm(per_layer_projection(act(per_layer_input_gate(h)) * per_layer_input))``, the output multiplied
    by ``layer_scalar``."""

    per_layer_input: TensorValue | None = None
    """Set while a graph is built (:class:`Gemma4Transformer`): this layer's ``[total_seq_len, ple_dim]`` input."""

    def __init__(self, cfg: DecoderConfig, layer: int, attention: Module, mlp: Module, dtype: DType,
                 factory: WeightFactory) -> None:
        super().__init__(cfg, attention, mlp, dtype)
        self.layer_scalar = Weight("layer_scalar", dtype, [1], factory.device)
        ple, hidden = int(cfg.extra["ple_dim"]), cfg.hidden_size
        self.ple = ple
        if ple:
            p = f"layers.{layer}"
            self.per_layer_input_gate = factory.linear(f"{p}.per_layer_input_gate", hidden, ple, False)
            self.per_layer_projection = factory.linear(f"{p}.per_layer_projection", ple, hidden, False)
            self.post_per_layer_input_norm = rms_norm(cfg, hidden, dtype)
            object.__setattr__(self, "_act", activation(cfg.hidden_act, cfg.architecture))
        self.moe: Gemma4Experts | None = None
        if cfg.extra["num_experts"]:  # routed experts beside the dense MLP (their weights: layers.N.router/experts)
            moe = Gemma4Experts(cfg, layer, factory)
            self.router, self.experts = moe.router, moe.experts
            object.__setattr__(self, "moe", moe)
            for name in ("post_feedforward_layernorm_1", "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2"):
                setattr(self, name, rms_norm(cfg, hidden, dtype))

    def _with_experts(self, layer_idx: Any, x: TensorValue, kv_collection: Any, freqs_cis: Any,
                      input_row_offsets: TensorValue) -> TensorValue:
        """The layer with the MoE block: ``h + norm(norm_1(mlp(h')) + norm_2(experts(h)))``."""
        a = self.self_attn(layer_idx, self._norm(0, x), kv_collection, freqs_cis, input_row_offsets)
        h = x + self._norm(1, a)
        m = self.post_feedforward_layernorm_1(self.mlp(self._norm(2, h)))
        m = m + self.post_feedforward_layernorm_2(self.moe(h, self.pre_feedforward_layernorm_2(h)))
        return h + self._norm(3, m)

    def __call__(self, layer_idx: Any, x: TensorValue, kv_collection: Any, freqs_cis: Any,
                 input_row_offsets: TensorValue) -> TensorValue:
        if self.moe is not None:
            h = self._with_experts(layer_idx, x, kv_collection, freqs_cis, input_row_offsets)
        else:
            h = super().__call__(layer_idx, x, kv_collection, freqs_cis, input_row_offsets)
        if self.ple:
            if self.per_layer_input is None:
                raise RuntimeError("Gemma4Layer: per_layer_input is set by Gemma4Transformer while the graph is built")
            g = self._act(self.per_layer_input_gate(h)) * self.per_layer_input
            h = h + self.post_per_layer_input_norm(self.per_layer_projection(g))
        return h * self.layer_scalar


class Gemma4Transformer(Transformer):
    """The decoder; with per-layer input embeddings (``ple_dim`` > 0) each layer also gets
    ``(norm(per_layer_model_projection(e) / sqrt(hidden)) + embed_tokens_per_layer(token) * sqrt(ple_dim))
    / sqrt(2)`` of its own slice (``e``: the scaled token embedding)."""

    ple_dim = 0

    def add_per_layer_inputs(self, cfg: DecoderConfig, factory: WeightFactory) -> None:
        """Create the per-layer embedding table, the model projection and its norm (E2B/E4B)."""
        ple, n = int(cfg.extra["ple_dim"]), cfg.num_hidden_layers
        self.ple_dim, self.hidden = ple, cfg.hidden_size
        self.embed_tokens_per_layer = factory.embedding("embed_tokens_per_layer", int(cfg.extra["ple_vocab"]), n * ple)
        self.per_layer_model_projection = factory.linear("per_layer_model_projection", cfg.hidden_size, n * ple, False)
        self.per_layer_projection_norm = rms_norm(cfg, ple, factory.dtype)

    def __call__(self, tokens: Any, kv_cache_inputs: Any, return_n_logits: Any, input_row_offsets: Any) -> tuple:
        h = self.embed(tokens)
        if self.ple_dim:
            P, n = self.ple_dim, len(self.layers)
            T = h.shape[0]
            proj = ops.reshape(self.per_layer_model_projection(h) * (float(self.hidden) ** -0.5), [T, n, P])
            own = ops.reshape(self.embed_tokens_per_layer(tokens) * (float(P) ** 0.5), [T, n, P])
            pli = (self.per_layer_projection_norm(proj) + own) * (2.0 ** -0.5)
            for i, layer in enumerate(self.layers):
                layer.per_layer_input = pli[:, i, :]
        try:
            return self.forward_embeddings(h, kv_cache_inputs, return_n_logits, input_row_offsets)
        finally:
            for layer in self.layers:
                layer.per_layer_input = None


_SHARED_LAYER_KV = ("self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.k_norm.weight",
                    "self_attn.v_norm.weight")


def rename_gemma4(state_dict: dict, huggingface_config: Any = None, **kw: Any) -> dict:
    """Hugging Face names minus ``model.``, the MoE block's fused expert tensors split, without the
    unused K/V projections some checkpoints keep for the layers that share an earlier layer's keys and values."""
    hf = huggingface_config.to_dict() if hasattr(huggingface_config, "to_dict") else dict(huggingface_config or {})
    out = split_experts(rename_hf(state_dict))
    if not hf:
        return out
    cfg = config_from_hf(hf)
    shared = {f"layers.{i}.{leaf}" for i, src in enumerate(cfg.extra["kv_sources"]) if src != i
              for leaf in _SHARED_LAYER_KV}
    return {k: v for k, v in out.items() if k not in shared}


class Gemma4Model(DecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = {**standard_adapters(), WeightsFormat.safetensors: rename_gemma4,
                       WeightsFormat.pytorch: rename_gemma4}

    @classmethod
    def unsupported_reason(cls, hf: dict) -> str | None:
        """Why this config is not run natively (see the package docstring; the registry then uses the
        transformers fallback when allowed), else None."""
        try:
            cls.config_from_hf(hf)
        except NotImplementedError as e:
            return str(e)
        return None

    @classmethod
    def get_num_layers(cls, huggingface_config: Any) -> int:
        """Layers with their own cache entries: the layers that share an earlier layer's keys and values
        (KV sharing: always the last ones) have none."""
        return int(cls._cfg_of(huggingface_config).extra["kv_layers"])

    def make_kv_manager(self, kv_params: KVCacheParams, max_batch: int, cfg: DecoderConfig, devices: list,
                        session: Any, kvc: Any) -> Any:
        """The paged cache of the layers that compute keys and values (see :meth:`get_num_layers`)."""
        return super().make_kv_manager(kv_params, max_batch, replace(cfg, num_hidden_layers=cfg.extra["kv_layers"]),
                                       devices, session, kvc)

    @classmethod
    def kv_cache_shape(cls, cfg: DecoderConfig) -> tuple[int, int]:
        """The most KV heads and the largest head size of any layer."""
        return max(cfg.extra["kv_heads"]), max(cfg.extra["head_dims"])

    @classmethod
    def build_module(cls, cfg: DecoderConfig, factory: WeightFactory, kv_params: KVCacheParams,
                     max_seq_len: int) -> Any:
        def mlp(c: DecoderConfig, i: int, f: WeightFactory) -> Module:
            return GatedMLP(f"layers.{i}.mlp", f, c.hidden_size, int(c.extra["intermediate"][i]), c.hidden_act,
                            has_bias=c.mlp_bias, who=c.architecture)

        model = build_decoder(cfg, factory, kv_params, max_seq_len, make_mlp=mlp,
                              make_attention=lambda c, i, f, kvp, n: Gemma4Attention(c, i, f, kvp, n),
                              make_layer=lambda c, i, a, m, dt: Gemma4Layer(c, i, a, m, dt, factory),
                              transformer_cls=Gemma4Transformer)
        # the cache holds the layers that compute keys and values (the first ``kv_layers``, see get_num_layers)
        model.kv_collection_constructor = FetchPagedKVCacheCollection(kv_params, int(cfg.extra["kv_layers"]))
        if cfg.extra["ple_dim"]:
            model.add_per_layer_inputs(cfg, factory)
            factory.check_paths(model)
        return model
