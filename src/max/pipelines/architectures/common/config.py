"""The decoder configuration every family translates to, and the one GGUF -> config translation.

A family's ``config.py`` turns a Hugging Face ``config.json`` (as a dict with the config class's
defaults filled in) into a :class:`DecoderConfig`; GGUF files reach the same function through
:func:`gguf_hf_config`, which turns GGUF metadata into the Hugging Face config dict of the
family's ``model_type`` (the keys the file has), and the family's own table of the transformers
config class's defaults (:func:`with_defaults`, :func:`rope_defaults`) for the keys it lacks -- the
values transformers gives when it loads that GGUF file, without importing transformers.  The shared
decoder reads only the fields below -- never the family's name.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Mapping

from max.pipelines.architectures.common.gguf_rope import rope_from_gguf_tensors

__all__ = ["DecoderConfig", "LLAMA_HF_DEFAULTS", "NormPlan", "derive_defaults", "eos_ids", "gguf_hf_config",
           "gguf_kv_heads", "gguf_layer_kv_heads", "gguf_ssm_keys", "hf_common", "kv_heads", "rope_defaults",
           "whole_head_dim", "with_defaults"]


@dataclass(frozen=True)
class NormPlan:
    """Module names of a decoder layer's norms (None: the layer has no such norm).

    Llama: ``input_layernorm`` before attention, ``post_attention_layernorm`` before the MLP.
    Gemma 2/3 add norms after attention and after the MLP; OLMo 2 has only the post norms.
    """

    pre_attention: str | None = "input_layernorm"
    post_attention: str | None = None
    pre_mlp: str | None = "post_attention_layernorm"
    post_mlp: str | None = None


@dataclass
class DecoderConfig:
    """What the shared decoder builds: sizes, norms, attention variants, scalings (see field docs)."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    rope_scaling: dict | None = None
    """``rope_type`` (``default``/``llama3``/``linear``/``yarn``/``longrope``...) and its parameters."""
    partial_rotary_factor: float = 1.0
    """Fraction of each head's dims that are rotated (Phi-4-mini: 0.75)."""
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    """q/k/v projections have biases (Qwen2)."""
    o_proj_bias: bool = False
    mlp_bias: bool = False
    qk_norm: str | None = None
    """``"head"``: RMSNorm of each head of q and k (Qwen3, Gemma 3); ``"full"``: of the whole q and k
    projections (OLMo 2); None: no q/k norm."""
    fused_qkv: bool = False
    """The checkpoint holds one ``self_attn.qkv_proj`` (Phi-3) instead of q/k/v projections."""
    fused_gate_up: bool = False
    """The checkpoint holds one ``mlp.gate_up_proj`` (Phi-3) instead of gate/up projections."""
    hidden_act: str = "silu"
    norms: NormPlan = field(default_factory=NormPlan)
    norm_weight_offset: float = 0.0
    """RMSNorm scales by ``weight + offset`` (Gemma: 1.0)."""
    norm_multiply_before_cast: bool = False
    sliding_window: int | None = None
    layer_types: list[str] | None = None
    """Per layer ``"sliding_attention"`` or ``"full_attention"``; None: every layer uses
    ``sliding_window`` (None = full attention)."""
    local_rope_theta: float | None = None
    """RoPE base of sliding-window layers when it differs from ``rope_theta`` (Gemma 3); their
    RoPE is unscaled."""
    attention_scale: float | None = None
    """Softmax scale; None = ``1 / sqrt(head_dim)``."""
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0
    """Logits are divided by it (Granite)."""
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None
    attention_sinks: bool = False
    """Each layer has ``self_attn.sinks`` ``[n_heads]``: a learned logit per head in the softmax (GPT-OSS)."""
    interleaved_rope: bool = False
    """q/k rows are in the interleaved-pair layout (llama.cpp's permuted GGUF q/k of Llama-family files)."""
    no_rope_layers: set[int] = field(default_factory=set)
    """Layers whose attention has no RoPE (NoPE layers: SmolLM3, EXAONE 4's global layers)."""
    clip_qkv: float | None = None
    """q/k/v projections clamped to ``[-clip_qkv, clip_qkv]`` (OLMo)."""
    norm_kind: str = "rms"
    """``"rms"``: RMSNorm; ``"layernorm"``: LayerNorm without weight or bias, eps 1e-5 (OLMo)."""
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    moe: Any = None
    """A ``common.moe.MoESpec`` when the MLPs are mixtures of experts (its ``dense_layers`` keep a plain MLP)."""
    extra: dict = field(default_factory=dict)
    """Family-specific values its own modules read (MoE, MLA ...)."""

    def layer_window(self, i: int) -> int | None:
        """The sliding window of layer ``i`` (None: full attention)."""
        if self.layer_types is None:
            return self.sliding_window
        return self.sliding_window if self.layer_types[i] == "sliding_attention" else None


