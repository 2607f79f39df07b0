"""MPNet encoder configuration, from a Hugging Face ``config.json`` (``model_type: mpnet``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

ACTIVATIONS = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "relu": "relu"}


@dataclass
class MPNetConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str = "gelu"
    max_position_embeddings: int = 514
    layer_norm_eps: float = 1e-5
    pad_token_id: int = 1
    relative_attention_num_buckets: int = 32
    architecture: str = "MPNetModel"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    position_offset: int = 2
    """Positions start after the padding index (fairseq style), which transformers fixes at 1."""

    @property
    def max_input_length(self) -> int:
        return self.max_position_embeddings - self.position_offset

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any]) -> "MPNetConfig":
        arch = (cfg.get("architectures") or ["MPNetModel"])[0]
        act = cfg.get("hidden_act", "gelu")
        if act not in ACTIVATIONS:
            raise NotImplementedError(f"{arch}: hidden_act {act!r} is not supported; supported: {sorted(ACTIVATIONS)}")
        return cls(vocab_size=int(cfg["vocab_size"]), hidden_size=int(cfg["hidden_size"]),
                   num_hidden_layers=int(cfg["num_hidden_layers"]), num_attention_heads=int(cfg["num_attention_heads"]),
                   intermediate_size=int(cfg["intermediate_size"]), hidden_act=act,
                   max_position_embeddings=int(cfg.get("max_position_embeddings", 514)),
                   layer_norm_eps=float(cfg.get("layer_norm_eps", 1e-5)),
                   pad_token_id=int(cfg["pad_token_id"] if cfg.get("pad_token_id") is not None else 1),
                   relative_attention_num_buckets=int(cfg.get("relative_attention_num_buckets", 32)),
                   architecture=arch)
