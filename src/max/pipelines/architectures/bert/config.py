"""BERT encoder configuration, from a Hugging Face ``config.json`` (``model_type: bert``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

# hidden_act -> (ops.gelu approximate mode | other activation name)
ACTIVATIONS = {
    "gelu": ("gelu", "none"),
    "gelu_python": ("gelu", "none"),
    "gelu_new": ("gelu", "tanh"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "gelu_fast": ("gelu", "tanh"),
    "quick_gelu": ("gelu", "quick"),
    "relu": ("relu", None),
    "silu": ("silu", None),
    "swish": ("silu", None),
}


@dataclass
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    architecture: str = "BertModel"
    num_labels: int = 1  # the classification head's outputs (``*ForSequenceClassification``)
    position_offset: int = 0  # first position id of a token (RoBERTa / XLM-R: pad_token_id + 1)

    @property
    def max_input_length(self) -> int:
        return self.max_position_embeddings - self.position_offset

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any]) -> "BertConfig":
        arch = (cfg.get("architectures") or ["BertModel"])[0]
        pet = cfg.get("position_embedding_type", "absolute")
        if pet not in (None, "absolute"):
            raise NotImplementedError(f"{arch}: position_embedding_type {pet!r} is not supported (only 'absolute')")
        act = cfg.get("hidden_act", "gelu")
        if not isinstance(act, str) or act not in ACTIVATIONS:
            raise NotImplementedError(f"{arch}: hidden_act {act!r} is not supported; supported: {sorted(ACTIVATIONS)}")
        hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        pad = int(cfg.get("pad_token_id") or 0)
        roberta = cfg.get("model_type") in ("roberta", "xlm-roberta") or arch.startswith(("Roberta", "XLMRoberta"))
        labels = cfg.get("id2label")
        num_labels = len(labels) if isinstance(labels, dict) and labels else int(cfg.get("num_labels", 1) or 1)
        if hidden % heads:
            raise ValueError(f"{arch}: hidden_size {hidden} is not divisible by num_attention_heads {heads}")
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=heads,
            intermediate_size=int(cfg["intermediate_size"]),
            hidden_act=act,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 512)),
            type_vocab_size=int(cfg.get("type_vocab_size", 2) or 1),
            layer_norm_eps=float(cfg.get("layer_norm_eps", 1e-12)),
            pad_token_id=pad,
            architecture=arch,
            num_labels=num_labels,
            position_offset=pad + 1 if roberta else 0,
        )
