"""Decoder families as embedding models (Qwen3-Embedding ...): the family's decoder without ``lm_head``,
each input's final-norm hidden states pooled.

Pooling follows the folder's sentence-transformers files (``modules.json`` + the Pooling module's
``config.json``: ``pooling_mode_lasttoken`` / ``mean_tokens`` / ``cls_token``; L2 normalisation when
``modules.json`` lists ``Normalize``); without them: last token, normalised (Qwen3-Embedding's recipe).
Inputs run as one ragged batch over a transient paged KV cache (no padding), released after the call.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from max.graph import TensorValue, ops
from max.nn.layer import Module
from max.nn.transformer import ReturnLogits
from max.pipelines.architectures.common.layers import build_decoder
from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.pipelines.lib.pipeline import ModelInputs, ModelOutputs

__all__ = ["DecoderEmbeddingModel", "sentence_transformers_pooling"]


def sentence_transformers_pooling(model_dir: Path) -> tuple[str, bool]:
    """``(pooling, normalize)`` from a sentence-transformers folder; ``("lasttoken", True)`` without one."""
    modules = model_dir / "modules.json"
    if not modules.is_file():
        return "lasttoken", True
    entries = json.loads(modules.read_text())
    normalize = any(str(e.get("type", "")).endswith("Normalize") for e in entries)
    for e in entries:
        if str(e.get("type", "")).endswith("Pooling"):
            cfg_path = model_dir / e.get("path", "") / "config.json"
            cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
            for key, mode in (("pooling_mode_lasttoken", "lasttoken"), ("pooling_mode_mean_tokens", "mean"),
                              ("pooling_mode_cls_token", "cls")):
                if cfg.get(key):
                    return mode, normalize
            raise NotImplementedError(f"{cfg_path}: pooling {cfg} is not supported (last token, mean or CLS)")
    return "lasttoken", normalize


class _Normalize(Module):
    """The pooling head: the last token's hidden state, L2-normalised when asked."""

    def __init__(self, normalize: bool) -> None:
        super().__init__()
        self.normalize = normalize

    def __call__(self, h: TensorValue) -> TensorValue:
        if not self.normalize:
            return h
        return h / ops.max(ops.sqrt(ops.sum(h * h, axis=-1)), 1e-12)


class DecoderEmbeddingModel(DecoderPipelineModel):
    """A decoder family's embedding model for ``EmbeddingsPipeline`` (see the module docstring)."""

    task = "embeddings_generation"
    batch_workload = "embeddings_generation"

    def __init__(self, pipeline_config: Any, session: Any, huggingface_config: Any, encoding: Any, devices: list,
                 kv_cache_config: Any, weights: Any, adapter: Any, return_logits: Any = None) -> None:
        self.pooling, self.normalize = sentence_transformers_pooling(pipeline_config.model_config.model_dir)
        self.pool_embeddings = bool(getattr(pipeline_config, "pool_embeddings", True))
        last = self.pool_embeddings and self.pooling == "lasttoken"
        super().__init__(pipeline_config, session, huggingface_config, encoding, devices, kv_cache_config, weights,
                         adapter, ReturnLogits.LAST_TOKEN if last else ReturnLogits.ALL)
        self.hidden_size = self.config.hidden_size

    def build_module(self, cfg: Any, factory: Any, kv_params: Any, max_seq_len: int) -> Module:  # type: ignore[override]
        last = self.pool_embeddings and self.pooling == "lasttoken"
        return build_decoder(cfg, factory, kv_params, max_seq_len, head=_Normalize(self.normalize and last))

    def prepare_initial_token_inputs(self, context_batch: Sequence[Any], kv_cache_inputs: Any = None,
                                     return_n_logits: int = 1) -> ModelInputs:
        from max.pipelines.core import TextContext

        rows = [np.asarray(getattr(c, "prompt_tokens", c), dtype=np.int64).reshape(-1) for c in context_batch]
        ctxs = [TextContext(max_length=len(r) + 1, tokens=r) for r in rows]
        for c in ctxs:
            self.kv_manager.claim(c.request_id)
        inputs = super().prepare_initial_token_inputs(ctxs, self.kv_manager.fetch(ctxs))
        inputs.update(contexts=ctxs, lengths=[len(r) for r in rows])
        return inputs

    def execute(self, model_inputs: ModelInputs) -> ModelOutputs:
        try:
            out = super().execute(model_inputs).logits.float()
        finally:
            for c in model_inputs.contexts:
                self.kv_manager.release(c.request_id)
        if self.pool_embeddings and self.pooling == "lasttoken":
            return ModelOutputs(logits=out)
        lens = model_inputs.lengths
        segs = torch.split(out, lens)
        if not self.pool_embeddings:  # per-token states, padded to the longest row
            return ModelOutputs(logits=torch.nn.utils.rnn.pad_sequence(list(segs), batch_first=True))
        pooled = torch.stack([s.mean(0) if self.pooling == "mean" else s[0] for s in segs])
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, dim=-1)
        return ModelOutputs(logits=pooled)

