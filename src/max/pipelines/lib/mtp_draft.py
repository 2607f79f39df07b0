"""The multi-token prediction (MTP) draft of speculative decoding: a model's own MTP layer (DeepSeek-V3's,
``architectures/deepseek_v3/mtp.py``) proposes the draft tokens from the target's hidden states.

The target model, built for it, returns the hidden state of every position it computes; they are kept
per request (``record``) until the MTP layer has consumed them.  MTP position ``j`` reads ``(h_j,
t_{j+1})`` -- the target's hidden state at ``j`` and the token after it -- and predicts ``t_{j+2}``.
With ``E`` tokens known, a round first catches the layer up on positions ``s .. E-2`` (``s``: the
positions its cache holds), whose last row proposes ``d_1 = t_E``; each further step feeds the layer's
own normed output and the token just proposed at the next position (one MTP layer, applied ``k``
times).  Only the entries made from target hidden states stay valid after the round (``E - 1``
positions); the others are overwritten by the next round's catch-up.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

__all__ = ["MTPDraft"]


class MTPDraft:
    """The MTP draft's per-request state around the target model's ``mtp_draft`` (see the module
    docstring)."""

    def __init__(self, target_model: Any) -> None:
        mtp = getattr(target_model, "mtp_draft", None)
        if mtp is None:
            arch = getattr(getattr(target_model, "config", None), "architecture", type(target_model).__name__)
            raise ValueError(f"speculative_method 'mtp': {arch} has no multi-token prediction layer to draft with "
                             "(supported: DeepseekV3ForCausalLM checkpoints with num_nextn_predict_layers >= 1)")
        self.target = target_model
        self.mtp = mtp
        self.kv_manager = mtp.kv_manager
        self._hidden: dict[str, tuple[int, torch.Tensor]] = {}
        """request -> (first position, target hidden rows from there) not yet consumed."""
        self._ctx: dict[str, Any] = {}

    def release(self, request_id: str) -> None:
        self._hidden.pop(request_id, None)
        self._ctx.pop(request_id, None)
        if self.kv_manager.contains(request_id):
            self.kv_manager.release(request_id)

    def record(self, ctxs: list[Any]) -> None:
        """Keep the hidden rows of the target's last call for the requests ``ctxs`` (updated after it):
        rows of positions below ``end_idx - 1`` (the others scored rejected drafts)."""
        rows, meta = self.target.last_hidden, self.target.last_rows
        if rows is None:
            return
        by_id = {c.request_id: c for c in ctxs}
        pos = 0
        for rid, start, n in meta:
            r, pos = rows[pos:pos + n], pos + n
            c = by_id.get(rid)
            if c is None:
                continue
            r = r[:max(0, min(n, int(c.end_idx) - 1 - start))]
            old = self._hidden.get(rid)
            if old is not None and old[0] <= start <= old[0] + old[1].shape[0]:
                r = torch.cat([old[1][:start - old[0]], r])
                start = old[0]
            self._hidden[rid] = (start, r.clone())

    def _first(self, c: Any) -> int:
        """The first position this round's catch-up computes."""
        d = self._ctx.get(c.request_id)
        return min(int(d.start_idx) if d is not None else 0, int(c.end_idx) - 2)

    def ready(self, c: Any) -> bool:
        """Whether the target's hidden states cover the positions the request's next round needs."""
        h = self._hidden.get(c.request_id)
        E = int(c.end_idx)
        return E >= 2 and h is not None and h[0] <= self._first(c) and h[0] + h[1].shape[0] >= E - 1

    def _context(self, c: Any) -> Any:
        from max.pipelines.core import TextContext

        d = self._ctx.get(c.request_id)
        E = int(c.end_idx)
        if d is None:
            d = TextContext(request_id=c.request_id, max_length=c.max_length, tokens=np.array(c.tokens[1:E]),
                            sampling_params=c.sampling_params, ignore_eos=True)
            d.set_token_indices(start_idx=0, active_idx=0, end_idx=0)
            self._ctx[c.request_id] = d
            if not self.kv_manager.contains(c.request_id):
                self.kv_manager.external_claim(c.request_id)
        return d

    def propose(self, ctxs: list[Any], ks: list[int],
                sample: Callable[[list[Any], torch.Tensor], tuple[list[int], list[torch.Tensor]]]
                ) -> tuple[list[list[int]], list[list[torch.Tensor]]]:
        """Up to ``ks[i]`` draft tokens for each request (all :meth:`ready`) and the distributions they were
        drawn from; ``sample(contexts, logits)`` draws one token per row."""
        ds, hidden = [], []
        for c in ctxs:
            s, E = self._first(c), int(c.end_idx)
            d = self._context(c)
            d._grow(E + max(ks) + 1)
            d.tokens[:E - 1] = c.tokens[1:E]  # position j's token: t_{j+1}
            d.set_token_indices(start_idx=s, active_idx=E - 1, end_idx=E - 1)
            p0, rows = self._hidden[c.request_id]
            hidden.append(rows[s - p0:E - 1 - p0])
            ds.append(d)
        drafts: list[list[int]] = [[] for _ in ctxs]
        qs: list[list[torch.Tensor]] = [[] for _ in ctxs]
        idx = list(range(len(ctxs)))
        h = torch.cat(hidden)
        for step in range(max(ks)):
            logits, out = self.mtp.run([ds[i] for i in idx], h)
            toks, probs = sample([ctxs[i] for i in idx], logits)
            keep = []
            for row, i in enumerate(idx):
                drafts[i].append(toks[row])
                qs[i].append(probs[row])
                ds[i].update(toks[row])  # the proposal is the next position's token
                if step + 1 < ks[i]:
                    keep.append(row)
            self.kv_manager.step([ds[i] for i in idx])
            idx = [idx[r] for r in keep]
            if not idx:
                break
            h = out[torch.tensor(keep, dtype=torch.long, device=out.device)]
        for c, d in zip(ctxs, ds):  # valid: the entries made from the target's hidden states
            E = int(c.end_idx)
            d.set_token_indices(start_idx=E - 1, active_idx=E - 1, end_idx=E - 1)
            p0, rows = self._hidden[c.request_id]
            self._hidden[c.request_id] = (E - 1, rows[E - 1 - p0:])
        return drafts, qs
