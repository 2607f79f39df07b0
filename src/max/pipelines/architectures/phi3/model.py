"""The Phi-3 pipeline model: the shared decoder with fused projections (GGUF RoPE is rotate-half).

LongRoPE models that may run sequences past ``original_max_position_embeddings`` choose the short or
long factors per request by its length (``common.layers._LengthSwitchedRope``);
:meth:`Phi3Model.prepare_contexts` recomputes a request that crosses that length, and
:meth:`Phi3Model.draft_token_limit` keeps speculative verification steps from crossing it.
"""

from __future__ import annotations

from typing import Any, Sequence

from max.pipelines.architectures.common.layers import longrope_switch_contexts
from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.pipelines.architectures.phi3.config import config_from_hf
from max.pipelines.architectures.phi3.weight_adapters import WEIGHT_ADAPTERS


class Phi3Model(DecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS

    def _switch_length(self) -> int | None:
        """``original_max_position_embeddings`` when the factors switch per request, else None."""
        sc = self.config.rope_scaling or {}
        if sc.get("rope_type") == "longrope" and self.max_seq_len > int(sc["original_max_position_embeddings"]):
            return int(sc["original_max_position_embeddings"])
        return None

    def prepare_contexts(self, ctxs: Sequence[Any]) -> None:
        """Called by the pipeline before it fetches the KV cache for a step (see the module docstring)."""
        orig = self._switch_length()
        if orig is not None:
            longrope_switch_contexts(ctxs, orig)

    def draft_token_limit(self, ctx: Any) -> int | None:
        """Draft tokens a speculative verification step may add to ``ctx`` (None: any): its rows must
        all be computed with one set of factors, as transformers computes each token with the factors
        of its own length -- so a request within the original context verifies no draft past it (it
        crosses in a plain step)."""
        orig = self._switch_length()
        if orig is None or ctx.end_idx > orig:
            return None
        return orig - ctx.end_idx
