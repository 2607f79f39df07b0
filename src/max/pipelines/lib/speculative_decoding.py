"""Speculative decoding: a small draft model -- or, with ``speculative_method="ngram"``, a lookup of the
request's own earlier tokens (``ngram_draft``), or with ``"mtp"`` the target's own multi-token prediction
layer fed its hidden states (``mtp_draft``) -- proposes up to ``k`` tokens per request, the target
model scores all of them in one step, and rejection sampling keeps a prefix (Leviathan et al., 2023).

Per scheduler step, requests still encoding their prompt, and requests whose decoding needs the plain
path (grammar masks, logits processors, logit bias, penalties, log probabilities, minimum lengths), run
one ordinary target step.  Every other decoding request runs one speculative round:

1. the draft model catches up on the tokens it has not seen (its own paged KV cache, same request
   ids) and samples ``k`` proposals from its distribution ``q`` (the request's temperature / top-k /
   top-p / min-p applied); the n-gram draft proposes the tokens that followed the latest earlier
   occurrence of the request's last tokens (``q`` one-hot), and a request without such a match runs an
   ordinary target step; the MTP draft samples from its layer's logits as the draft model does;
2. the target model (built with ``ReturnLogits.ALL``) runs once on ``[last token, d_1 .. d_k]``; its
   rows give ``p_1 .. p_{k+1}``;
3. ``d_i`` is accepted with probability ``min(1, p_i(d_i) / q_i(d_i))``; at the first rejection the
   next token is drawn from ``normalize(max(0, p_i - q_i))``, and when all ``k`` are accepted a bonus
   token is drawn from ``p_{k+1}``.  Greedy requests accept ``d_i`` iff it is ``argmax p_i`` and take
   ``argmax p`` at the first mismatch, so their output is token-identical to decoding without a draft;
   sampled requests keep the target's distribution exactly.

KV entries written for rejected tokens lie beyond the context's ``start_idx`` and are overwritten by
later steps.  :attr:`metrics` counts proposed and accepted draft tokens (acceptance rate).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch

from max.interfaces import StepPlan
from max.nn.transformer import ReturnLogits
from max.pipelines.lib.mtp_draft import MTPDraft
from max.pipelines.lib.ngram_draft import ngram_proposal, prompt_lookup_bounds
from max.pipelines.lib.pipeline import TextGenerationPipeline, build_pipeline_model

logger = logging.getLogger("max.pipelines")

__all__ = ["SpeculativeDecodingMetrics", "SpeculativeDecodingTextGenerationPipeline", "token_probabilities"]


@dataclass
class SpeculativeDecodingMetrics:
    """Draft tokens proposed and accepted, rounds run, and the bonus tokens of fully accepted rounds."""

    draft_tokens_proposed: int = 0
    draft_tokens_accepted: int = 0
    rounds: int = 0
    tokens_generated: int = 0
    per_position_accepted: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.draft_tokens_accepted / self.draft_tokens_proposed if self.draft_tokens_proposed else 0.0

    @property
    def tokens_per_round(self) -> float:
        return self.tokens_generated / self.rounds if self.rounds else 0.0


def token_probabilities(logits: torch.Tensor, params: Any) -> torch.Tensor:
    """The distribution ``(rows, vocab)`` a request samples from: temperature, top-k (-1 = 255, 0 = the whole vocabulary), top-p
    and min-p applied to float32 ``logits`` rows, as :func:`~max.pipelines.lib.sampling.sample_tokens`
    does (greedy parameters give a one-hot argmax)."""
    lg = logits.float()
    V = lg.shape[-1]
    if params.temperature == 0.0 or params.top_k == 1:
        return torch.nn.functional.one_hot(lg.argmax(-1), V).float()
    lg = lg / params.temperature
    k = params.top_k_for(V)
    if k >= V and params.top_p >= 1.0:  # the whole vocabulary: no sort needed
        probs = torch.softmax(lg, dim=-1)
        probs = torch.where(probs >= params.min_p * probs.max(dim=-1, keepdim=True).values, probs,
                            torch.zeros_like(probs))
        return probs / probs.sum(-1, keepdim=True)
    vals, idx = torch.topk(lg, k, dim=-1)
    probs = torch.softmax(vals, dim=-1)
    keep = (torch.cumsum(probs, dim=-1) - probs) < params.top_p
    keep &= probs >= params.min_p * probs[..., :1]
    keep[..., 0] = True
    probs = torch.where(keep, probs, torch.zeros_like(probs))
    probs = probs / probs.sum(-1, keepdim=True)
    out = torch.zeros_like(lg)
    return out.scatter_(-1, idx, probs)


def _plain(ctx: Any) -> bool:
    """Whether a decoding request can run speculatively (its sampling is a function of the logits alone)."""
    p = ctx.sampling_params
    return (not ctx.needs_ce and ctx.matcher is None and not p.logits_processors
            and not p.logit_bias and not p.frequency_penalty and not p.presence_penalty
            and p.repetition_penalty == 1.0 and not ctx.log_probabilities
            and len(ctx.generated_tokens) >= ctx.min_tokens)


class SpeculativeDecodingTextGenerationPipeline(TextGenerationPipeline):
    """A ``TextGenerationPipeline`` whose decode steps are accelerated by a draft model
    (``PipelineConfig.draft_model_path``, ``num_speculative_tokens``), by the n-gram draft
    (``speculative_method="ngram"``, ``prompt_lookup_min`` / ``prompt_lookup_max``) or by the model's MTP
    layer (``speculative_method="mtp"``)."""

    _force_all_logits = True  # the target scores every draft token

    def __init__(self, pipeline_config: Any, pipeline_model: type, eos_token_id: int, weight_adapters: Any,
                 tokenizer: Any) -> None:
        t0 = time.perf_counter()
        super().__init__(pipeline_config, pipeline_model, eos_token_id, weight_adapters, tokenizer)
        self.num_speculative_tokens = int(pipeline_config.num_speculative_tokens)
        self.metrics = SpeculativeDecodingMetrics()
        self._draft_ctx: dict[str, Any] = {}
        self._gens: dict[str, torch.Generator] = {}
        self._round_end: dict[str, int] = {}
        self._draft: Any = None
        self._lookup: Optional[tuple[int, int]] = None
        self._mtp: Optional[MTPDraft] = None
        if getattr(pipeline_config, "speculative_method", None) == "mtp":
            self._mtp = MTPDraft(self._pipeline_model)
            self.load_seconds = time.perf_counter() - t0
            return
        if getattr(pipeline_config, "speculative_method", None) == "ngram":
            self._lookup = prompt_lookup_bounds(pipeline_config.prompt_lookup_min, pipeline_config.prompt_lookup_max)
            self.load_seconds = time.perf_counter() - t0
            return
        from max.pipelines.lib.config import PipelineConfig
        from max.pipelines.lib.registry import PIPELINE_REGISTRY

        kvc = pipeline_config.model_config.kv_cache_config
        draft_cfg = PipelineConfig(model_path=str(pipeline_config.draft_model_path),
                                   device_specs=pipeline_config.model_config.device_specs,
                                   max_length=self._pipeline_model.max_seq_len,
                                   max_batch_size=pipeline_config.max_batch_size,
                                   enable_prefix_caching=kvc.enable_prefix_caching)
        arch = PIPELINE_REGISTRY._require(draft_cfg)
        _, self._draft = build_pipeline_model(draft_cfg, arch.pipeline_model, arch.weight_adapters or {},
                                              ReturnLogits.LAST_TOKEN)
        self._check_vocabularies(draft_cfg)
        self.load_seconds = time.perf_counter() - t0

    def _check_vocabularies(self, draft_cfg: Any) -> None:
        from max.pipelines.lib.tokenizer import load_hf_tokenizer

        tv = _vocab_size(self._pipeline_model)
        dv = _vocab_size(self._draft)
        if tv is not None and dv is not None and tv != dv:
            raise ValueError(f"the draft model's vocabulary ({dv} tokens) differs from the target's ({tv}); "
                             "speculative decoding needs the same tokenizer")
        draft_tok = load_hf_tokenizer(str(draft_cfg.model_config.model_path))
        target_tok = self._tokenizer.delegate
        if draft_tok.get_vocab() != target_tok.get_vocab():
            raise ValueError("the draft model's tokenizer maps tokens to other ids than the target's; speculative "
                             "decoding needs the same vocabulary")

    # ------------------------------------------------------------ API
    @property
    def kv_managers(self) -> list[Any]:
        extra = [self._draft.kv_manager] if self._draft is not None else []
        if self._mtp is not None:
            extra.append(self._mtp.kv_manager)
        return [self._pipeline_model.kv_manager] + extra

    def release(self, request_id: str) -> None:
        super().release(request_id)
        mgr = self._draft.kv_manager if self._draft is not None else None
        if mgr is not None and mgr.contains(request_id):
            mgr.release(request_id)
        self._draft_ctx.pop(request_id, None)
        self._gens.pop(request_id, None)
        if self._mtp is not None:
            self._mtp.release(request_id)

    def _run_step(self, ctxs: list[Any], plan: StepPlan) -> None:
        spec = [c for c in ctxs if _plain(c) and self._draft_budget(c) >= 1]
        proposals = None
        if self._lookup is not None:  # n-gram draft: requests without a match decode plainly
            lo, hi = self._lookup
            proposals = {c.request_id: ngram_proposal(c.tokens[:c.end_idx], self._draft_budget(c), lo, hi)
                         for c in spec}
            spec = [c for c in spec if proposals[c.request_id]]
        if self._mtp is not None:  # the MTP draft: requests whose hidden states it has
            spec = [c for c in spec if self._mtp.ready(c)]
        rest = [c for c in ctxs if c not in spec]
        if rest:
            self._step(rest, plan)
        if spec:
            self._speculate(spec, proposals)

    def _step(self, ctxs: list[Any], plan: StepPlan) -> None:
        super()._step(ctxs, plan)
        if self._mtp is not None:
            self._mtp.record(ctxs)

    def _draft_budget(self, c: Any) -> int:
        """Draft tokens a request may take this round: room for them and the bonus token within its
        ``max_length``, and no more than the target model allows (``draft_token_limit``: Phi-3 LongRoPE
        keeps a verification step on one side of the original context); 0: a plain step."""
        k = min(self.num_speculative_tokens, c.max_length - c.end_idx - 1)
        cap = self._pipeline_model.draft_token_limit(c)
        return max(0, k if cap is None else min(k, cap))

    # ------------------------------------------------------------ one speculative round
    def _draft_context(self, c: Any) -> Any:
        d = self._draft_ctx.get(c.request_id)
        if d is None:
            from max.pipelines.core import TextContext

            d = TextContext(request_id=c.request_id, max_length=c.max_length, tokens=np.array(c.prompt_tokens),
                            sampling_params=c.sampling_params, ignore_eos=True)
            self._draft_ctx[c.request_id] = d
            if not self._draft.kv_manager.contains(c.request_id):
                self._draft.kv_manager.external_claim(c.request_id)
        # the draft sees the target's tokens; its valid KV prefix stays as it is
        E = c.end_idx
        d._grow(E + self.num_speculative_tokens + 1)
        d.tokens[:E] = c.tokens[:E]
        d.set_token_indices(start_idx=min(d.start_idx, E - 1), active_idx=E, end_idx=E)
        return d

    def _draft_step(self, ds: list[Any]) -> torch.Tensor:
        mgr = self._draft.kv_manager
        self._draft.prepare_contexts(ds)
        kv = mgr.fetch(ds, 1)
        out = self._draft.execute(self._draft.prepare_initial_token_inputs(ds, kv))
        return out.logits.float()

    def _generator(self, c: Any) -> torch.Generator:
        g = self._gens.get(c.request_id)
        if g is None:
            g = self._generators.get(c.request_id, c.sampling_params.seed)
            self._gens[c.request_id] = g
        return g

    def _speculate(self, ctxs: list[Any], proposals: Optional[dict[str, list[int]]] = None) -> None:
        if proposals is not None:  # the n-gram draft's tokens: deterministic proposals (q one-hot)
            ds = None
            drafts = [list(proposals[c.request_id]) for c in ctxs]
            qs: list[list[Any]] = [[None] * len(d) for d in drafts]
        elif self._mtp is not None:
            ds = None
            ks = [max(1, self._draft_budget(c)) for c in ctxs]
            drafts, qs = self._mtp.propose(ctxs, ks, self.sample_draft_logits)
        else:
            ds = [self._draft_context(c) for c in ctxs]
            drafts, qs = self.generate_draft_tokens(ctxs, self.num_speculative_tokens, ds)
        first_rejected, recovered, bonus = self.verify_draft_tokens_with_target_model(
            ds, ctxs, [len(d) for d in drafts], drafts, qs)
        self.update_contexts(ctxs, first_rejected, recovered, bonus, drafts, [len(d) for d in drafts])
        if self._mtp is not None:
            self._mtp.record(ctxs)
        if ds is not None:
            for c, d, n_acc in zip(ctxs, ds, first_rejected):  # the draft's KV stays valid up to the accepted prefix
                valid = min(d.start_idx, self._round_end[c.request_id] + n_acc)
                d.set_token_indices(start_idx=valid, active_idx=valid, end_idx=valid)
        self._pipeline_model.kv_manager.step(ctxs)

    # ------------------------------------------------------------ the round's parts (MAX's method names)
    def generate_draft_tokens(self, batch: list[Any], num_steps: int, model_inputs: Any = None
                              ) -> tuple[list[list[int]], list[list[torch.Tensor]]]:
        """Run the draft model ``num_steps`` times (fewer for a request near its ``max_length``) over the
        target contexts ``batch``; ``model_inputs``: the draft contexts (made from ``batch`` when None).
        Returns each request's proposals and the draft distribution each was drawn from."""
        ds = list(model_inputs) if model_inputs is not None else [self._draft_context(c) for c in batch]
        ks = [max(1, min(int(num_steps), self._draft_budget(c))) for c in batch]
        drafts: list[list[int]] = [[] for _ in batch]
        qs: list[list[torch.Tensor]] = [[] for _ in batch]
        for step in range(max(ks)):
            idx = [i for i in range(len(batch)) if step < ks[i]]
            logits = self._draft_step([ds[i] for i in idx])
            toks, probs = self.sample_draft_logits([batch[i] for i in idx], logits)
            for row, i in enumerate(idx):
                drafts[i].append(toks[row])
                qs[i].append(probs[row])
                ds[i].update(toks[row])
            self._draft.kv_manager.step([ds[i] for i in idx])
        return drafts, qs

    def sample_draft_logits(self, batch: list[Any], model_outputs: Any, prev_tokens: Any = None,
                            prev_logits: Any = None, top_k: Any = None, max_k: Any = None, temperature: Any = None,
                            top_p: Any = None, seed: Any = None) -> tuple[list[int], list[torch.Tensor]]:
        """Draw one token per row of the draft's ``model_outputs`` (logits ``[len(batch), vocab]``, or a
        ``ModelOutputs``) from the request's distribution (its sampling parameters; ``top_k``,
        ``temperature``, ``top_p``, ``seed`` override them for every row, ``max_k`` caps ``top_k``);
        greedy requests take the argmax.  Appends to ``prev_tokens`` / ``prev_logits`` (per-row lists)
        when given.  Returns the tokens and their distributions."""
        import dataclasses

        logits = getattr(model_outputs, "logits", model_outputs)
        logits = logits.float() if isinstance(logits, torch.Tensor) else torch.as_tensor(np.asarray(logits)).float()
        over = {k: v for k, v in (("top_k", top_k), ("temperature", temperature), ("top_p", top_p), ("seed", seed))
                if v is not None}
        if max_k is not None:
            over["top_k"] = min(int(over.get("top_k", max_k)), int(max_k))
        toks: list[int] = []
        probs: list[torch.Tensor] = []
        for row, c in enumerate(batch):
            params = dataclasses.replace(c.sampling_params, **over) if over else c.sampling_params
            q = token_probabilities(logits[row:row + 1], params)[0]
            t = int(q.argmax()) if params.is_greedy else int(torch.multinomial(q, 1, generator=self._generator(c))[0])
            toks.append(t)
            probs.append(q)
            if prev_tokens is not None:
                prev_tokens[row].append(t)
            if prev_logits is not None:
                prev_logits[row].append(q)
        return toks, probs

    def verify_draft_tokens_with_target_model(self, draft_inputs: Any, context_batch: list[Any],
                                              num_draft_tokens_generated: Any, draft_tokens: list[list[int]],
                                              draft_logits: list[list[torch.Tensor]], merged_draft_tokens: Any = None,
                                              merged_draft_offsets: Any = None, all_draft_logits: Any = None
                                              ) -> tuple[list[int], list[Optional[int]], list[Optional[int]]]:
        """Score ``[last token, d_1 .. d_k]`` of every request with the target model in one step and run the
        acceptance test against the draft distributions ``draft_logits``.  Returns, per request, the index
        of the first rejected draft (= the number accepted), the token drawn in its place (None when all
        were accepted) and the bonus token (None unless all were accepted)."""
        ctxs = context_batch
        counts = [int(n) for n in num_draft_tokens_generated]
        mgr = self._pipeline_model.kv_manager
        saved = []
        for c, dr, n in zip(ctxs, draft_tokens, counts):
            E = c.end_idx
            dr = dr[:n]
            saved.append((c.start_idx, c.active_idx, E))
            c._grow(E + len(dr))
            c.tokens[E:E + len(dr)] = dr
            c.set_token_indices(start_idx=E - 1, active_idx=E + len(dr), end_idx=E + len(dr))
        self._pipeline_model.prepare_contexts(ctxs)  # may move a start_idx back (recompute): rows are counted after it
        kv = mgr.fetch(ctxs, 1)
        lens = [c.active_length for c in ctxs]  # after the fetch: the prefix cache may advance a start_idx
        out = self._pipeline_model.execute(self._pipeline_model.prepare_initial_token_inputs(ctxs, kv))
        logits = out.logits.float()
        pos = 0
        first_rejected: list[int] = []
        recovered: list[Optional[int]] = []
        bonus: list[Optional[int]] = []
        self._round_end = {}
        for i, c in enumerate(ctxs):
            n = counts[i] + 1
            rows = logits[pos + lens[i] - n:pos + lens[i]]
            pos += lens[i]
            s, a, e = saved[i]
            c.set_token_indices(start_idx=s, active_idx=a, end_idx=e)
            self._round_end[c.request_id] = e
            accepted, nxt = self._verify(c, draft_tokens[i][:counts[i]], draft_logits[i], rows)
            first_rejected.append(len(accepted))
            all_in = len(accepted) == counts[i]
            recovered.append(None if all_in else nxt)
            bonus.append(nxt if all_in else None)
        return first_rejected, recovered, bonus

    def update_contexts(self, context_batch: list[Any], first_rejected_tokens: list[int],
                        recovered_tokens: list[Optional[int]], bonus_tokens: list[Optional[int]],
                        draft_tokens: list[list[int]], num_draft_tokens_generated: Any) -> None:
        """Append each request's accepted drafts (``draft_tokens[i][:first_rejected_tokens[i]]``) and then its
        recovered or bonus token, stopping when the request finishes; counts them in :attr:`metrics`."""
        for i, c in enumerate(context_batch):
            n_acc = int(first_rejected_tokens[i])
            nxt = recovered_tokens[i] if recovered_tokens[i] is not None else bonus_tokens[i]
            self.metrics.draft_tokens_proposed += int(num_draft_tokens_generated[i])
            self.metrics.draft_tokens_accepted += n_acc
            self.metrics.rounds += 1
            for t in [*draft_tokens[i][:n_acc], nxt]:
                c.update(int(t))
                self.metrics.tokens_generated += 1
                if c.is_done:
                    break

    def build_response(self, context_batch: Any) -> dict[str, Any]:
        """``{request_id: TextGenerationOutput}`` of the contexts' tokens not yet returned."""
        items = context_batch.items() if isinstance(context_batch, dict) else \
            ((c.request_id, c) for c in context_batch)
        return {rid: ctx.to_generation_output() for rid, ctx in items}

    def _verify(self, c: Any, drafts: list[int], qs: list[Any], rows: torch.Tensor
                ) -> tuple[list[int], int]:
        params = c.sampling_params
        p = token_probabilities(rows, params)
        accepted: list[int] = []
        if params.is_greedy:
            for i, t in enumerate(drafts):
                best = int(rows[i].argmax())
                if best != t:
                    return accepted, best
                accepted.append(t)
            return accepted, int(rows[len(drafts)].argmax())
        g = self._generator(c)
        for i, t in enumerate(drafts):
            u = float(torch.rand(1, generator=g)[0])
            q = qs[i] if qs[i] is not None else torch.nn.functional.one_hot(torch.tensor(t), p.shape[-1]).float()
            if u < min(1.0, float(p[i, t]) / max(float(q[t]), 1e-20)):
                accepted.append(t)
                continue
            resid = (p[i] - q).clamp_min(0)
            dist = resid if float(resid.sum()) > 0 else p[i]
            return accepted, int(torch.multinomial(dist / dist.sum(), 1, generator=g)[0])
        return accepted, int(torch.multinomial(p[len(drafts)], 1, generator=g)[0])


def _vocab_size(model: Any) -> Optional[int]:
    cfg = getattr(model, "config", None)
    v = getattr(cfg, "vocab_size", None)
    return int(v) if v is not None else None
