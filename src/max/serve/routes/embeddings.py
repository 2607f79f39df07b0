"""``POST /v1/embeddings``."""

from __future__ import annotations

import base64
from typing import Any, Union

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from max.serve.invalid import FieldMap, expect
from max.serve.openai_schemas import APIError, EmbeddingRequest
from max.serve.state import parse_body

router = APIRouter()

_INPUT = FieldMap(known=frozenset(), default="input")


@router.post("/v1/embeddings")
async def embeddings(request: Request) -> JSONResponse:
    state, req = await parse_body(request, EmbeddingRequest)
    embedder = state.embedder
    if embedder is None:
        raise APIError(400, f"the model '{state.model_name}' is a text generation model and does not serve "
                       "embeddings; use /v1/chat/completions or /v1/completions", param="model",
                       code="model_not_supported", keep=(state.model_name,))
    if embedder.cross_encoder:
        raise APIError(400, f"the model '{state.model_name}' is a cross-encoder (a reranker): it scores text pairs "
                       "and produces no embeddings; use /v1/rerank or /v1/score", param="model",
                       code="model_not_supported", keep=(state.model_name,))
    inp = req.input
    if isinstance(inp, str):
        texts: list[Any] = [inp]
    elif inp and all(isinstance(t, int) for t in inp):
        texts = [list(inp)]  # one input given as token ids
    else:
        texts = list(inp)
    if not texts:
        raise APIError(400, "input must not be empty", param="input")
    if any(len(t) == 0 for t in texts):
        raise APIError(400, "input strings / token lists must not be empty", param="input")
    expect(request, _INPUT)  # the tokenizer's checks (length, token ids) are about the input
    arr, n_tokens = await embedder.embed(texts)
    expect(request, None)
    if arr.ndim != 2 or arr.shape[0] != len(texts):
        raise APIError(500, f"the embeddings pipeline returned shape {arr.shape} for {len(texts)} inputs")
    if req.dimensions is not None:
        if req.dimensions > arr.shape[1]:
            raise APIError(400, f"dimensions ({req.dimensions}) exceeds the model's {arr.shape[1]}",
                           param="dimensions")
        arr = arr[:, :req.dimensions]
        arr = arr / np.maximum(np.linalg.norm(arr, axis=1, keepdims=True), 1e-12)
    data = []
    for i, row in enumerate(arr):
        row = np.ascontiguousarray(row, dtype="<f4")
        emb: Union[str, list[float]] = (base64.b64encode(row.tobytes()).decode("ascii")
                                        if req.encoding_format == "base64" else row.tolist())
        data.append({"object": "embedding", "index": i, "embedding": emb})
    state.metrics.prompt_tokens.inc(n_tokens)
    return JSONResponse({"object": "list", "data": data, "model": state.model_name,
                         "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})
