"""Batched token sampling in torch, one set of parameters per request.

:func:`sample_tokens` applies, per row of a ``(batch, vocab)`` logits tensor and in
this order:

1. repetition penalty (tokens of prompt + output: positive logits divided by the
   penalty, negative ones multiplied), then frequency / presence penalties (output
   tokens: ``logit -= frequency * count + presence * (count > 0)``, OpenAI);
2. banned tokens (e.g. EOS before ``min_new_tokens``) set to ``-inf``;
3. greedy rows (``temperature == 0`` or ``top_k == 1``): argmax;
4. other rows: ``logits / temperature``, top-k (``-1`` = the top 255 tokens, as the
   reference's ``SamplingParams`` documents; ``0`` = no limit, the whole vocabulary), top-p (nucleus, over the top-k), min-p
   (relative to the most likely token), then one categorical draw with the row's own
   ``torch.Generator`` (seeded from ``SamplingParams.seed``).

:func:`sample_for_contexts` runs :func:`prepare_logits` first: each request's logits processors,
``logit_bias`` and grammar token mask (structured output).

A :class:`GeneratorCache` keeps one generator per request across steps, so a seeded
request gives the same tokens every time it is run, whatever else is in its batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from max.interfaces import SamplingParams

TOP_K_DEFAULT = 255


def validate_sampling_params(params: SamplingParams, vocab_size: Optional[int] = None) -> None:
    """Raise ValueError/TypeError for parameters the sampler cannot use."""
    if not isinstance(params, SamplingParams):
        raise TypeError(f"expected SamplingParams, got {type(params).__name__}")
    if params.temperature < 0 or math.isnan(params.temperature) or math.isinf(params.temperature):
        raise ValueError(f"temperature must be a finite value >= 0, got {params.temperature}")
    if params.top_k < -1:
        raise ValueError(f"top_k must be -1 (top 255), 0 (the whole vocabulary) or >= 1, got {params.top_k}")
    if vocab_size is not None and params.top_k > vocab_size:
        raise ValueError(f"top_k ({params.top_k}) exceeds the vocabulary size ({vocab_size})")
    if not 0.0 < params.top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
    if not 0.0 <= params.min_p <= 1.0:
        raise ValueError(f"min_p must be in [0, 1], got {params.min_p}")
    if params.repetition_penalty <= 0:
        raise ValueError(f"repetition_penalty must be > 0, got {params.repetition_penalty}")


class GeneratorCache:
    """One ``torch.Generator`` per request id, seeded from the request's seed on first use."""

    def __init__(self) -> None:
        self._gens: dict[str, torch.Generator] = {}

    def get(self, request_id: str, seed: int, device: torch.device | str = "cpu") -> torch.Generator:
        g = self._gens.get(request_id)
        if g is None or g.device != torch.device(device):
            g = torch.Generator(device=device)
            g.manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)
            self._gens[request_id] = g
        return g

    def release(self, request_id: str) -> None:
        self._gens.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._gens)


