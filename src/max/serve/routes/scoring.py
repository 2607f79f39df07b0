"""``POST /v1/rerank`` (Cohere / Jina / vLLM shape) and ``POST /v1/score`` (vLLM shape): relevance scores
of text pairs.  (Only under ``/v1/``, where the API key, body limit and drain rules apply.)

What scores a pair depends on the served model:

- a cross-encoder (``BertForSequenceClassification``, ``XLMRobertaForSequenceClassification``) reads
  the pair as one input; the score is the sigmoid of its logit (softmax class 1 with two labels);
- an embeddings model: the cosine similarity of the two embeddings (as vLLM does);
- a text-generation model: Qwen3-Reranker-style causal scoring.  The pair is written into the
  reranker's prompt (a system line asking for "yes" or "no", then ``<Instruct>``, ``<Query>`` and
  ``<Document>``, then the assistant turn with an empty think block) and the score is
  ``softmax([logit("no"), logit("yes")])[1]`` at the prompt's last position.  Both log probabilities
  come from the shared scheduler: one single-token request per answer, each forced to its answer
  with ``logit_bias`` (the reported log probability is the raw model's, before the bias).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Optional, Union

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from max.serve.invalid import FieldMap, expect
from max.serve.jobs import collect, start_job
from max.serve.openai_schemas import APIError, CompletionRequest, _Body, parse
from max.serve.state import AppState, parse_body

router = APIRouter()

RERANK_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
RERANK_SYSTEM = ("Judge whether the Document meets the requirements based on the Query and the Instruct provided. "
                 'Note that the answer can only be "yes" or "no".')


def causal_prompt(query: str, document: str, instruction: Optional[str] = None) -> str:
    """The Qwen3-Reranker prompt of one pair (ChatML; the answer is the next token)."""
    return (f"<|im_start|>system\n{RERANK_SYSTEM}<|im_end|>\n<|im_start|>user\n"
            f"<Instruct>: {instruction or RERANK_INSTRUCTION}\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n")


class RerankRequest(_Body):
    model: Optional[str] = None
    query: str
    documents: list[Union[str, dict[str, Any]]] = Field(min_length=1)
    top_n: Optional[int] = Field(default=None, ge=1)
    return_documents: bool = True
    instruction: Optional[str] = None  # causal rerankers only: the <Instruct> line


class ScoreRequest(_Body):
    model: Optional[str] = None
    text_1: Union[str, list[str]]
    text_2: Union[str, list[str]]
    instruction: Optional[str] = None


def _documents(docs: list[Union[str, dict[str, Any]]]) -> list[str]:
    out = []
    for i, d in enumerate(docs):
        if isinstance(d, dict):
            d = d.get("text")
        if not isinstance(d, str):
            raise APIError(400, f"'documents[{i}]' must be a string or {{'text': string}}", param=f"documents[{i}]",
                           code="invalid_value")
        out.append(d)
    return out


def _pairs(text_1: Union[str, list[str]], text_2: Union[str, list[str]]) -> list[tuple[str, str]]:
    """vLLM's pairing: one text_1 against every text_2, or two lists of the same length zipped."""
    a = [text_1] if isinstance(text_1, str) else list(text_1)
    b = [text_2] if isinstance(text_2, str) else list(text_2)
    if not a or not b:
        raise APIError(400, "text_1 and text_2 must not be empty", param="text_1" if not a else "text_2",
                       code="invalid_value")
    if len(a) == 1:
        a = a * len(b)
    if len(a) != len(b):
        raise APIError(400, f"text_1 has {len(a)} texts and text_2 {len(b)}: give one text_1, or as many as text_2",
                       param="text_2", code="invalid_value")
    return list(zip(a, b))


async def _scores(state: AppState, request: Request, pairs: list[tuple[str, str]], instruction: Optional[str],
                  path: str, model: Optional[str]) -> tuple[np.ndarray, int]:
    if state.embedder is not None:
        expect(request, FieldMap(known=frozenset()))  # the pairs as a whole: no field named
        return await state.embedder.score(pairs)
    return await _causal_scores(state, request, pairs, instruction, path, model)


def _answer_token(tok: Any, word: str) -> int:
    delegate = getattr(tok, "delegate", None)
    ids = None
    if delegate is not None:
        t = delegate.convert_tokens_to_ids(word)
        unk = getattr(delegate, "unk_token_id", None)
        ids = t if isinstance(t, int) and t != unk else None
    if ids is None:
        raise APIError(400, f"this model's vocabulary has no single '{word}' token: it cannot score pairs the "
                       "Qwen3-Reranker way (serve a cross-encoder or a Qwen3-Reranker checkpoint)",
                       code="model_not_supported")
    return int(ids)


async def _causal_scores(state: AppState, request: Request, pairs: list[tuple[str, str]],
                         instruction: Optional[str], path: str, model: Optional[str]) -> tuple[np.ndarray, int]:
    gen = state.need_generator(path)
    yes, no = _answer_token(gen.tokenizer, "yes"), _answer_token(gen.tokenizer, "no")
    prompts = [causal_prompt(q, d, instruction) for q, d in pairs]
    rid = f"score-{uuid.uuid4().hex}"
    lps = []
    for name, tok in (("yes", yes), ("no", no)):
        req = parse(CompletionRequest, {"model": model, "prompt": prompts, "max_tokens": 1, "temperature": 0.0, "logprobs": 1,
                                        "logit_bias": {str(tok): 100}, "ignore_eos": True})
        job = await start_job(state, gen, request, f"{rid}-{name}", [dict(prompt=p) for p in prompts], req, 1,
                              logprobs=1, echo=False, chat_extra={})
        await collect(state, job)
        got = []
        for c in job.choices:
            if not c.tokens or c.tokens[0] != tok or not c.logprobs:
                raise APIError(500, f"the '{name}' token could not be scored", code="scoring_error")
            got.append(float(c.logprobs[0].token_log_probabilities[0]))
        lps.append(np.asarray(got, dtype=np.float64))
        n_tokens = job.prompt_tokens
    lp_yes, lp_no = lps
    return 1.0 / (1.0 + np.exp(lp_no - lp_yes)), int(n_tokens)


def _usage(n_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": n_tokens, "total_tokens": n_tokens}


@router.post("/v1/rerank")
async def rerank(request: Request) -> JSONResponse:
    state, req = await parse_body(request, RerankRequest)
    docs = _documents(req.documents)
    scores, n_tokens = await _scores(state, request, [(req.query, d) for d in docs], req.instruction, "/v1/rerank",
                                     req.model)
    order = sorted(range(len(docs)), key=lambda i: -scores[i])[: req.top_n or len(docs)]
    results = []
    for i in order:
        r: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
        if req.return_documents:
            r["document"] = {"text": docs[i]}
        results.append(r)
    state.metrics.prompt_tokens.inc(n_tokens)
    return JSONResponse({"id": f"rerank-{uuid.uuid4().hex}", "model": state.model_name, "results": results,
                         "usage": _usage(n_tokens)})


@router.post("/v1/score")
async def score(request: Request) -> JSONResponse:
    state, req = await parse_body(request, ScoreRequest)
    pairs = _pairs(req.text_1, req.text_2)
    scores, n_tokens = await _scores(state, request, pairs, req.instruction, "/v1/score", req.model)
    state.metrics.prompt_tokens.inc(n_tokens)
    return JSONResponse({"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                         "model": state.model_name,
                         "data": [{"index": i, "object": "score", "score": float(s)} for i, s in enumerate(scores)],
                         "usage": _usage(n_tokens)})
