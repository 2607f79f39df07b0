"""Qwen3-Next / Qwen3.5 layers: the gated DeltaNet mixer (:class:`GatedDeltaNet`, recurrent state in the
hybrid cache's slots) and attention with a sigmoid output gate (:class:`GatedAttention`), plus
:class:`SharedGateMoE` (routed experts plus a sigmoid-gated shared expert)."""

from __future__ import annotations

import math
from typing import Any, Mapping

from max.dtype import DType
from max.graph import DeviceRef, TensorValue, Weight, ops
from max.nn.kv_cache import KVCacheParams, StateSpec
from max.nn.layer import Module
from max.pipelines.architectures.common.config import DecoderConfig, rope_defaults, with_defaults
from max.pipelines.architectures.common.hybrid import HybridCollection, HybridPipelineModel, Params
from max.pipelines.architectures.common.layers import DecoderAttention, GatedMLP, _Rope, default_mlp, rms_norm
from max.pipelines.architectures.common.moe import DecoderMoE
from max.pipelines.architectures.common.weights import WeightFactory

__all__ = ["GatedAttention", "GatedDeltaNet", "SharedGateMoE", "deltanet_state_specs"]


def deltanet_state_specs(layer: int, d: dict) -> list[StateSpec]:
    """Conv window and delta-rule state of DeltaNet layer ``layer`` (``d``: the sizes in ``cfg.extra``)."""
    conv = 2 * d["k_heads"] * d["k_dim"] + d["v_heads"] * d["v_dim"]
    return [StateSpec(f"layers.{layer}.conv", (conv, d["conv_kernel"] - 1)),
            StateSpec(f"layers.{layer}.delta", (d["v_heads"], d["k_dim"], d["v_dim"]))]


