"""Token samplers built from graph ops (``max.nn.sampling``).

* ``MinPSampler``: min-p sampling from ``softmax(logits / temperature)``.
* ``LogitPenalties``: frequency, presence and repetition penalties on logits.
* Speculative decoding: ``RejectionSampler`` (draft tokens accepted with probability
  ``min(1, p_target / p_draft)``), ``RejectionSamplerWithResiduals`` (rejections resampled from
  ``max(0, p_target - p_draft)``), and for a draft that proposes its argmax,
  ``greedy_acceptance_sampler`` (accept when the draft token is the target's argmax) and
  ``stochastic_acceptance_sampler`` (accept with probability ``p_target(draft)``, recover from
  ``p_target`` without the draft token); ``AcceptanceSampler`` is the Module form of those two.

Conventions.  ``K`` draft tokens per request; the target logits of request ``b`` are the ``K + 1``
rows ``target_logits[target_logit_offsets[b] + i]`` (``i = 0..K``, the last row gives the bonus
token).  The target distribution is ``softmax(logits / temperature)`` restricted to the ``top_k``
largest logits (``top_k = 1``: the argmax) and then to the smallest set of tokens whose probability
reaches ``top_p``.  ``first_rejected[b]`` is the index of the first rejected draft token, ``K`` when
all are accepted; the accepted prefix is ``draft_tokens[b, :first_rejected[b]]``, followed by
``recovered[b, first_rejected[b]]`` (or by ``bonus[b]`` when every draft was accepted).  Random draws
use the graph's generator, reseeded with ``seed`` at every execution (``ops.random.set_seed``), so an
execution is reproducible.
"""

from __future__ import annotations

import math
from typing import Any

from max.dtype import DType
from max.graph import DeviceRef, Shape, TensorType, TensorValue, ops
from max.graph.dim import StaticDim
from max.graph.ops._common import as_tensor
from max.nn.layer import Module

__all__ = [
    "AcceptanceSampler", "LogitPenalties", "MinPSampler", "RejectionSampler", "RejectionSamplerWithResiduals",
    "greedy_acceptance_sampler", "stochastic_acceptance_sampler",
]

_NEG = -1e30  # masked logits (finite, so masked rows stay NaN-free)


# ----------------------------------------------------------------------------- helpers
def _f32(x: Any, who: str, rank: int) -> TensorValue:
    v = as_tensor(x, op=who)
    if v.rank != rank:
        raise ValueError(f"{who}: expected a rank-{rank} tensor, got {v.type}")
    return v if v.dtype is DType.float32 else ops.cast(v, DType.float32)


def _const(value: float, like: TensorValue) -> TensorValue:
    return ops.constant(value, DType.float32, like.device)


def _gumbel(like: TensorValue) -> TensorValue:
    """Gumbel(0, 1) noise of ``like``'s shape: ``-log(-log(u))``, ``u`` uniform in ``(0, 1)``."""
    u = ops.random.uniform(TensorType(DType.float32, like.shape, like.device), range=(1e-10, 1.0))
    return ops.negate(ops.log(ops.negate(ops.log(u))))


def _sample(logp: TensorValue) -> TensorValue:
    """One token per row of log-probabilities (last axis), int64 with the last axis kept as 1."""
    return ops.argmax(ops.add(logp, _gumbel(logp)), axis=-1)


def _filter_logits(logits: TensorValue, temperature: float, top_k: int, top_p: float) -> TensorValue:
    """Log-probabilities of the target distribution (see the module docstring); masked tokens ``_NEG``."""
    if top_k == 1:  # greedy: a one-hot distribution on the argmax
        best = ops.argmax(logits, axis=-1)
        return ops.where(ops.equal(_iota(logits), best), _const(0.0, logits), _const(_NEG, logits))
    x = ops.div(logits, _const(float(temperature), logits)) if temperature != 1.0 else logits
    if top_k > 1:
        kth = ops.min(ops.top_k(x, top_k, axis=-1)[0], axis=-1)
        x = ops.where(ops.greater_equal(x, kth), x, _const(_NEG, x))
    logp = ops.logsoftmax(x, axis=-1)
    if top_p < 1.0:
        p = ops.exp(logp)
        vocab = int(p.shape[-1])
        sorted_p = ops.top_k(p, vocab, axis=-1)[0]
        before = ops.sub(ops.cumsum(sorted_p, axis=-1), sorted_p)  # mass of the larger tokens
        kept = ops.where(ops.greater(_const(float(top_p), p), before), sorted_p, _const(2.0, p))
        threshold = ops.min(kept, axis=-1)  # the smallest kept probability
        x = ops.where(ops.greater_equal(p, threshold), logp, _const(_NEG, logp))
        logp = ops.logsoftmax(x, axis=-1)
    return logp