@dataclass
class SamplingBatch:
    """Per-row sampling parameters as tensors (built by :meth:`from_params`)."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    frequency_penalty: torch.Tensor
    presence_penalty: torch.Tensor
    repetition_penalty: torch.Tensor
    greedy: torch.Tensor

    @classmethod
    def from_params(cls, params: Sequence[SamplingParams], vocab_size: int, device: Any = "cpu") -> "SamplingBatch":
        for p in params:
            validate_sampling_params(p)

        def t(vals: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(vals, dtype=dtype, device=device)

        top_k = [p.top_k_for(vocab_size) for p in params]
        return cls(
            temperature=t([p.temperature for p in params], torch.float32),
            top_k=t(top_k, torch.int64),
            top_p=t([p.top_p for p in params], torch.float32),
            min_p=t([p.min_p for p in params], torch.float32),
            frequency_penalty=t([p.frequency_penalty for p in params], torch.float32),
            presence_penalty=t([p.presence_penalty for p in params], torch.float32),
            repetition_penalty=t([p.repetition_penalty for p in params], torch.float32),
            greedy=t([p.temperature == 0.0 or p.top_k == 1 for p in params], torch.bool),
        )


def _counts(histories: Sequence[Any], batch: int, vocab: int, device: Any) -> torch.Tensor:
    counts = torch.zeros(batch, vocab, dtype=torch.float32, device=device)
    for i, h in enumerate(histories):
        if h is None or len(h) == 0:
            continue
        idx = torch.as_tensor(np.asarray(h, dtype=np.int64), device=device)
        if int(idx.min()) < 0 or int(idx.max()) >= vocab:
            raise ValueError(f"row {i}: token ids out of range [0, {vocab}) in the token history")
        counts[i].index_add_(0, idx, torch.ones_like(idx, dtype=torch.float32))
    return counts


def apply_penalties(logits: torch.Tensor, batch: SamplingBatch, output_tokens: Optional[Sequence[Any]],
                    prompt_tokens: Optional[Sequence[Any]]) -> torch.Tensor:
    """Repetition penalty (prompt + output tokens), then frequency/presence (output tokens)."""
    B, V = logits.shape
    repetition = bool((batch.repetition_penalty != 1.0).any())
    additive = bool(((batch.frequency_penalty != 0) | (batch.presence_penalty != 0)).any())
    if not (repetition or additive):  # no penalty asked for: no [B, V] count tensors to build
        return logits
    out_counts = _counts(output_tokens, B, V, logits.device) if output_tokens is not None else None
    if repetition:
        seen = out_counts.clone() if out_counts is not None else torch.zeros(B, V, device=logits.device)
        if prompt_tokens is not None:
            seen += _counts(prompt_tokens, B, V, logits.device)
        rp = batch.repetition_penalty[:, None]
        penalized = torch.where(logits > 0, logits / rp, logits * rp)
        logits = torch.where(seen > 0, penalized, logits)
    if out_counts is not None and additive:
        logits = logits - batch.frequency_penalty[:, None] * out_counts \
            - batch.presence_penalty[:, None] * (out_counts > 0).to(logits.dtype)
    return logits


def sample_tokens(
    logits: torch.Tensor,
    sampling_params: Sequence[SamplingParams],
    *,
    output_tokens: Optional[Sequence[Any]] = None,
    prompt_tokens: Optional[Sequence[Any]] = None,
    banned_tokens: Optional[Sequence[Any]] = None,
    generators: Optional[Sequence[Optional[torch.Generator]]] = None,
    return_logits: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of ``logits`` (``(batch, vocab)``).

    Args:
        logits: raw next-token logits, one row per request.
        sampling_params: one ``SamplingParams`` per row.
        output_tokens: per row, the tokens generated so far (frequency / presence /
            repetition penalties); None skips those penalties.
        prompt_tokens: per row, the prompt tokens (repetition penalty only).
        banned_tokens: per row, token ids to exclude (e.g. EOS before min_new_tokens).
        generators: per row, a ``torch.Generator`` (see :class:`GeneratorCache`); a row
            without one uses a fresh generator seeded with its ``seed``.
        return_logits: also return the processed logits (after penalties and bans,
            before temperature), e.g. for log probabilities.

    Returns:
        int64 tensor ``(batch,)`` of token ids (and the processed logits).
    """
    if logits.ndim != 2:
        raise ValueError(f"sample_tokens: logits must be (batch, vocab), got shape {tuple(logits.shape)}")
    B, V = logits.shape
    if len(sampling_params) != B:
        raise ValueError(f"sample_tokens: {len(sampling_params)} SamplingParams for {B} rows of logits")
    for name, seq in (("output_tokens", output_tokens), ("prompt_tokens", prompt_tokens),
                      ("banned_tokens", banned_tokens), ("generators", generators)):
        if seq is not None and len(seq) != B:
            raise ValueError(f"sample_tokens: {name} has {len(seq)} entries for {B} rows")
    device = logits.device
    batch = SamplingBatch.from_params(sampling_params, V, device)
    logits = logits.float()
    logits = apply_penalties(logits, batch, output_tokens, prompt_tokens)
    if banned_tokens is not None:
        before = logits
        logits = logits.clone()
        for i, ban in enumerate(banned_tokens):
            if ban is not None and len(ban):
                logits[i, torch.as_tensor(np.asarray(ban, dtype=np.int64), device=device)] = -math.inf
        # a ban that leaves nothing to sample (e.g. EOS before min_new_tokens when a grammar allows only
        # EOS) gives way: the row samples from its logits before the ban
        dead = torch.isneginf(logits).all(dim=-1)
        if bool(dead.any()):
            logits[dead] = before[dead]
    processed = logits
    out = torch.argmax(logits, dim=-1)
    rows = (~batch.greedy).nonzero().flatten().tolist()
    # rows with no top-k limit and no top-p sample from the whole vocabulary without sorting it
    # (a full sort of a 50k vocabulary per row costs several times the top 255's)
    unsorted = [r for r in rows if int(batch.top_k[r]) >= V and float(batch.top_p[r]) >= 1.0]
    if unsorted:
        sub = logits[unsorted] / batch.temperature[unsorted, None]
        # unnormalised probabilities, 1 for the most likely token (so min-p compares with min_p itself)
        probs = torch.exp(sub - sub.max(dim=-1, keepdim=True).values)
        min_p = batch.min_p[unsorted]
        if bool((min_p > 0).any()):
            probs = probs.masked_fill(probs < min_p[:, None], 0.0)
        _draw_inverse_cdf(out, probs, unsorted, sampling_params, generators, device)
    no_sort = set(unsorted)
    sorted_rows = [r for r in rows if r not in no_sort]
    if sorted_rows:
        rows = sorted_rows
        sub = logits[rows] / batch.temperature[rows, None]
        kmax = int(batch.top_k[rows].max())
        vals, idx = torch.topk(sub, kmax, dim=-1)  # sorted descending
        pos = torch.arange(kmax, device=device)[None, :]
        keep = pos < batch.top_k[rows, None]
        vals = vals.masked_fill(~keep, -math.inf)
        probs = torch.softmax(vals, dim=-1)
        # top-p: keep the smallest prefix whose mass reaches top_p (the first token always).
        before = torch.cumsum(probs, dim=-1) - probs
        keep &= before < batch.top_p[rows, None]
        # min-p: relative to the most likely token.
        keep &= probs >= batch.min_p[rows, None] * probs[:, :1]
        keep[:, 0] = True
        probs = torch.where(keep, probs, torch.zeros_like(probs))
        _draw(out, probs, idx, rows, sampling_params, generators, device)
    out = out.to(torch.int64)
    return (out, processed) if return_logits else out