class GatedDeltaNet(Module):
    """Gated DeltaNet (Hugging Face ``linear_attn`` names).  ``fused=True`` (Qwen3-Next): ``in_proj_qkvz``
    and ``in_proj_ba`` interleave q, k, v, z (and b, a) per key head; otherwise (Qwen3.5) ``in_proj_qkv``,
    ``in_proj_z``, ``in_proj_b``, ``in_proj_a``.  Causal conv + SiLU over q|k|v, L2-normalised q and k
    (q scaled by ``1/sqrt(k_dim)``), ``beta = sigmoid(b)``, ``g = -exp(A_log) softplus(a + dt_bias)``, the
    gated delta rule, a per-head RMSNorm gated by ``silu(z)``, ``out_proj``."""

    def __init__(self, prefix: str, layer: int, hidden: int, d: dict, eps: float, factory: WeightFactory,
                 fused: bool) -> None:
        super().__init__()
        self.layer, self.d, self.fused, self.eps = layer, d, fused, eps
        Hk, Hv, Dk, Dv = d["k_heads"], d["v_heads"], d["k_dim"], d["v_dim"]
        if Hv % Hk:
            raise ValueError(f"linear_num_value_heads {Hv} is not a multiple of linear_num_key_heads {Hk}")
        kd, vd = Hk * Dk, Hv * Dv
        self.conv_dim = 2 * kd + vd
        if fused:
            self.in_proj_qkvz = factory.linear(f"{prefix}.in_proj_qkvz", hidden, 2 * kd + 2 * vd)
            self.in_proj_ba = factory.linear(f"{prefix}.in_proj_ba", hidden, 2 * Hv)
        else:
            self.in_proj_qkv = factory.linear(f"{prefix}.in_proj_qkv", hidden, 2 * kd + vd)
            self.in_proj_z = factory.linear(f"{prefix}.in_proj_z", hidden, vd)
            self.in_proj_b = factory.linear(f"{prefix}.in_proj_b", hidden, Hv)
            self.in_proj_a = factory.linear(f"{prefix}.in_proj_a", hidden, Hv)
        self.conv1d = Params(factory.device, weight=(factory.dtype, [self.conv_dim, 1, d["conv_kernel"]]))
        self.dt_bias = Weight("dt_bias", factory.dtype, [Hv], factory.device)
        self.A_log = Weight("A_log", factory.dtype, [Hv], factory.device)
        self.norm = Params(DeviceRef.CPU(), weight=(factory.dtype, [Dv]))
        self.out_proj = factory.linear(f"{prefix}.out_proj", vd, hidden)

    def _projections(self, x: TensorValue) -> tuple[TensorValue, ...]:
        """(q|k|v ``[T, conv_dim]``, z ``[T, Hv, Dv]``, b ``[T, Hv]``, a ``[T, Hv]``)."""
        d = self.d
        Hk, Hv, Dk, Dv = d["k_heads"], d["v_heads"], d["k_dim"], d["v_dim"]
        T = x.shape[0]
        # the projections of x as one concat: the compiler runs them (and the norm before them) as one matmul
        if not self.fused:
            c, vd = self.conv_dim, Hv * Dv
            y = ops.concat([self.in_proj_qkv(x), self.in_proj_z(x), self.in_proj_b(x), self.in_proj_a(x)], axis=-1)
            return (y[:, :c], ops.reshape(y[:, c:c + vd], [T, Hv, Dv]), y[:, c + vd:c + vd + Hv],
                    y[:, c + vd + Hv:])
        r = Hv // Hk
        n = Hk * (2 * Dk + 2 * r * Dv)
        y = ops.concat([self.in_proj_qkvz(x), self.in_proj_ba(x)], axis=-1)
        qkvz = ops.reshape(y[:, :n], [T, Hk, 2 * Dk + 2 * r * Dv])
        q = ops.reshape(qkvz[:, :, :Dk], [T, Hk * Dk])
        k = ops.reshape(qkvz[:, :, Dk:2 * Dk], [T, Hk * Dk])
        v = ops.reshape(qkvz[:, :, 2 * Dk:2 * Dk + r * Dv], [T, Hv * Dv])
        z = ops.reshape(qkvz[:, :, 2 * Dk + r * Dv:], [T, Hv, Dv])
        ba = ops.reshape(y[:, n:], [T, Hk, 2 * r])
        b = ops.reshape(ba[:, :, :r], [T, Hv])
        a = ops.reshape(ba[:, :, r:], [T, Hv])
        return ops.concat([q, k, v], axis=-1), z, b, a

    def __call__(self, x: TensorValue, coll: HybridCollection, offsets: TensorValue) -> TensorValue:
        d = self.d
        Hk, Hv, Dk, Dv = d["k_heads"], d["v_heads"], d["k_dim"], d["v_dim"]
        T = x.shape[0]
        f32 = DType.float32
        qkv, z, b, a = self._projections(x)
        w = ops.reshape(self.conv1d.weight, [self.conv_dim, d["conv_kernel"]])
        qkv = ops.causal_conv1d(qkv, w, coll.states[f"layers.{self.layer}.conv"], coll.slots, offsets,
                                activation="silu").cast(f32)
        kd = Hk * Dk
        q = ops.reshape(qkv[:, :kd], [T, Hk, Dk])
        k = ops.reshape(qkv[:, kd:2 * kd], [T, Hk, Dk])
        v = ops.reshape(qkv[:, 2 * kd:], [T, Hv, Dv])
        # the op prepares its inputs: each key head serves Hv / Hk consecutive value heads, q and k
        # L2-normalised (q scaled by 1/sqrt(Dk)), beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias)
        o = ops.gated_delta_rule(q, k, v, a.cast(f32), b.cast(f32), coll.states[f"layers.{self.layer}.delta"],
                                 coll.slots, offsets, A=-ops.exp(self.A_log.cast(f32)), dt_bias=self.dt_bias.cast(f32),
                                 beta_sigmoid=True, qk_l2norm=True, scale=1.0 / math.sqrt(Dk))
        if x.dtype == f32:  # per head: norm, weight, then the gate, as one op
            o = ops.gated_rms_norm(o, z, self.norm.weight.to(x.device), self.eps, norm_before_gate=True)
        else:
            o = o * ops.rsqrt(ops.mean(o * o, axis=-1) + self.eps)  # norm before the gate, per head
            o = (o.cast(x.dtype) * self.norm.weight.to(x.device).cast(x.dtype)).cast(f32) * ops.silu(z.cast(f32))
        return self.out_proj(ops.reshape(o.cast(x.dtype), [T, Hv * Dv]))