def _iota(x: TensorValue) -> TensorValue:
    """``0 .. vocab - 1`` (int64) along the last axis of ``x``, broadcastable against it."""
    return ops.range(0, x.shape[-1], 1, out_dim=x.shape[-1], dtype=DType.int64, device=x.device)


def _pick(logp: TensorValue, tokens: TensorValue) -> TensorValue:
    """``logp[..., tokens[...]]`` (tokens int64 with a trailing 1 axis); the trailing axis kept."""
    hit = ops.equal(_iota(logp), tokens)
    return ops.max(ops.where(hit, logp, _const(_NEG, logp)), axis=-1)


def _rows(target_logits: Any, offsets: Any, k: Any, who: str) -> TensorValue:
    """The ``[B, K + 1, V]`` target rows ``target_logits[offsets[b] + i]``."""
    t = _f32(target_logits, who, 2)
    off = as_tensor(offsets, op=who, arg="target_logit_offsets")
    if off.rank != 1 or not off.dtype.is_integral():
        raise TypeError(f"{who}: target_logit_offsets must be a rank-1 integer tensor, got {off.type}")
    starts = ops.cast(ops.slice_tensor(off, [slice(0, -1)]), DType.int64)  # [B]
    steps = ops.range(0, k + 1, 1, out_dim=k + 1, dtype=DType.int64, device=off.device)  # [K + 1]
    idx = ops.add(ops.unsqueeze(starts, 1), ops.unsqueeze(steps, 0))  # [B, K + 1]
    return ops.gather(t, idx, axis=0)


def _first_rejected(accept: TensorValue, k: int) -> TensorValue:
    """Index of the first False along the last axis (``k`` when none), int64 ``[B]``."""
    pos = ops.range(0, k, 1, out_dim=k, dtype=DType.int64, device=accept.device)
    big = ops.constant(k, DType.int64, accept.device)
    cand = ops.where(accept, big, ops.broadcast_to(pos, accept.shape))
    return ops.squeeze(ops.min(cand, axis=-1), -1)


def _draft_count(draft_tokens: Any, who: str) -> tuple[TensorValue, int]:
    d = as_tensor(draft_tokens, op=who, arg="draft_tokens")
    if d.rank != 2 or not d.dtype.is_integral():
        raise TypeError(f"{who}: draft_tokens must be an integer [batch, num_draft] tensor, got {d.type}")
    k = d.shape[1]
    if not isinstance(k, StaticDim):
        raise ValueError(f"{who}: the number of draft tokens must be static, got {d.shape}")
    return ops.cast(d, DType.int64), int(k)


def _check_params(who: str, top_k: int, top_p: float, temperature: float) -> None:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < -1 or top_k == 0:
        raise ValueError(f"{who}: top_k must be a positive int (or -1 for all tokens), got {top_k!r}")
    if not 0.0 < float(top_p) <= 1.0:
        raise ValueError(f"{who}: top_p must be in (0, 1], got {top_p!r}")
    if not float(temperature) > 0.0:
        raise ValueError(f"{who}: temperature must be > 0, got {temperature!r}")