def _generator(r: int, sampling_params: Sequence[SamplingParams], generators: Optional[Sequence[Any]],
               device: Any) -> torch.Generator:
    g = generators[r] if generators is not None else None
    if g is None:
        g = torch.Generator(device=device)
        g.manual_seed(int(sampling_params[r].seed) & 0xFFFF_FFFF_FFFF_FFFF)
    return g


def _draw_inverse_cdf(out: torch.Tensor, probs: torch.Tensor, rows: list[int],
                      sampling_params: Sequence[SamplingParams], generators: Optional[Sequence[Any]],
                      device: Any) -> None:
    """One draw per row of ``probs`` (unnormalised, over the whole vocabulary) by inverting its CDF
    with one uniform number from the row's generator: ``torch.multinomial`` over a 50k vocabulary
    costs about a thousand times more on the CPU.  A token of probability 0 is never drawn."""
    cdf = torch.cumsum(probs, dim=-1)
    for j, r in enumerate(rows):
        u = torch.rand(1, generator=_generator(r, sampling_params, generators, device), device=device,
                       dtype=cdf.dtype) * cdf[j, -1]
        t = int(torch.searchsorted(cdf[j], u, right=True)[0])
        if t >= cdf.shape[-1]:  # u rounded up to the total: the last token with any mass
            t = int(probs[j].nonzero()[-1, 0])
        out[r] = t


