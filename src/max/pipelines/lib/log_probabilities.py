"""Log probabilities of sampled (and, with echo, prompt) tokens over ragged batches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
import torch

from max.interfaces import LogProbabilities


def _to_torch(x: Any) -> Optional[torch.Tensor]:
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return x
    if hasattr(x, "to_numpy"):
        return torch.from_numpy(np.ascontiguousarray(x.to_numpy()))
    if hasattr(x, "__dlpack__") and not isinstance(x, np.ndarray):
        return torch.from_dlpack(x)
    return torch.as_tensor(np.asarray(x))


def _entries(logp: torch.Tensor, targets: torch.Tensor, top_n: int) -> LogProbabilities:
    """``logp`` ``(n, vocab)`` log-softmax rows, ``targets`` ``(n,)`` token of each row."""
    chosen = logp.gather(-1, targets[:, None].long())[:, 0]
    vals, idx = torch.topk(logp, min(top_n, logp.shape[-1]), dim=-1)
    tops = []
    for r in range(logp.shape[0]):
        d = {int(i): float(v) for i, v in zip(idx[r].tolist(), vals[r].tolist())}
        d[int(targets[r])] = float(chosen[r])  # the sampled token is always listed
        tops.append(d)
    return LogProbabilities(token_log_probabilities=[float(v) for v in chosen.tolist()], top_log_probabilities=tops)


def _log_softmax(rows: torch.Tensor, model: Any) -> torch.Tensor:
    """``log_softmax`` over the last axis: by ``model`` (a compiled :func:`log_probabilities_ragged_graph`)
    when given, else in torch."""
    rows = rows.float()
    if model is None or not hasattr(model, "execute"):
        return torch.log_softmax(rows, dim=-1)
    from max.driver import Buffer

    (out,) = model.execute(Buffer.from_dlpack(rows.contiguous()))
    return out._torch() if hasattr(out, "_torch") else _to_torch(out)


def log_probabilities_of(logits: Any, targets: Any, top_n: int, model: Any = None) -> LogProbabilities:
    """The ``LogProbabilities`` of ``targets[i]`` under ``logits[i]`` (rows ``(n, vocab)``), with the
    ``top_n`` most likely tokens of each row (plus the target)."""
    rows = _to_torch(logits)
    t = torch.as_tensor(np.asarray(targets, dtype=np.int64).reshape(-1), device=rows.device)
    return _entries(_log_softmax(rows, model), t, top_n)


def compute_log_probabilities_ragged(
    device: Any,
    model: Any,
    *,
    input_row_offsets: np.ndarray,
    logits: Any,
    next_token_logits: Any,
    tokens: np.ndarray,
    sampled_tokens: np.ndarray,
    batch_top_n: Sequence[int],
    batch_echo: Sequence[bool],
) -> list[Optional[LogProbabilities]]:
    """Log probabilities for each item of a ragged batch.

    Item n owns token rows ``[input_row_offsets[n], input_row_offsets[n+1])`` of
    ``tokens`` / ``logits``.  Without echo, its entry covers the sampled token only
    (from ``next_token_logits[n]``); with echo, it covers every token after the first
    of its rows (row i's logits score token i+1) and then the sampled token (scored by
    the last row).  Each step lists the ``top_n`` most likely tokens plus the chosen
    one.  Items with ``top_n == 0`` get None.  ``logits`` may be None when no item
    echoes.  The log-softmax is computed by ``model``, a compiled
    :func:`log_probabilities_ragged_graph`, when given (else in torch); top-k selection happens
    on the host.
    """
    offsets = np.asarray(input_row_offsets, dtype=np.int64).reshape(-1)
    n_batch = len(offsets) - 1
    if len(batch_top_n) != n_batch or len(batch_echo) != n_batch:
        raise ValueError(f"compute_log_probabilities_ragged: {n_batch} batch items but {len(batch_top_n)} top_n and "
                         f"{len(batch_echo)} echo values")
    ntl = _to_torch(next_token_logits).float()
    full = _to_torch(logits)
    if full is None and any(e and n for e, n in zip(batch_echo, batch_top_n)):
        raise ValueError("compute_log_probabilities_ragged: logits are required when an item echoes")
    toks = torch.as_tensor(np.asarray(tokens, dtype=np.int64).reshape(-1))
    sampled = torch.as_tensor(np.asarray(sampled_tokens, dtype=np.int64).reshape(-1))
    out: list[Optional[LogProbabilities]] = []
    for n in range(n_batch):
        top_n = int(batch_top_n[n])
        if top_n <= 0:
            out.append(None)
            continue
        if batch_echo[n]:
            lo, hi = int(offsets[n]), int(offsets[n + 1])
            rows = full[lo:hi].float()
            targets = torch.cat([toks[lo + 1:hi], sampled[n:n + 1]])
            out.append(_entries(_log_softmax(rows, model), targets.to(rows.device), top_n))
        else:
            out.append(_entries(_log_softmax(ntl[n:n + 1], model), sampled[n:n + 1].to(ntl.device), top_n))
    return out


def log_probabilities_ragged_graph(device: Any, *, levels: int) -> Any:
    """A ``max.graph.Graph`` computing ``logsoftmax`` of ``logits`` ``(tokens, vocab)``
    (float32); top-k selection (``k = 2**levels - 1``) happens on the host in
    :func:`compute_log_probabilities_ragged`."""
    from max.dtype import DType
    from max.graph import DeviceRef, Graph, TensorType, ops

    if levels < 1:
        raise ValueError(f"levels must be >= 1, got {levels}")
    dev = device if isinstance(device, DeviceRef) else DeviceRef.CPU()
    with Graph("log_probabilities_ragged",
               input_types=[TensorType(DType.float32, ["num_tokens", "vocab_size"], device=dev)]) as g:
        g.output(ops.logsoftmax(g.inputs[0].tensor))
    return g