class GatedAttention(DecoderAttention):
    """Qwen3-Next attention: ``q_proj`` yields per head the query and a gate; per-head q/k norms, partial
    RoPE and the paged cache as :class:`DecoderAttention`; the output is multiplied by ``sigmoid(gate)``
    before ``o_proj``."""

    def __init__(self, cfg: DecoderConfig, layer: int, factory: WeightFactory, kv_params: KVCacheParams,
                 rope: _Rope | None) -> None:
        Module.__init__(self)
        p = f"layers.{layer}.self_attn"
        H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = H, Hkv, D
        self.kv_params, self.layer, self.rope, self.window = kv_params, layer, rope, None
        self.scale = 1.0 / math.sqrt(D)
        hidden = cfg.hidden_size
        self.q_proj = factory.linear(f"{p}.q_proj", hidden, 2 * H * D, cfg.attention_bias)
        self.k_proj = factory.linear(f"{p}.k_proj", hidden, Hkv * D, cfg.attention_bias)
        self.v_proj = factory.linear(f"{p}.v_proj", hidden, Hkv * D, cfg.attention_bias)
        self.o_proj = factory.linear(f"{p}.o_proj", H * D, hidden, cfg.attention_bias)
        self.qk_norm = "head"
        self.q_norm = rms_norm(cfg, D, factory.dtype)
        self.k_norm = rms_norm(cfg, D, factory.dtype)
        self.softcap = None
        self.sinks = None
        self.block_groups = None
        self.chunk = 0  # no chunked local attention

    def __call__(self, layer_idx: Any, x: TensorValue, kv_collection: Any, freqs_cis: Any,
                 input_row_offsets: TensorValue) -> TensorValue:
        H, D = self.n_heads, self.head_dim
        T = x.shape[0]
        y = ops.concat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], axis=-1)  # one matmul
        qg = ops.reshape(y[:, :2 * H * D], [T, H, 2 * D])
        q = ops.reshape(qg[:, :, :D], [T, H * D])
        gate = ops.reshape(qg[:, :, D:], [T, H * D])
        qkv = ops.concat([q, y[:, 2 * H * D:]], axis=-1)
        attn = self._attend(layer_idx, x, qkv, kv_collection, input_row_offsets, H, self.n_kv_heads, None,
                            x.device)
        return self.o_proj(ops.reshape(attn, [T, H * D]) * ops.sigmoid(gate))


class SharedGateMoE(DecoderMoE):
    """Routed experts (``DecoderMoE``, no shared experts of its own) plus ``shared_expert`` scaled by
    ``sigmoid(shared_expert_gate(x))`` (Qwen2-MoE / Qwen3-Next)."""

    def __init__(self, cfg: DecoderConfig, layer: int, factory: WeightFactory, shared_dim: int) -> None:
        super().__init__(cfg, layer, factory)
        p = f"layers.{layer}.mlp"
        self.shared_expert = GatedMLP(f"{p}.shared_expert", factory, cfg.hidden_size, shared_dim, cfg.hidden_act,
                                      who=cfg.architecture)
        self.shared_expert_gate = factory.linear(f"{p}.shared_expert_gate", cfg.hidden_size, 1)

    def __call__(self, x: TensorValue) -> TensorValue:
        return super().__call__(x) + ops.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)


def qwen_hybrid_config(hf: dict, architecture: str, moe: Any = None) -> DecoderConfig:
    """The :class:`DecoderConfig` of a Qwen3-Next / Qwen3.5 text config: ``(1 + w)`` RMSNorms, per-head q/k
    norms, partial RoPE; ``extra`` holds the layer types and the DeltaNet sizes."""
    from max.pipelines.architectures.common.config import hf_common

    n = int(hf["num_hidden_layers"])
    types = hf.get("layer_types")
    if not types:
        step = int(hf.get("full_attention_interval") or 4)
        types = ["linear_attention" if (i + 1) % step else "full_attention" for i in range(n)]
    bad = sorted({t for t in types if t not in ("linear_attention", "full_attention")})
    if bad:
        raise NotImplementedError(f"{architecture}: layer types {bad} are not supported")
    c = hf_common({**hf, "layer_types": None}, architecture)
    c.update(qk_norm="head", norm_weight_offset=1.0, norm_multiply_before_cast=True, moe=moe,
             extra={"layer_types": list(types), "k_heads": int(hf["linear_num_key_heads"]),
                    "v_heads": int(hf["linear_num_value_heads"]), "k_dim": int(hf["linear_key_head_dim"]),
                    "v_dim": int(hf["linear_value_head_dim"]), "conv_kernel": int(hf["linear_conv_kernel_dim"])})
    return DecoderConfig(**c)


