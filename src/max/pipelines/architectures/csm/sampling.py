"""Choosing a code from logits as transformers' ``generate`` does for CSM: greedy (argmax), or temperature,
then top-k, then top-p filtering, softmax and one ``torch.multinomial`` draw from the request's own
generator (seeded: the same draws as ``torch.manual_seed(seed)`` then ``generate`` for a single request)."""

from __future__ import annotations

from typing import Optional

import torch

from max.pipelines.architectures.csm.config import Sampling

__all__ = ["choose", "sampling_of"]


def sampling_of(params: object, default: Sampling) -> Sampling:
    """The backbone's :class:`Sampling` for a request's ``SamplingParams`` (``temperature`` 0 or ``top_k`` 1:
    greedy; else sampling with its temperature / top-k (-1: the checkpoint's) / top-p)."""
    if params is None:
        return default
    t = float(getattr(params, "temperature", 1.0))
    k = int(getattr(params, "top_k", -1))
    if t <= 0.0 or k == 1:
        return Sampling(do_sample=False)
    return Sampling(do_sample=True, temperature=t, top_k=k if k > 0 else default.top_k,
                    top_p=float(getattr(params, "top_p", 1.0)))


def choose(logits: torch.Tensor, s: Sampling, generator: Optional[torch.Generator]) -> int:
    """One code from float32 ``logits`` ``[vocab]``."""
    if not s.do_sample:
        return int(torch.argmax(logits))
    x = logits[None].clone()
    if s.temperature != 1.0:
        x = x / s.temperature
    V = x.shape[-1]
    if 0 < s.top_k < V:
        kth = torch.topk(x, s.top_k).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if s.top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=False)
        cum = sorted_x.softmax(-1).cumsum(-1)
        drop = cum <= (1 - s.top_p)
        drop[..., -1:] = False  # keep at least the most likely code
        x = x.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    probs = torch.softmax(x, dim=-1)
    return int(torch.multinomial(probs, num_samples=1, generator=generator)[0, 0])
