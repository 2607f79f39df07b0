"""Llama-family decoder configuration, from a Hugging Face ``config.json`` or GGUF metadata.

The same config drives Llama 2/3, SmolLM, Mistral (sliding window), Qwen2
(q/k/v bias) and Qwen3 (per-head q/k RMSNorm).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


_MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                "qwen3": "Qwen3ForCausalLM"}


@dataclass
class DecoderConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    interleaved_rope: bool = False  # GGUF q/k rows are permuted for interleaved (GPT-J style) pairs
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    architecture: str = "LlamaForCausalLM"

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any]) -> "DecoderConfig":
        arch = (cfg.get("architectures") or [_MODEL_TYPES.get(cfg.get("model_type"), "LlamaForCausalLM")])[0]
        n_heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        rope_params = cfg.get("rope_parameters") or {}
        if isinstance(rope_params, dict) and "full_attention" in rope_params:
            rope_params = rope_params["full_attention"]
        theta = cfg.get("rope_theta", rope_params.get("rope_theta", 10000.0))
        scaling = cfg.get("rope_scaling")
        if scaling is None and rope_params.get("rope_type", "default") not in ("default", None):
            scaling = dict(rope_params)
        eos = cfg.get("eos_token_id")
        eos_ids = [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=n_heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or n_heads),
            head_dim=int(cfg.get("head_dim") or hidden // n_heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
            rope_theta=float(theta),
            rope_scaling=scaling,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=arch.startswith("Qwen2") or bool(cfg.get("attention_bias", False)),
            qk_norm=arch.startswith("Qwen3"),
            sliding_window=cfg.get("sliding_window") if cfg.get("use_sliding_window", arch.startswith("Mistral")) else None,
            interleaved_rope=False,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
            architecture=arch,
        )

    @classmethod
    def from_gguf(cls, meta: Mapping[str, Any], tensor_names: set[str]) -> "DecoderConfig":
        """From GGUF key/values (``general.architecture`` = llama / qwen2 / qwen3 / mistral)."""
        arch = str(meta["general.architecture"])

        def get(key: str, default: Any = None) -> Any:
            return meta.get(f"{arch}.{key}", default)

        n_heads = int(get("attention.head_count"))
        hidden = int(get("embedding_length"))
        n_kv = get("attention.head_count_kv", n_heads)
        vocab = get("vocab_size")
        if vocab is None:
            tokens = meta.get("tokenizer.ggml.tokens")
            vocab = len(tokens) if tokens is not None else None
        key_len = get("attention.key_length")
        head_dim = int(key_len) if key_len else hidden // n_heads
        names = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "mistral": "MistralForCausalLM"}
        scaling = None
        if get("rope.scaling.type") not in (None, "none"):
            scaling = {"rope_type": get("rope.scaling.type"), "factor": get("rope.scaling.factor")}
        eos = meta.get("tokenizer.ggml.eos_token_id")
        return cls(
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(get("feed_forward_length")),
            num_hidden_layers=int(get("block_count")),
            num_attention_heads=n_heads,
            num_key_value_heads=int(n_kv),
            head_dim=head_dim,
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=float(get("rope.freq_base", 10000.0)),
            rope_scaling=scaling,
            max_position_embeddings=int(get("context_length", 4096)),
            tie_word_embeddings="output.weight" not in tensor_names,
            attention_bias="blk.0.attn_q.bias" in tensor_names,
            qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
            sliding_window=None,
            interleaved_rope=arch in ("llama", "mistral"),
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=[int(eos)] if eos is not None else [],
            architecture=names.get(arch, arch),
        )