def qwen_hybrid_attention_layers(cfg: DecoderConfig) -> list[int]:
    return [i for i, t in enumerate(cfg.extra["layer_types"]) if t == "full_attention"]


def qwen_hybrid_state_specs(cfg: DecoderConfig) -> list[StateSpec]:
    return [s for i, t in enumerate(cfg.extra["layer_types"]) if t == "linear_attention"
            for s in deltanet_state_specs(i, cfg.extra)]


def build_qwen_hybrid(cfg: DecoderConfig, factory: WeightFactory, kv_params: KVCacheParams, max_seq_len: int,
                      fused: bool, make_mlp: Any) -> Module:
    """Qwen3-Next / Qwen3.5 text decoder: per layer ``input_layernorm`` -> (DeltaNet ``linear_attn`` | gated
    ``self_attn``) -> residual, ``post_attention_layernorm`` -> ``mlp`` (``make_mlp(cfg, i, factory)``) ->
    residual; final ``norm``."""
    from max.pipelines.architectures.common.hybrid import AttentionMixer, HybridLayer, build_hybrid
    from max.pipelines.architectures.common.layers import make_rope

    attn = qwen_hybrid_attention_layers(cfg)
    rope = make_rope(cfg, max_seq_len, factory.device) if attn else None
    layers = []
    for i, t in enumerate(cfg.extra["layer_types"]):
        if t == "linear_attention":
            mixer: Module = GatedDeltaNet(f"layers.{i}.linear_attn", i, cfg.hidden_size, cfg.extra, cfg.rms_norm_eps,
                                          factory, fused)
            name = "linear_attn"
        else:
            mixer = AttentionMixer(GatedAttention(cfg, i, factory, kv_params, rope), attn.index(i))
            name = "self_attn"
        layers.append(HybridLayer(("input_layernorm", name, "post_attention_layernorm", "mlp"),
                                  rms_norm(cfg, cfg.hidden_size, factory.dtype), mixer,
                                  rms_norm(cfg, cfg.hidden_size, factory.dtype), make_mlp(cfg, i, factory)))
    return build_hybrid(cfg, factory, kv_params, layers, len(attn), qwen_hybrid_state_specs(cfg))


# --------------------------------------------------------------------------- GGUF (llama.cpp's qwen3next / qwen35)
QWEN_HYBRID_GGUF_LAYERS = {
    "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ssm_conv1d": "linear_attn.conv1d", "ssm_dt": "linear_attn.dt", "ssm_a": "linear_attn.A",
    "ssm_norm": "linear_attn.norm", "ssm_out": "linear_attn.out_proj", "attn_qkv": "linear_attn.in_proj_qkv",
    "attn_gate": "linear_attn.in_proj_z", "ssm_ba": "linear_attn.in_proj_ba", "ssm_beta": "linear_attn.in_proj_b",
    "ssm_alpha": "linear_attn.in_proj_a",
    "ffn_gate_inp": "mlp.gate", "ffn_gate_exps": "mlp.experts.gate_proj", "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj", "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj", "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj"}
"""llama.cpp's Qwen3-Next / Qwen3.5 tensor names -> module names (``attn_qkv`` / ``attn_gate`` are the
DeltaNet's q|k|v and z projections)."""