# ----------------------------------------------------------------------------- min-p
class MinPSampler(Module):
    """Min-p sampling: tokens whose probability is at least ``min_p`` times the row's largest probability
    are kept and one is drawn from their renormalised ``softmax(logits / temperature)``.

    ``dtype`` and ``shape`` (``[batch, vocab]``) are the logits' type; ``min_p`` (default 0.1) can be
    changed on the instance or given per call (a float, or a float tensor ``[batch]``).  Calling it
    returns the sampled tokens, int64 ``[batch, 1]``.
    """

    def __init__(self, dtype: DType, shape: Any, temperature: float = 1, min_p: float = 0.1, seed: int = 0) -> None:
        super().__init__()
        if not isinstance(dtype, DType):
            raise TypeError(f"MinPSampler: dtype must be a DType, got {dtype!r}")
        self.dtype = dtype
        self.shape = Shape(shape)
        if len(self.shape) != 2:
            raise ValueError(f"MinPSampler: shape must be [batch, vocab], got {self.shape}")
        if not float(temperature) > 0:
            raise ValueError(f"MinPSampler: temperature must be > 0, got {temperature!r}")
        self.temperature = float(temperature)
        self.min_p = float(min_p)
        self.seed = int(seed)

    def __call__(self, logits: Any, min_p: Any = None) -> TensorValue:
        who = "MinPSampler"
        x = as_tensor(logits, op=who, arg="logits")
        if x.dtype is not self.dtype or x.rank != 2:
            raise ValueError(f"{who}: logits must be {self.dtype} [batch, vocab] like {self.shape}, got {x.type}")
        x = ops.cast(x, DType.float32) if x.dtype is not DType.float32 else x
        if self.temperature != 1.0:
            x = ops.div(x, _const(self.temperature, x))
        logp = ops.logsoftmax(x, axis=-1)
        mp = self.min_p if min_p is None else min_p
        if isinstance(mp, (int, float)):
            if not 0.0 <= float(mp) <= 1.0:
                raise ValueError(f"{who}: min_p must be in [0, 1], got {mp!r}")
            log_mp = ops.constant(_NEG if mp == 0 else math.log(mp), DType.float32, x.device)
        else:
            m = _f32(mp, who, 1)
            log_mp = ops.unsqueeze(ops.log(m), 1)
        floor = ops.add(ops.max(logp, axis=-1), log_mp)
        kept = ops.where(ops.greater_equal(logp, floor), logp, _const(_NEG, logp))
        ops.random.set_seed(self.seed)
        return _sample(kept)


# ----------------------------------------------------------------------------- penalties
class LogitPenalties(Module):
    """OpenAI/vLLM-style penalties from the counts of tokens generated so far:
    ``logits - frequency_penalty * count - presence_penalty * (count > 0)``, then for tokens seen
    (``count > 0``) a ``repetition_penalty`` divides positive logits and multiplies negative ones.

    Call with ``logits`` ``[batch, vocab]``, ``counts`` (integer ``[batch, vocab]``) and per-request
    penalties (float ``[batch]``, or numbers for the whole batch); returns float32 ``[batch, vocab]``.
    """

    def __call__(self, logits: Any, counts: Any, frequency_penalty: Any = 0.0, presence_penalty: Any = 0.0,
                 repetition_penalty: Any = 1.0) -> TensorValue:
        who = "LogitPenalties"
        x = _f32(logits, who, 2)
        c = as_tensor(counts, op=who, arg="counts")
        if c.rank != 2 or not c.dtype.is_integral():
            raise TypeError(f"{who}: counts must be an integer [batch, vocab] tensor, got {c.type}")
        cf = ops.cast(c, DType.float32)
        seen = ops.greater(cf, _const(0.0, cf))

        def per_row(v: Any, name: str) -> TensorValue:
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                return _const(float(v), x)
            return ops.unsqueeze(_f32(v, f"{who} ({name})", 1), 1)

        x = ops.sub(x, ops.mul(per_row(frequency_penalty, "frequency_penalty"), cf))
        x = ops.sub(x, ops.mul(per_row(presence_penalty, "presence_penalty"), ops.cast(seen, DType.float32)))
        rep = per_row(repetition_penalty, "repetition_penalty")
        penalised = ops.where(ops.greater(x, _const(0.0, x)), ops.div(x, rep), ops.mul(x, rep))
        return ops.where(seen, penalised, x)


