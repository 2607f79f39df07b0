"""Tokenizer for embeddings models (BERT, MPNet, decoder embedders): ``TextTokenizer`` without generation limits.

BERT-style tokenizers have no EOS token; ``eos`` falls back to ``[SEP]`` (then the
pad token) so the pipeline registry can build the pipeline.  ``new_context``
encodes the prompt with the special tokens (``[CLS] ... [SEP]``) and rejects a
prompt longer than ``max_length`` (the model's ``max_position_embeddings`` unless
the pipeline config sets ``max_length``) instead of truncating it.
"""

from __future__ import annotations

from typing import Any

from max.interfaces.errors import EmptyPrompt, InvalidRequest
from max.pipelines.core import TextContext
from max.pipelines.lib.tokenizer import TextTokenizer


class EmbeddingsTokenizer(TextTokenizer):
    """``TextTokenizer`` for embeddings models (see the module docstring)."""

    @property
    def eos(self) -> int:
        d = self.delegate
        for tok in (d.eos_token_id, d.sep_token_id, d.pad_token_id):
            if tok is not None:
                return int(tok)
        return 0

    async def new_context(self, request: Any) -> TextContext:
        """A ``TextContext`` holding the request's prompt tokens (``max_length`` = prompt length)."""
        if getattr(request, "messages", None):
            raise InvalidRequest("an embeddings model takes a prompt, not chat messages",
                                 param="input", where=f"request {request.request_id}")
        prompt = request.prompt
        if prompt is None:
            raise EmptyPrompt("no prompt", param="input", where=f"request {request.request_id}")
        ids = self.encode_sync(prompt, add_special_tokens=True)  # ValueError above max_length
        if len(ids) == 0:
            raise EmptyPrompt("the prompt encodes to no tokens",
                              param="input", where=f"request {request.request_id}")
        return TextContext(request_id=request.request_id, max_length=len(ids), tokens=ids,
                           model_name=getattr(request, "model_name", "") or "")