def qwen_hybrid_gguf_config(meta: Any, model_type: str, architecture: str,
                            hf_defaults: Mapping[str, Any] | None = None) -> dict:
    """The keys of a ``qwen3next`` / ``qwen35`` GGUF file as a Qwen3-Next / Qwen3.5 text config dict (only the
    keys the file has; with ``hf_defaults``, the config class's defaults fill the rest, with RoPE base 10000
    and a quarter of each head rotated unless the file says otherwise).  llama.cpp writes the DeltaNet sizes as ``ssm.*`` (``conv_kernel``, ``state_size`` =
    key head size, ``group_count`` = key heads, ``time_step_rank`` = value heads, ``inner_size`` = value
    heads x value head size), the attention layers as every ``full_attention_interval``-th (default 4),
    the rotated part of a head as ``rope.dimension_count``, experts as Qwen2-MoE's keys; an MTP head adds
    ``nextn_predict_layers`` layers to ``block_count``."""
    from max.pipelines.architectures.common.config import gguf_hf_config

    g = meta.arch_get
    d = gguf_hf_config(meta, model_type, architecture, rope_dim_is_head_dim=False)
    d.pop("sliding_window", None)
    if g("nextn_predict_layers") and "num_hidden_layers" in d:
        d["num_hidden_layers"] = int(d["num_hidden_layers"]) - int(g("nextn_predict_layers"))
    for key, name in (("ssm.conv_kernel", "linear_conv_kernel_dim"), ("ssm.state_size", "linear_key_head_dim"),
                      ("ssm.group_count", "linear_num_key_heads"), ("ssm.time_step_rank", "linear_num_value_heads"),
                      ("expert_count", "num_experts"), ("expert_used_count", "num_experts_per_tok"),
                      ("expert_feed_forward_length", "moe_intermediate_size"),
                      ("expert_shared_feed_forward_length", "shared_expert_intermediate_size")):
        if g(key) is not None:
            d[name] = int(g(key))
    if g("ssm.inner_size") and g("ssm.time_step_rank"):
        d["linear_value_head_dim"] = int(g("ssm.inner_size")) // int(g("ssm.time_step_rank"))
    if "num_hidden_layers" in d and (g("full_attention_interval") is not None or g("ssm.conv_kernel") is not None):
        step = int(g("full_attention_interval") or 4)
        d["layer_types"] = ["linear_attention" if (i + 1) % step else "full_attention"
                            for i in range(int(d["num_hidden_layers"]))]
    head = d.get("head_dim") or (int(d["hidden_size"]) // int(d["num_attention_heads"])
                                 if d.get("hidden_size") and d.get("num_attention_heads") else None)
    if g("rope.dimension_count") and head:
        rope = dict(d.get("rope_parameters") or {"rope_type": "default"})
        rope["partial_rotary_factor"] = int(g("rope.dimension_count")) / int(head)
        d["rope_parameters"] = rope
    if hf_defaults is None:
        return d
    d = rope_defaults(with_defaults(d, hf_defaults))
    d["rope_parameters"].setdefault("partial_rotary_factor", 0.25)
    return d


def _untile(t: Any, dim: int, k_heads: int, per_k: int, size: int) -> Any:
    """llama.cpp's tiled value-head order (``[per_k, k_heads, size]`` along ``dim``) back to Hugging Face's
    grouped order (``[k_heads, per_k, size]``)."""
    shape = list(t.shape)
    t = t.reshape(*shape[:dim], per_k, k_heads, size, *shape[dim + 1:])
    return t.transpose(dim, dim + 1).reshape(shape)


