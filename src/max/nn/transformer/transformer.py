"""``Transformer`` and ``TransformerBlock``: a decoder stack over ragged batches and the paged KV cache."""

from __future__ import annotations

import enum
from typing import Any, Sequence


from max.dtype import DType
from max.graph import TensorValue, ops
from max.nn.layer import Module

__all__ = ["ReturnLogits", "Transformer", "TransformerBlock"]


class ReturnLogits(str, enum.Enum):
    ALL = "all"
    LAST_TOKEN = "last_token"
    VARIABLE = "variable"


class TransformerBlock(Module):
    """``h = x + attn(norm(x)); out = h + mlp(norm(h))`` (residuals scaled by ``residual_multiplier``)."""

    def __init__(self, attention: Any, mlp: Any, attention_norm: Any, mlp_norm: Any,
                 residual_multiplier: float = 1.0) -> None:
        super().__init__()
        self.self_attn = attention
        self.mlp = mlp
        self.input_layernorm = attention_norm
        self.post_attention_layernorm = mlp_norm
        self.residual_multiplier = residual_multiplier

    def __call__(self, layer_idx: Any, x: TensorValue, kv_collection: Any, freqs_cis: TensorValue,
                 input_row_offsets: TensorValue) -> TensorValue:
        a = self.self_attn(layer_idx, self.input_layernorm(x), kv_collection, freqs_cis, input_row_offsets)
        if self.residual_multiplier != 1.0:
            a = a * self.residual_multiplier
        h = x + a
        m = self.mlp(self.post_attention_layernorm(h))
        if self.residual_multiplier != 1.0:
            m = m * self.residual_multiplier
        return h + m


class Transformer(Module):
    """Embedding -> blocks -> norm -> output projection, returning float32 logits.

    ``__call__(tokens, kv_cache_inputs, return_n_logits, input_row_offsets)``:
    ``tokens`` int64 ``[total_seq_len]`` (ragged), ``kv_cache_inputs`` the cache's
    graph values (``blocks, cache_lengths, lookup_table, max_lengths``),
    ``input_row_offsets`` ``[batch + 1]``.  With ``LAST_TOKEN`` the result is
    ``(logits[batch, vocab],)``; ``ALL`` returns every position's logits and the
    offsets; ``VARIABLE`` the last ``return_n_logits`` positions of each request.
    """

    def __init__(self, dim: int, n_heads: int, layers: Sequence[Any], norm: Any, output: Any, embedding: Any,
                 kv_params: Any, kv_collection_constructor: Any, rope: Any,
                 return_logits: ReturnLogits = ReturnLogits.LAST_TOKEN, embedding_multiplier: float = 1.0,
                 logits_scaling: float = 1.0, logits_postprocessor: Any = None) -> None:
        super().__init__()
        from max.nn.layer import LayerList

        self.dim = dim
        self.n_heads = n_heads
        self.layers = LayerList(list(layers))
        self.norm = norm
        self.lm_head = output
        self.embed_tokens = embedding
        self.kv_params = kv_params
        self.kv_collection_constructor = kv_collection_constructor
        self.rope = rope
        self.return_logits = ReturnLogits(return_logits)
        self.embedding_multiplier = embedding_multiplier
        self.logits_scaling = logits_scaling
        self.logits_postprocessor = logits_postprocessor
        self.return_hidden_states = False
        """With ``ReturnLogits.ALL``: also return every position's hidden state after the final norm (what
        a multi-token prediction draft reads), as a third output."""

    def __call__(self, tokens: Any, kv_cache_inputs: Sequence[Any], return_n_logits: Any,
                 input_row_offsets: Any) -> tuple:
        return self.forward_embeddings(self.embed(tokens), kv_cache_inputs, return_n_logits, input_row_offsets)

    def embed(self, tokens: Any) -> TensorValue:
        """The scaled token embeddings ``[total_seq_len, dim]`` the layers start from."""
        h = self.embed_tokens(tokens)
        if self.embedding_multiplier != 1.0:
            h = h * self.embedding_multiplier
        return h

    def forward_embeddings(self, h: TensorValue, kv_cache_inputs: Sequence[Any], return_n_logits: Any,
                           input_row_offsets: Any) -> tuple:
        """The layers, final norm and logits from input embeddings ``h`` (what :meth:`embed` returns, or a
        multimodal model's merge of it with image embeddings)."""
        kv = self.kv_collection_constructor(*kv_cache_inputs)
        freqs = self.rope.freqs_cis
        offsets = input_row_offsets.tensor if hasattr(input_row_offsets, "tensor") else input_row_offsets
        for i, layer in enumerate(self.layers):
            idx = ops.constant(i, DType.uint32, h.device)
            h = layer(idx, h, kv, freqs, offsets)
        offs64 = offsets.cast(DType.int64)
        if self.return_logits is ReturnLogits.LAST_TOKEN:
            last = offs64[1:] - 1
            h = ops.gather(h, last, axis=0)
            logits = self._logits(h)
            return (logits,)
        if self.return_logits is ReturnLogits.ALL:
            if self.return_hidden_states:
                normed = self.norm(h)
                return (finish_logits(self.lm_head(normed), self.logits_scaling, self.logits_postprocessor),
                        offsets, normed)
            return (self._logits(h), offsets)
        raise NotImplementedError("Transformer: ReturnLogits.VARIABLE is not supported yet")

    def _logits(self, h: TensorValue) -> TensorValue:
        return finish_logits(self.lm_head(self.norm(h)), self.logits_scaling, self.logits_postprocessor)


def finish_logits(logits: TensorValue, scaling: float = 1.0, postprocessor: Any = None) -> TensorValue:
    """The output projection's result as float32 logits, divided by ``scaling`` and passed through
    ``postprocessor`` (soft-capping...)."""
    logits = logits.cast(DType.float32)
    if scaling != 1.0:
        logits = logits / scaling
    if postprocessor is not None:
        logits = postprocessor(logits)
    return logits