def eos_ids(value: Any) -> list[int]:
    """``eos_token_id`` (an int, a list or None) as a list."""
    if value is None:
        return []
    return [int(value)] if isinstance(value, int) else [int(v) for v in value]


def hf_common(hf: Mapping[str, Any], architecture: str) -> dict[str, Any]:
    """The :class:`DecoderConfig` fields every Llama-like Hugging Face config spells the same way."""
    from max.pipelines.lib.hf_utils import get_rope_parameters

    n_heads = int(hf["num_attention_heads"])
    hidden = int(hf["hidden_size"])
    rope = get_rope_parameters(dict(hf))
    scaling = None if rope.get("rope_type", "default") in ("default", None) else dict(rope)
    return dict(
        architecture=architecture,
        vocab_size=int(hf["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(hf["intermediate_size"]),
        num_hidden_layers=int(hf["num_hidden_layers"]),
        num_attention_heads=n_heads,
        num_key_value_heads=int(hf.get("num_key_value_heads") or n_heads),
        head_dim=int(hf.get("head_dim") or hidden // n_heads),
        rms_norm_eps=float(hf["rms_norm_eps"]),
        rope_theta=float(rope["rope_theta"]),
        rope_scaling=scaling,
        partial_rotary_factor=float(rope.get("partial_rotary_factor") or hf.get("partial_rotary_factor") or 1.0),
        max_position_embeddings=int(hf["max_position_embeddings"]),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=bool(hf.get("attention_bias", False)),
        mlp_bias=bool(hf.get("mlp_bias", False)),
        hidden_act=str(hf.get("hidden_act") or hf.get("hidden_activation") or "silu"),
        sliding_window=hf.get("sliding_window"),
        layer_types=list(hf["layer_types"]) if hf.get("layer_types") else None,
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=eos_ids(hf.get("eos_token_id")),
    )


def gguf_hf_config(meta: Any, model_type: str, architecture: str, rope_dim_is_head_dim: bool = True
                   ) -> dict[str, Any]:
    """The Hugging Face config dict (``model_type``, ``architectures`` and the keys the file has) of a
    GGUF file from llama.cpp's common metadata keys (``{arch}.block_count`` ...).

    Keys the file lacks are left out (``AutoConfig.for_model(model_type, **d)`` would fill in the
    config class's defaults; the family's ``config.py`` fills the same ones with :func:`with_defaults`).
    Family-specific keys are added by the family's ``config.py``.  ``head_dim`` is ``attention.key_length``, else
    ``rope.dimension_count`` when the family rotates whole heads (``rope_dim_is_head_dim``).
    """
    g = meta.arch_get
    names = {t.name for t in meta.tensors}
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = g("vocab_size") or (len(tokens) if tokens is not None else None)
    rope: dict[str, Any] = {"rope_type": "default"}
    if g("rope.freq_base") is not None:
        rope["rope_theta"] = float(g("rope.freq_base"))
    stype = g("rope.scaling.type")
    if stype in ("linear", "yarn") and g("rope.scaling.factor"):
        rope.update(rope_type=stype, factor=float(g("rope.scaling.factor")))
        if g("rope.scaling.original_context_length"):
            rope["original_max_position_embeddings"] = int(g("rope.scaling.original_context_length"))
    rope = rope_from_gguf_tensors(meta, rope, g("context_length"))  # rope_freqs / rope_factors_* tensors
    d: dict[str, Any] = dict(
        model_type=model_type,
        architectures=[architecture],
        vocab_size=vocab,
        hidden_size=g("embedding_length"),
        intermediate_size=g("feed_forward_length"),
        num_hidden_layers=g("block_count"),
        num_attention_heads=g("attention.head_count"),
        num_key_value_heads=gguf_kv_heads(meta),
        head_dim=g("attention.key_length") or (g("rope.dimension_count") if rope_dim_is_head_dim else None),
        max_position_embeddings=g("context_length"),
        rms_norm_eps=g("attention.layer_norm_rms_epsilon"),
        sliding_window=g("attention.sliding_window"),
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
    )
    stops = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    stops = list(dict.fromkeys(int(t) for t in stops if t is not None))
    if len(stops) > 1:  # end-of-turn / end-of-message tokens stop generation too (chat models)
        d["eos_token_id"] = stops
    if "rope_theta" in rope or rope["rope_type"] != "default":
        d["rope_parameters"] = rope
    return {k: _plain(v) for k, v in d.items() if v is not None}


def gguf_layer_kv_heads(meta: Any) -> list[int] | None:
    """``attention.head_count_kv`` per layer where the file gives a list (llama.cpp's hybrids: 0 for the
    layers without attention), else None."""
    kv = meta.arch_get("attention.head_count_kv")
    return [int(v) for v in kv] if kv is not None and hasattr(kv, "__len__") and not isinstance(kv, str) else None


def gguf_kv_heads(meta: Any) -> int | None:
    """The KV head count of a GGUF file (the largest of a per-layer list)."""
    per_layer = gguf_layer_kv_heads(meta)
    if per_layer is not None:
        return max(per_layer)
    kv = meta.arch_get("attention.head_count_kv")
    return None if kv is None else int(kv)


def gguf_ssm_keys(meta: Any) -> dict[str, Any]:
    """The Mamba-2 mixer sizes of a GGUF file from llama.cpp's ``{arch}.ssm.*`` keys: ``heads``
    (``ssm.time_step_rank``), ``head_dim`` (``ssm.inner_size`` / heads), ``inner``, ``groups``, ``state``,
    ``kernel``; ``conv_bias`` / ``proj_bias`` from the tensors of the first layer that has a mixer.  Keys
    the file lacks are left out."""
    g = meta.arch_get
    d: dict[str, Any] = {}
    for key, name in (("ssm.time_step_rank", "heads"), ("ssm.inner_size", "inner"), ("ssm.group_count", "groups"),
                      ("ssm.state_size", "state"), ("ssm.conv_kernel", "kernel")):
        if g(key) is not None:
            d[name] = int(g(key))
    if d.get("heads") and d.get("inner"):
        d["head_dim"] = d["inner"] // d["heads"]
    names = {t.name for t in meta.tensors}
    layers = sorted(int(n.split(".")[1]) for n in names if n.startswith("blk.") and n.endswith(".ssm_in.weight"))
    if layers:
        d["conv_bias"] = f"blk.{layers[0]}.ssm_conv1d.bias" in names
        d["proj_bias"] = f"blk.{layers[0]}.ssm_in.bias" in names
    return d


def _plain(v: Any) -> Any:
    """numpy scalars from the GGUF reader as Python numbers (JSON-serialisable configs)."""
    if isinstance(v, bool) or not hasattr(v, "item"):
        return v
    return v.item()


def with_defaults(d: dict[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``d`` completed with ``defaults`` for the keys it lacks (a key ``d`` holds, even as None, is kept).

    A default is a value (copied) or a function of the dict completed so far (defaults derived from
    other keys, e.g. ``num_key_value_heads`` = ``num_attention_heads``); they are applied in order.
    A family's table lists its transformers config class's defaults (see ``test_gguf_config_defaults``,
    which compares them with transformers)."""
    out = dict(d)
    for k, v in defaults.items():
        if k not in out:
            out[k] = v(out) if callable(v) else copy.deepcopy(v)
    return out


def rope_defaults(d: dict[str, Any], theta: float = 10000.0) -> dict[str, Any]:
    """``d`` with a complete ``rope_parameters`` (transformers 5's layout): ``rope_type`` (``default``)
    and ``rope_theta`` (the config class's default base ``theta``) where the file gives none, and for
    the scaled types that need it (llama3, YaRN, LongRoPE) ``original_max_position_embeddings`` =
    ``max_position_embeddings``."""
    out = dict(d)
    rp = dict(out.get("rope_parameters") or {})
    rp.setdefault("rope_type", rp.get("type", "default"))
    rp.setdefault("rope_theta", theta)
    if rp["rope_type"] in ("llama3", "yarn", "longrope"):
        rp.setdefault("original_max_position_embeddings", out["max_position_embeddings"])
    out["rope_parameters"] = rp
    return out


def kv_heads(d: dict[str, Any]) -> int:
    """The derived default of ``num_key_value_heads``: one per query head (no grouping)."""
    return d["num_attention_heads"]


def whole_head_dim(d: dict[str, Any]) -> int:
    """The derived default of ``head_dim``: ``hidden_size / num_attention_heads``."""
    return d["hidden_size"] // d["num_attention_heads"]


LLAMA_HF_DEFAULTS: dict[str, Any] = dict(
    vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=kv_heads, head_dim=whole_head_dim, hidden_act="silu", max_position_embeddings=2048,
    rms_norm_eps=1e-6, pad_token_id=None, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    attention_bias=False, mlp_bias=False)
"""``transformers.LlamaConfig``'s defaults: Llama's table (see :func:`with_defaults`) and the base of the
config classes transformers derived from it (Mistral, Mixtral, Granite, DeepSeek-V2: :func:`derive_defaults`)."""


def derive_defaults(base: Mapping[str, Any], drop: tuple[str, ...] = (), **changes: Any) -> dict[str, Any]:
    """A family's table of defaults as ``base`` (in its order) without the keys ``drop`` and with
    ``changes``: a key of ``base`` changes its value in place, a new key comes after them."""
    unknown = [k for k in drop if k not in base]
    if unknown:
        raise KeyError(f"derive_defaults: the base table has no {unknown}")
    out = {k: v for k, v in base.items() if k not in drop}
    out.update(changes)
    return out