def qwen_hybrid_gguf_weights(state_dict: Any, hf: Any, fused: bool, tiled_v: bool) -> dict:
    """Module names and Hugging Face layouts from a ``qwen3next`` (``fused``: q|k|v|z and b|a interleaved per
    key head, as ``in_proj_qkvz`` / ``in_proj_ba``) or ``qwen35`` (``tiled_v``: the converter put value heads
    in tiled order) GGUF file (an MTP head's extra blocks left out): norms stored ``w + 1`` (all but the
    DeltaNet's gated norm) back to ``w``, ``A = -exp(A_log)`` -> ``A_log``, the conv weight ``[C, K]`` ->
    ``[C, 1, K]``, ``dt.bias`` -> ``dt_bias``."""
    import torch

    from max.pipelines.architectures.common.weights import Derived, rename_gguf

    get = (lambda k: hf.get(k)) if isinstance(hf, dict) else (lambda k: getattr(hf, k, None))
    Hk, Hv = int(get("linear_num_key_heads")), int(get("linear_num_value_heads"))
    dk, dv = int(get("linear_key_head_dim")), int(get("linear_value_head_dim"))
    r = Hv // Hk
    untile = tiled_v and Hk != Hv
    n = get("num_hidden_layers")
    out = rename_gguf(state_dict, QWEN_HYBRID_GGUF_LAYERS)
    if n is not None:  # an MTP head's blocks follow the decoder's (left out, as from safetensors)
        out = {k: v for k, v in out.items() if not (k.startswith("layers.") and int(k.split(".")[1]) >= int(n))}
    res: dict[str, Any] = {}
    for k, v in out.items():
        p, _, leaf = k.rpartition(".linear_attn.")
        p += ".linear_attn."
        if not _:
            if k.endswith(("layernorm.weight", "q_norm.weight", "k_norm.weight")) or k == "norm.weight":
                res[k] = Derived(lambda w: w - 1.0, v)
            else:
                res[k] = v
        elif leaf == "A.weight":
            res[p + "A_log"] = Derived(lambda a, u=untile: torch.log(-(_untile(a.reshape(-1), 0, Hk, r, 1) if u
                                                                        else a.reshape(-1)).double()).float(), v)
        elif leaf == "dt.bias":
            res[p + "dt_bias"] = Derived(lambda b, u=untile: _untile(b.reshape(-1), 0, Hk, r, 1) if u
                                         else b.reshape(-1), v)
        elif leaf == "conv1d.weight":
            def conv(w: torch.Tensor, u: bool = untile) -> torch.Tensor:
                w = w.reshape(w.shape[0], -1)
                if u:
                    w = torch.cat([w[:2 * Hk * dk], _untile(w[2 * Hk * dk:], 0, Hk, r, dv)])
                return w.unsqueeze(1)
            res[k] = Derived(conv, v)
        elif leaf == "in_proj_qkv.weight" and untile:
            res[k] = Derived(lambda w: torch.cat([w[:2 * Hk * dk], _untile(w[2 * Hk * dk:], 0, Hk, r, dv)]), v)
        elif leaf == "in_proj_z.weight" and untile:
            res[k] = Derived(lambda w: _untile(w, 0, Hk, r, dv), v)
        elif leaf in ("in_proj_a.weight", "in_proj_b.weight") and untile:
            res[k] = Derived(lambda w: _untile(w, 0, Hk, r, 1), v)
        elif leaf == "out_proj.weight" and untile:
            res[k] = Derived(lambda w: _untile(w, 1, Hk, r, dv), v)
        else:
            res[k] = v
    if fused:
        for k in [k for k in res if k.endswith(".linear_attn.in_proj_qkv.weight")]:
            p = k[: -len("in_proj_qkv.weight")]

            def qkvz(qkv: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
                H = qkv.shape[-1]
                q = qkv[:Hk * dk].reshape(Hk, dk, H)
                kk = qkv[Hk * dk:2 * Hk * dk].reshape(Hk, dk, H)
                vv = qkv[2 * Hk * dk:].reshape(Hk, r * dv, H)
                return torch.cat([q, kk, vv, z.reshape(Hk, r * dv, H)], 1).reshape(-1, H)
            res[p + "in_proj_qkvz.weight"] = Derived(qkvz, res.pop(k), res.pop(p + "in_proj_z.weight"))
    return res


class QwenHybridModel(HybridPipelineModel):
    """The pipeline model of the Qwen hybrids (Qwen3-Next, Qwen3.5): a family sets ``config_from_hf``,
    ``weight_adapters``, ``fused`` (its DeltaNet input projections are one ``in_proj_qkvz``) and ``make_mlp``
    (``(cfg, layer, factory) -> Module``)."""

    fused: bool = False
    make_mlp = staticmethod(default_mlp)

    @classmethod
    def attention_layers(cls, cfg: DecoderConfig) -> list[int]:
        return qwen_hybrid_attention_layers(cfg)

    @classmethod
    def state_specs(cls, cfg: DecoderConfig) -> list[StateSpec]:
        return qwen_hybrid_state_specs(cfg)

    @classmethod
    def build_module(cls, cfg: DecoderConfig, factory: WeightFactory, kv_params: KVCacheParams, max_seq_len: int,
                     devices: Any = None) -> Module:
        return build_qwen_hybrid(cfg, factory, kv_params, max_seq_len, fused=cls.fused, make_mlp=cls.make_mlp)