def _draw(out: torch.Tensor, probs: torch.Tensor, idx: torch.Tensor, rows: list[int],
          sampling_params: Sequence[SamplingParams], generators: Optional[Sequence[Any]], device: Any) -> None:
    """One categorical draw per row of ``probs`` (unnormalised, over the candidates ``idx`` names)
    with the row's generator, written to ``out[rows]``."""
    probs = probs / probs.sum(dim=-1, keepdim=True)
    for j, r in enumerate(rows):
        choice = torch.multinomial(probs[j], 1, generator=_generator(r, sampling_params, generators, device))
        out[r] = idx[j, choice[0]]


def prepare_logits(logits: torch.Tensor, contexts: Sequence[Any]) -> torch.Tensor:
    """The logits a batch samples from, before penalties: float32, with every request's
    ``SamplingParams.logits_processors`` called on its row (in place, in order), its ``logit_bias``
    added and, for requests with a grammar ``matcher``, the tokens the grammar forbids set to ``-inf``.
    Returns ``logits`` itself (as float32) when no request needs any of this, else a new tensor."""
    procs = [i for i, c in enumerate(contexts) if c.sampling_params.logits_processors]
    biased = [i for i, c in enumerate(contexts) if c.sampling_params.logit_bias]
    masked = [i for i, c in enumerate(contexts) if c.matcher is not None]
    out = logits.float()
    if not (procs or biased or masked):
        return out
    out = out.clone() if out is logits else out
    if procs:
        _run_logits_processors(out, contexts, procs)
    if biased:
        vocab = out.shape[-1]
        rows, cols, vals = [], [], []
        for i in biased:
            for t, b in contexts[i].sampling_params.logit_bias.items():
                if t >= vocab:
                    raise ValueError(f"request {contexts[i].request_id}: logit_bias token id {t} is outside the "
                                     f"vocabulary (size {vocab})")
                rows.append(i)
                cols.append(t)
                vals.append(b)
        out.index_put_((torch.tensor(rows, device=out.device), torch.tensor(cols, device=out.device)),
                       torch.tensor(vals, dtype=out.dtype, device=out.device), accumulate=True)
    if masked:
        from max.pipelines.lib.structured_output import apply_token_bitmask, fill_token_bitmask

        bitmask = fill_token_bitmask([contexts[i].matcher for i in masked], out.shape[-1])
        apply_token_bitmask(out, bitmask, masked)
    return out


def _run_logits_processors(logits: torch.Tensor, contexts: Sequence[Any], rows: Sequence[int]) -> None:
    from max.driver import Buffer
    from max.interfaces import ProcessorInputs

    for i in rows:
        view = Buffer.from_dlpack(logits[i:i + 1])  # shares memory: in-place edits reach the batch
        for proc in contexts[i].sampling_params.logits_processors:
            proc(ProcessorInputs(logits=view, context=contexts[i]))


def sample_for_contexts(logits: torch.Tensor, contexts: Sequence[Any], generators: Optional[GeneratorCache] = None,
                        *, apply_penalties_: bool = True, return_logits: bool = False) -> Any:
    """:func:`sample_tokens` for ``TextContext`` rows: logits prepared by :func:`prepare_logits`
    (logits processors, ``logit_bias``, grammar masks); parameters, token histories, EOS bans before
    ``min_new_tokens`` (from ``get_min_token_logit_mask``) and per-request generators come from the
    contexts (and ``generators``).  Constrained and free requests share the batch."""
    logits = prepare_logits(logits, contexts)
    params = [c.sampling_params for c in contexts]
    needs_hist = apply_penalties_ and any(
        p.frequency_penalty or p.presence_penalty or p.repetition_penalty != 1.0 for p in params)
    outs = [c.generated_tokens for c in contexts] if needs_hist else None
    prompts = [c.prompt_tokens for c in contexts] if needs_hist else None
    bans = []
    for c in contexts:
        m = c.get_min_token_logit_mask(1)[0]
        bans.append(m[:, 1] if len(m) else None)
    gens = None
    if generators is not None:
        gens = [generators.get(c.request_id, c.sampling_params.seed, logits.device) for c in contexts]
    return sample_tokens(logits, params, output_tokens=outs, prompt_tokens=prompts,
                         banned_tokens=bans if any(b is not None for b in bans) else None,
                         generators=gens, return_logits=return_logits)