# ----------------------------------------------------------------------------- rejection sampling
class RejectionSampler(Module):
    """Speculative decoding: accept draft token ``t_i`` with probability ``min(1, p_target(t_i) / p_draft(t_i))``.

    Call with ``draft_tokens`` (int ``[B, K]``), ``draft_logits_for_sampled_tokens`` (``[B, K]``: the draft
    model's log-probability of each proposed token), ``target_logits`` (``[rows, V]``) and
    ``target_logit_offsets`` (``[B + 1]``).  Returns ``(first_rejected [B], target_tokens [B, K + 1])``:
    a fresh sample of the target distribution at each position (the recovery token at the first
    rejection, the bonus token at ``K``).
    """

    def __init__(self, device: DeviceRef, top_k: int = 1, top_p: float = 1, temperature: float = 1.0, seed: int = 0,
                 eps: float = 1e-5) -> None:
        super().__init__()
        _check_params("RejectionSampler", top_k, top_p, temperature)
        self.device, self.top_k, self.top_p, self.temperature = device, top_k, float(top_p), float(temperature)
        self.seed, self.eps = int(seed), float(eps)

    def __call__(self, draft_tokens: Any, draft_logits_for_sampled_tokens: Any, target_logits: Any,
                 target_logit_offsets: Any) -> tuple[TensorValue, TensorValue]:
        who = "RejectionSampler"
        d, k = _draft_count(draft_tokens, who)
        dlp = _f32(draft_logits_for_sampled_tokens, who, 2)
        rows = _rows(target_logits, target_logit_offsets, k, who)
        logp = _filter_logits(rows, self.temperature, self.top_k, self.top_p)  # [B, K + 1, V]
        head = ops.slice_tensor(logp, [slice(None), slice(0, k), slice(None)])
        tlp = ops.squeeze(_pick(head, ops.unsqueeze(d, -1)), -1)  # [B, K]
        ops.random.set_seed(self.seed)
        u = ops.random.uniform(TensorType(DType.float32, dlp.shape, dlp.device), range=(self.eps, 1.0))
        accept = ops.greater(ops.sub(tlp, dlp), ops.log(u))
        return _first_rejected(accept, k), ops.squeeze(_sample(logp), -1)


class RejectionSamplerWithResiduals(Module):
    """Speculative decoding with residual resampling: draft token ``t_i`` (drawn from ``p_draft``) is
    accepted with probability ``min(1, p_target(t_i) / p_draft(t_i))``; a rejected position is resampled
    from ``max(0, p_target - p_draft)`` (renormalised), which makes the output exactly ``p_target``
    distributed.

    Call with ``draft_tokens`` ``[B, K]``, ``draft_logits`` ``[B, K, V]`` (the draft model's logits),
    ``target_logits`` ``[rows, V]`` and ``target_logit_offsets`` ``[B + 1]``.  Returns
    ``(first_rejected [B], recovered [B, K], bonus [B])``.
    """

    def __init__(self, device: DeviceRef, top_k: int = 1, temperature: float = 1.0, eps: float = 1e-10,
                 seed: int = 0, debug: bool = False) -> None:
        super().__init__()
        _check_params("RejectionSamplerWithResiduals", top_k, 1.0, temperature)
        self.device, self.top_k, self.temperature = device, top_k, float(temperature)
        self.eps, self.seed, self.debug = float(eps), int(seed), bool(debug)

    def __call__(self, draft_tokens: Any, draft_logits: Any, target_logits: Any,
                 target_logit_offsets: Any) -> tuple[TensorValue, TensorValue, TensorValue]:
        who = "RejectionSamplerWithResiduals"
        d, k = _draft_count(draft_tokens, who)
        dl = _f32(draft_logits, who, 3)
        rows = _rows(target_logits, target_logit_offsets, k, who)
        t_logp = _filter_logits(rows, self.temperature, self.top_k, 1.0)
        d_logp = _filter_logits(dl, self.temperature, self.top_k, 1.0)
        head = ops.slice_tensor(t_logp, [slice(None), slice(0, k), slice(None)])
        idx = ops.unsqueeze(d, -1)
        tlp, dlp = ops.squeeze(_pick(head, idx), -1), ops.squeeze(_pick(d_logp, idx), -1)
        ops.random.set_seed(self.seed)
        u = ops.random.uniform(TensorType(DType.float32, tlp.shape, tlp.device), range=(self.eps, 1.0))
        accept = ops.greater(ops.sub(tlp, dlp), ops.log(u))
        resid = ops.max(ops.sub(ops.exp(head), ops.exp(d_logp)), _const(0.0, head))
        total = ops.sum(resid, axis=-1)
        # where p_target <= p_draft everywhere (equal distributions), fall back to p_target
        resid = ops.where(ops.greater(total, _const(self.eps, total)), resid, ops.exp(head))
        r_logp = ops.log(ops.max(resid, _const(1e-38, resid)))
        r_logp = ops.where(ops.greater(resid, _const(0.0, resid)), r_logp, _const(_NEG, r_logp))
        recovered = ops.squeeze(_sample(r_logp), -1)
        last = ops.slice_tensor(t_logp, [slice(None), slice(k, k + 1), slice(None)])
        bonus = ops.squeeze(ops.squeeze(_sample(last), -1), -1)
        return _first_rejected(accept, k), recovered, bonus


