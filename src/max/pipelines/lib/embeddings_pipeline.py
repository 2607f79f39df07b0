"""``EmbeddingsPipeline``: sentence embeddings from an encoder model (BERT family).

``execute(EmbeddingsGenerationInputs)`` embeds every request of the batch and
returns ``{request_id: EmbeddingsGenerationOutput}``.  Requests of different
lengths are sorted by length and run in padded batches of similar lengths (at
most ``max_batch_size`` rows (by default the embeddings entry of
``MAX_BATCH_SIZE_DEFAULTS`` in ``max.pipelines.lib.config``), and about ``prefill_chunk_size``
padded tokens per model call), so one request never waits on a long one's
padding.  With ``pool_embeddings=True`` (the default) each output is the
L2-normalised mean of the last hidden states over the request's tokens
(float32 ``[hidden]``); with ``False`` it is the per-token hidden states
(``[tokens, hidden]``).

Length limit: the model's ``max_position_embeddings`` (or the config's
``max_length`` when set).  A longer input is **rejected** with a ValueError
naming the input, its token count and the limit: silently embedding only the
first 512 tokens of a document would return a vector that does not represent
it.  ``encode_texts(..., truncate=True)`` opts in to truncation (the tokenizer
keeps ``[CLS]`` and ``[SEP]`` and drops tokens from the end, as
``transformers`` and sentence-transformers do).

``encode_texts(texts)`` is the convenience entry point the OpenAI-style
``/v1/embeddings`` route uses: ``(float32 array [n, hidden], prompt tokens)``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from max.interfaces.errors import InvalidRequest, InvalidRequestType, PromptTooLong
from max.interfaces import EmbeddingsGenerationInputs, EmbeddingsGenerationOutput, Pipeline, PipelineTask
from max.pipelines.lib.config import batch_size_for

__all__ = ["EmbeddingsPipeline", "load_embeddings_pipeline"]

def _is_embeddings_model(pipeline_model: Any) -> bool:
    task = getattr(pipeline_model, "task", None)
    try:
        return task is not None and PipelineTask(task) is PipelineTask.EMBEDDINGS_GENERATION
    except ValueError:
        return False


class EmbeddingsPipeline(Pipeline):
    """Embeddings for batches of contexts with one encoder ``PipelineModel`` (see the module docstring)."""

    def __init__(self, pipeline_config: Any, pipeline_model: type, eos_token_id: int, weight_adapters: Any,
                 tokenizer: Any) -> None:
        if not _is_embeddings_model(pipeline_model):
            name = getattr(pipeline_model, "__name__", type(pipeline_model).__name__)
            raise ValueError(
                f"EmbeddingsPipeline: {name} is a text-generation model (it predicts next tokens, it does not "
                f"produce embeddings) for {pipeline_config.model_config.model_path!r}; use an embeddings model "
                "(a BertModel checkpoint such as all-MiniLM-L6-v2) or TextGenerationPipeline / LLM for this one")
        t0 = time.perf_counter()
        self._pipeline_config = pipeline_config
        self._tokenizer = tokenizer
        self._eos_token_id = eos_token_id
        from max.pipelines.lib.pipeline import build_pipeline_model

        try:
            self._devices, self._pipeline_model = build_pipeline_model(pipeline_config, pipeline_model,
                                                                       weight_adapters, None)
        except ValueError as e:
            raise ValueError(f"EmbeddingsPipeline: {e}") from None
        self._max_rows = batch_size_for(pipeline_config.max_batch_size, PipelineTask.EMBEDDINGS_GENERATION)
        self._lock = threading.Lock()
        self.load_seconds = time.perf_counter() - t0

    # ---------------------------------------------------------------- properties
    @property
    def pipeline_config(self) -> Any:
        return self._pipeline_config

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def pipeline_model(self) -> Any:
        return self._pipeline_model

    @property
    def kv_managers(self) -> list[Any]:
        return []

    @property
    def max_seq_len(self) -> int:
        """The longest input, in tokens (special tokens included), the model embeds."""
        return int(self._pipeline_model.max_seq_len)

    @property
    def embedding_dim(self) -> int:
        return int(self._pipeline_model.hidden_size)

    @property
    def pool_embeddings(self) -> bool:
        return bool(self._pipeline_model.pool_embeddings)

    @property
    def cross_encoder(self) -> bool:
        """Whether the model is a cross-encoder (it scores text pairs: :meth:`score_pairs`)."""
        return bool(getattr(self._pipeline_model, "cross_encoder", False))

    # ---------------------------------------------------------------- API
    def execute(self, inputs: EmbeddingsGenerationInputs) -> dict[str, EmbeddingsGenerationOutput]:
        """Embed every context of ``inputs.batch`` (ValueError for one longer than ``max_seq_len``)."""
        if isinstance(inputs, dict):
            inputs = EmbeddingsGenerationInputs([inputs])
        batch = inputs.batch
        if not batch:
            return {}
        from max.pipelines.architectures.common.encoder import tokens_of as _tokens_of

        rows = []
        for rid, ctx in batch.items():
            ids = _tokens_of(ctx)
            self._check_row(ids, f"request {rid!r}")
            rows.append(ids)
        outs = self._embed(rows)
        return {rid: EmbeddingsGenerationOutput(embeddings=o) for rid, o in zip(batch, outs)}

    def release(self, request_id: str) -> None:
        """Nothing to free: an embeddings request keeps no state between calls."""

    def encode_texts(self, texts: Sequence[str | Sequence[int]], *, truncate: bool = False
                     ) -> tuple[np.ndarray, int]:
        """Embeddings of ``texts`` as a float32 ``[len(texts), embedding_dim]`` array, and the
        number of prompt tokens (special tokens included) they used.

        Items may be strings (tokenised with ``[CLS]``/``[SEP]``) or token-id
        sequences (used as given).  An input longer than ``max_seq_len`` tokens
        raises ValueError unless ``truncate`` (then it is cut to ``max_seq_len``).
        """
        if isinstance(texts, (str, bytes)):
            raise InvalidRequestType("expected a list of strings, got a single string (wrap it in a list)",
                                     param="input", where="encode_texts")
        texts = list(texts)
        if not texts:
            raise InvalidRequest("the input list is empty; pass at least one text", param="input",
                                 where="encode_texts")
        if self.cross_encoder:
            raise ValueError("encode_texts: this model is a cross-encoder (a reranker): it scores text pairs "
                             "(score_pairs, /v1/rerank, /v1/score) and produces no embeddings")
        if not self.pool_embeddings:
            raise ValueError("encode_texts: the pipeline was built with pool_embeddings=False (per-token "
                             "outputs); use execute() for those, or build it with pool_embeddings=True")
        rows = self._tokenize(texts, truncate)
        for i, ids in enumerate(rows):
            self._check_row(ids, f"input {i}")
        vecs = self._embed(rows)
        return np.stack(vecs).astype(np.float32, copy=False), int(sum(len(r) for r in rows))

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> tuple[np.ndarray, int]:
        """Relevance scores of ``(query, document)`` pairs as float64 ``[len(pairs)]`` and the number of
        prompt tokens they used.

        A cross-encoder reads each pair as one input (``[CLS] a [SEP] b [SEP]``, segment ids 0 / 1) and
        scores it as sentence-transformers' ``CrossEncoder`` does: the sigmoid of its logit (one label),
        or the softmax probability of class 1 (two labels).  An embeddings model scores the cosine
        similarity of the two texts' embeddings.  A pair longer than ``max_seq_len`` raises ValueError.
        """
        pairs = list(pairs)
        if not pairs:
            raise InvalidRequest("no pairs to score", where="score_pairs")
        for i, p in enumerate(pairs):
            if not (isinstance(p, (tuple, list)) and len(p) == 2 and all(isinstance(t, str) for t in p)):
                raise InvalidRequestType(f"pair {i} must be two strings", where="score_pairs")
        if not self.cross_encoder:
            texts = sorted({t for p in pairs for t in p})
            vecs, n_tokens = self.encode_texts(texts)
            at = {t: i for i, t in enumerate(texts)}
            norms = np.maximum(np.linalg.norm(vecs.astype(np.float64), axis=1), 1e-12)
            scores = [float(np.dot(vecs[at[a]], vecs[at[b]]) / (norms[at[a]] * norms[at[b]])) for a, b in pairs]
            return np.asarray(scores, dtype=np.float64), n_tokens
        delegate = getattr(self._tokenizer, "delegate", None)
        if delegate is None:
            raise InvalidRequest("the model's tokenizer cannot encode text pairs", where="score_pairs")
        enc = delegate([a for a, _ in pairs], [b for _, b in pairs], add_special_tokens=True)
        types = enc.get("token_type_ids")
        rows: list[Any] = []
        for i, ids in enumerate(enc["input_ids"]):
            ids = np.asarray(ids, dtype=np.int64)
            self._check_row(ids, f"pair {i}")
            rows.append((ids, None if types is None else np.asarray(types[i], dtype=np.int64)))
        logits = np.stack(self._embed(rows)).astype(np.float64)
        if logits.shape[1] == 1:
            scores = 1.0 / (1.0 + np.exp(-logits[:, 0]))
        else:
            z = np.exp(logits - logits.max(axis=1, keepdims=True))
            scores = z[:, 1] / z.sum(axis=1)
        return scores, int(sum(len(r[0]) for r in rows))

    # ---------------------------------------------------------------- internals
    def _tokenize(self, texts: list[Any], truncate: bool) -> list[np.ndarray]:
        strs = [i for i, t in enumerate(texts) if isinstance(t, str)]
        rows: list[Optional[np.ndarray]] = [None] * len(texts)
        for i, t in enumerate(texts):
            if isinstance(t, str):
                continue
            if isinstance(t, bytes) or not hasattr(t, "__len__"):
                raise InvalidRequestType(f"input {i} must be a str or a sequence of token ids, got "
                                         f"{type(t).__name__}", param="input", where="encode_texts")
            ids = np.asarray(list(t), dtype=np.int64).reshape(-1)
            if ids.size == 0:
                raise InvalidRequest(f"input {i} is an empty token list", param="input", where="encode_texts")
            rows[i] = ids[: self.max_seq_len] if truncate else ids
        if strs:
            delegate = getattr(self._tokenizer, "delegate", None)
            batch = [texts[i] for i in strs]
            if delegate is not None:
                kw: dict[str, Any] = dict(truncation=True, max_length=self.max_seq_len) if truncate else {}
                enc = delegate(batch, add_special_tokens=True, **kw)["input_ids"]
            else:  # a PipelineTokenizer without a HF delegate
                enc = [self._tokenizer.encode_sync(t, add_special_tokens=True) for t in batch]
            for i, ids in zip(strs, enc):
                rows[i] = np.asarray(ids, dtype=np.int64)
        return rows  # type: ignore[return-value]

    def _check_row(self, ids: np.ndarray, who: str) -> None:
        if ids.size == 0:
            raise InvalidRequest(f"{who}: no tokens to embed", param="input")
        if ids.size > self.max_seq_len:
            raise PromptTooLong(
                f"{who} has {ids.size} tokens, more than this model's maximum input length of {self.max_seq_len} "
                "tokens; shorten it (or split it), or truncate it to embed only its first "
                f"{self.max_seq_len} tokens (truncate=True; --truncate on the command line)",
                length=int(ids.size), limit=self.max_seq_len, param="input")

    def _embed(self, rows: list[Any]) -> list[np.ndarray]:
        """Outputs for token rows (any lengths; a cross-encoder's rows are ``(ids, token types)``), run as
        padded batches of similar lengths."""

        def size(r: Any) -> int:
            return len(r[0]) if isinstance(r, tuple) else len(r)

        order = sorted(range(len(rows)), key=lambda i: -size(rows[i]))
        budget = max(int(self._pipeline_config.prefill_chunk_size), self.max_seq_len)
        out: list[Optional[np.ndarray]] = [None] * len(rows)
        start = 0
        model = self._pipeline_model
        with self._lock:
            while start < len(order):
                width = size(rows[order[start]])  # the longest row of this batch (sorted descending)
                n = max(1, min(self._max_rows, budget // width, len(order) - start))
                idx = order[start: start + n]
                inputs = model.prepare_initial_token_inputs([rows[i] for i in idx])
                res = model.execute(inputs).logits.detach().to("cpu").float().numpy()
                for j, i in enumerate(idx):
                    whole = model.pool_embeddings or getattr(model, "cross_encoder", False)
                    out[i] = res[j].copy() if whole else res[j, : size(rows[i])].copy()
                start += n
        return out  # type: ignore[return-value]


def load_embeddings_pipeline(model: Any = None, **config_kwargs: Any) -> EmbeddingsPipeline:
    """An ``EmbeddingsPipeline`` for ``model`` (a ``PipelineConfig``, or a model folder path
    plus ``PipelineConfig`` keyword options such as ``devices`` or ``max_batch_size``).

    ValueError when the model is not an embeddings model (e.g. a causal LM).
    """
    from max.pipelines.lib.config import PipelineConfig
    from max.pipelines.lib.registry import PIPELINE_REGISTRY, register_all_models

    if isinstance(model, PipelineConfig):
        if config_kwargs:
            raise TypeError("load_embeddings_pipeline: pass either a PipelineConfig or keyword options, not both")
        cfg = model
    else:
        if model is not None:
            config_kwargs["model_path"] = str(model) if isinstance(model, Path) else model
        cfg = PipelineConfig(**config_kwargs)
    register_all_models()
    arch = PIPELINE_REGISTRY._require(cfg)
    if arch.task is not PipelineTask.EMBEDDINGS_GENERATION:
        embedders = sorted(a.name for a in PIPELINE_REGISTRY.architectures.values()
                           if a.task is PipelineTask.EMBEDDINGS_GENERATION)
        raise ValueError(
            f"{cfg.model_config.model_path}: {arch.name} is a {arch.task.value.replace('_', '-')} model and cannot "
            f"produce embeddings; use an embeddings model (supported architectures: {', '.join(embedders)})")
    _, pipeline = PIPELINE_REGISTRY.retrieve(cfg, task=PipelineTask.EMBEDDINGS_GENERATION)
    return pipeline