def rejection_sample(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                     generator: Optional[torch.Generator] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative-decoding acceptance (Leviathan et al.).

    ``draft_tokens`` ``(B, K)``, ``draft_probs`` ``(B, K, V)`` and ``target_probs``
    ``(B, K + 1, V)``.  Draft token k is accepted with probability
    ``min(1, p_target / p_draft)``; at the first rejection a token is drawn from
    ``normalize(max(0, p_target - p_draft))``; if all K are accepted, a bonus token is
    drawn from ``target_probs[:, K]``.  Returns ``(num_accepted (B,), next_token (B,))``.
    """
    B, K = draft_tokens.shape
    u = torch.rand(B, K, generator=generator, device=draft_tokens.device)
    pt = target_probs[:, :K].gather(-1, draft_tokens[..., None])[..., 0]
    pd = draft_probs.gather(-1, draft_tokens[..., None])[..., 0]
    accept = u < torch.clamp(pt / pd.clamp_min(1e-20), max=1.0)
    rejected = ~accept
    first_rej = torch.where(rejected.any(-1), rejected.float().argmax(-1), torch.full((B,), K, device=u.device))
    nxt = torch.empty(B, dtype=torch.int64, device=u.device)
    for b in range(B):
        k = int(first_rej[b])
        if k < K:
            resid = (target_probs[b, k] - draft_probs[b, k]).clamp_min(0)
            dist = resid if float(resid.sum()) > 0 else target_probs[b, k]
        else:
            dist = target_probs[b, K]
        nxt[b] = torch.multinomial(dist / dist.sum(), 1, generator=generator)[0]
    return first_rej.to(torch.int64), nxt


# --------------------------------------------------------------------------- graph builders


def token_sampler(sampling_config: Any, device: Any, return_logits: bool = False) -> Any:
    """A ``max.graph.Graph`` ``"token_sampler"``: input ``logits`` ``(batch, vocab)`` in
    ``sampling_config.in_dtype``; output the greedy (argmax) tokens ``(batch, 1)`` int64,
    plus the logits cast to ``out_dtype`` when ``return_logits``.

    Stochastic sampling (temperature, top-k/p, min-p, penalties, seeds) needs random
    numbers, for which ``max.graph`` has no op yet; pipelines use :func:`sample_tokens`.
    """
    from max.dtype import DType
    from max.graph import DeviceRef, Graph, TensorType, ops

    in_dtype = getattr(sampling_config, "in_dtype", DType.float32)
    out_dtype = getattr(sampling_config, "out_dtype", DType.float32)
    dev = device if isinstance(device, DeviceRef) else DeviceRef.CPU()
    with Graph("token_sampler", input_types=[TensorType(in_dtype, ["batch", "vocab_size"], device=dev)]) as g:
        logits = g.inputs[0].tensor
        tokens = ops.argmax(logits, axis=-1)
        if return_logits:
            g.output(tokens, ops.cast(logits, out_dtype))
        else:
            g.output(tokens)
    return g


def rejection_sampler(device: Any, *, seed: int = 0) -> Any:
    """Not available as a graph (``max.graph`` has no random op yet); use
    :func:`rejection_sample` (torch) instead."""
    raise NotImplementedError("rejection_sampler graphs need a random op; use "
                              "max.pipelines.lib.sampling.rejection_sample (torch) instead")


def rejection_sampler_with_residuals(device: Any, *, seed: int = 0, debug: bool = False) -> Any:
    """Not available as a graph; :func:`rejection_sample` does residual sampling in torch."""
    raise NotImplementedError("rejection_sampler_with_residuals graphs need a random op; use "
                              "max.pipelines.lib.sampling.rejection_sample (torch) instead")
