"""Teacher-forced next-token distributions of a text-generation model, and their comparison.

This is how llama.cpp's perplexity tool measures what a quantisation costs: feed a fixed text, take
the model's next-token distribution at every position, and compare it with a reference run of the
same weights at higher precision -- the mean KL divergence and how often the most likely token agrees.

``teacher_forced_logits(model_path, token_ids, encoding)`` runs one prefill over ``token_ids`` with a
model built to return every position's logits (``ReturnLogits.ALL``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

__all__ = ["compare_distributions", "teacher_forced_logits"]


def teacher_forced_logits(model_path: str, token_ids: Sequence[int], encoding: str | None = None,
                          num_threads: int | None = None, kv_cache_dtype: str = "auto") -> np.ndarray:
    """float32 logits ``[len(token_ids), vocab]``: row ``i`` predicts token ``i + 1``.

    ``encoding``: the ``quantization_encoding`` to run (None: the weights' own, e.g. a quantised GGUF
    stays quantised; ``"float32"`` dequantises it at load).  ``kv_cache_dtype``: how the KV cache stores K
    and V (``KVCacheConfig.kv_cache_dtype``: ``"int8"`` measures what the 8-bit cache costs).
    """
    from max.nn.transformer import ReturnLogits
    from max.pipelines.core import TextContext
    from max.pipelines.lib.config import PipelineConfig
    from max.pipelines.lib.pipeline import build_pipeline_model
    from max.pipelines.lib.registry import PIPELINE_REGISTRY, register_all_models

    ids = np.asarray(list(token_ids), np.int64)
    if ids.ndim != 1 or ids.size < 2:
        raise ValueError("teacher_forced_logits: token_ids must hold at least two tokens")
    cfg = PipelineConfig(model_path=model_path, quantization_encoding=encoding, max_length=int(ids.size) + 8,
                         max_batch_size=1, num_threads=num_threads, enable_prefix_caching=False,
                         kv_cache_dtype=kv_cache_dtype)
    register_all_models()  # as LLM() does: the built-in architectures, whatever ran before in the process
    arch = PIPELINE_REGISTRY.retrieve_architecture(cfg.model_config.huggingface_weight_repo)
    if arch is None:
        raise ValueError(f"teacher_forced_logits: no architecture for {model_path!r}")
    _, model = build_pipeline_model(cfg, arch.pipeline_model, arch.weight_adapters, ReturnLogits.ALL)
    ctx = TextContext(max_length=int(ids.size) + 8, tokens=ids)
    mgr = model.kv_manager
    mgr.external_claim(ctx.request_id)
    try:
        kv = mgr.fetch([ctx], 1)
        out = model.execute(model.prepare_initial_token_inputs([ctx], kv))
        logits = out.logits
        logits = logits if isinstance(logits, torch.Tensor) else torch.as_tensor(np.asarray(logits))
        return logits.to(torch.float32).cpu().numpy()
    finally:
        mgr.release(ctx.request_id)


def compare_distributions(reference: np.ndarray, other: np.ndarray) -> dict[str, Any]:
    """Mean and max KL(reference || other) of the softmax of each row, and top-1 agreement."""
    ref = torch.as_tensor(reference, dtype=torch.float64)
    oth = torch.as_tensor(other, dtype=torch.float64)
    if ref.shape != oth.shape or ref.dim() != 2:
        raise ValueError(f"compare_distributions: shapes {tuple(ref.shape)} and {tuple(oth.shape)} differ")
    lp, lq = torch.log_softmax(ref, -1), torch.log_softmax(oth, -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    top1 = (ref.argmax(-1) == oth.argmax(-1)).double()
    return {"positions": int(ref.shape[0]), "mean_kl": float(kl.mean()), "max_kl": float(kl.max()),
            "top1": float(top1.mean())}