# ----------------------------------------------------------------------------- acceptance (argmax drafts)
def greedy_acceptance_sampler(draft_tokens: Any, target_logits: Any,
                              target_logit_offsets: Any) -> tuple[TensorValue, TensorValue, TensorValue]:
    """Strict greedy acceptance: draft token ``i`` is accepted when it equals the argmax of target row ``i``.
    Returns ``(first_rejected [B], target_tokens [B, K], bonus [B])``: the target argmax at each draft
    position and at the final row."""
    who = "greedy_acceptance_sampler"
    d, k = _draft_count(draft_tokens, who)
    rows = _rows(target_logits, target_logit_offsets, k, who)
    best = ops.squeeze(ops.argmax(rows, axis=-1), -1)  # [B, K + 1]
    head = ops.slice_tensor(best, [slice(None), slice(0, k)])
    bonus = ops.squeeze(ops.slice_tensor(best, [slice(None), slice(k, k + 1)]), -1)
    return _first_rejected(ops.equal(head, d), k), head, bonus


def stochastic_acceptance_sampler(draft_tokens: Any, target_logits: Any, target_logit_offsets: Any, *,
                                  temperature: float = 1.0, top_k: int = -1, top_p: float = 1.0,
                                  seed: int = 0) -> tuple[TensorValue, TensorValue, TensorValue]:
    """Acceptance for a draft that proposes its argmax (a point mass): draft token ``t_i`` is accepted when
    a uniform coin is below ``p_target(t_i)``; a rejected position recovers from ``p_target`` with ``t_i``'s
    mass removed (renormalised).  Returns ``(first_rejected [B], recovered [B, K], bonus [B])``."""
    who = "stochastic_acceptance_sampler"
    _check_params(who, top_k, top_p, temperature)
    d, k = _draft_count(draft_tokens, who)
    rows = _rows(target_logits, target_logit_offsets, k, who)
    logp = _filter_logits(rows, float(temperature), top_k, float(top_p))
    head = ops.slice_tensor(logp, [slice(None), slice(0, k), slice(None)])
    idx = ops.unsqueeze(d, -1)
    tlp = ops.squeeze(_pick(head, idx), -1)
    ops.random.set_seed(int(seed))
    u = ops.random.uniform(TensorType(DType.float32, tlp.shape, tlp.device), range=(1e-10, 1.0))
    accept = ops.greater(tlp, ops.log(u))
    without = ops.where(ops.equal(_iota(head), idx), _const(_NEG, head), head)
    recovered = ops.squeeze(_sample(without), -1)
    last = ops.slice_tensor(logp, [slice(None), slice(k, k + 1), slice(None)])
    bonus = ops.squeeze(ops.squeeze(_sample(last), -1), -1)
    return _first_rejected(accept, k), recovered, bonus


class AcceptanceSampler(Module):
    """The acceptance samplers as a Module: ``greedy=True`` runs :func:`greedy_acceptance_sampler`, otherwise
    :func:`stochastic_acceptance_sampler` with this module's ``temperature``, ``top_k``, ``top_p`` and ``seed``.
    Call with ``(draft_tokens, target_logits, target_logit_offsets)``."""

    def __init__(self, device: DeviceRef, greedy: bool = True, temperature: float = 1.0, top_k: int = -1,
                 top_p: float = 1.0, seed: int = 0) -> None:
        super().__init__()
        _check_params("AcceptanceSampler", top_k, top_p, temperature)
        self.device, self.greedy = device, bool(greedy)
        self.temperature, self.top_k, self.top_p, self.seed = float(temperature), top_k, float(top_p), int(seed)

    def __call__(self, draft_tokens: Any, target_logits: Any,
                 target_logit_offsets: Any) -> tuple[TensorValue, TensorValue, TensorValue]:
        if self.greedy:
            return greedy_acceptance_sampler(draft_tokens, target_logits, target_logit_offsets)
        return stochastic_acceptance_sampler(draft_tokens, target_logits, target_logit_offsets,
                                             temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                                             seed=self.seed)
