"""``SpeechTokenGenerationPipeline`` (``PipelineTask.SPEECH_TOKEN_GENERATION``): a token model that writes speech
tokens, run like text generation (paged KV cache, continuous batching, the same sampling) over
:class:`~max.pipelines.core.TTSContext` s; each call's new tokens are appended to the context's speech tokens
(one block per call) for an audio decoder to consume."""

from __future__ import annotations

from typing import Any

from max.interfaces import TextGenerationInputs, TextGenerationOutput
from max.pipelines.lib.pipeline import TextGenerationPipeline

__all__ = ["SpeechTokenGenerationPipeline"]


class SpeechTokenGenerationPipeline(TextGenerationPipeline):
    def execute(self, inputs: TextGenerationInputs) -> dict[str, TextGenerationOutput]:
        outs = super().execute(inputs)
        for rid, ctx in inputs.batch.items():
            out = outs.get(rid)
            if out is not None and len(out.tokens) and hasattr(ctx, "update_speech_tokens"):
                ctx.update_speech_tokens(out.tokens)
        return outs

    def next_speech_tokens(self, batch: dict[str, Any], num_steps: int) -> dict[str, TextGenerationOutput]:
        """Generate up to ``num_steps`` more speech tokens for every unfinished context of ``batch``."""
        live = {rid: c for rid, c in batch.items() if not c.status.is_done}
        if not live:
            return {}
        steps = min(self.calculate_num_steps(num_steps, c) for c in live.values())
        return self.execute(TextGenerationInputs([live], steps))
