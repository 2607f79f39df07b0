"""The server's shared state (``app.state.serve``) and small request helpers every route uses."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from fastapi import Request

from max.serve.engines import EmbeddingsEngine, GenerationEngine, TranscriptionEngine
from max.serve.lifecycle import Lifecycle
from max.serve.metrics import ServeMetrics
from max.serve.openai_schemas import APIError, parse
from max.serve.response_store import ResponseStore


DEFAULT_MAX_REQUEST_BYTES = 4 << 20
"""Largest request body ``max serve`` reads (413 beyond; ``--max-request-bytes``)."""


@dataclass
class AppState:
    model_name: str
    generator: Optional[GenerationEngine] = None
    embedder: Optional[EmbeddingsEngine] = None
    api_key: Optional[str] = None
    metrics: ServeMetrics = field(default_factory=ServeMetrics)
    aliases: set[str] = field(default_factory=set)
    created: int = field(default_factory=lambda: int(time.time()))
    tool_parser: Optional[str] = None  # None: chosen from the chat template
    max_request_bytes: Optional[int] = DEFAULT_MAX_REQUEST_BYTES
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    responses: ResponseStore = field(default_factory=ResponseStore)  # /v1/responses, previous_response_id
    replicated: bool = False  # one of several replicas behind one endpoint (Ray Serve)
    reasoning_parser: Optional[str] = None  # deepseek_r1 / qwen3: <think> text to reasoning_content
    transcriber: Optional[TranscriptionEngine] = None
    speaker: Optional[Any] = None  # a SpeechEngine (text to speech): /v1/audio/speech
    others: list["AppState"] = field(default_factory=list)
    """The other models of a server that serves several (``max serve --model-path A --model-path B``): each
    has its own engines and names and shares this state's key, metrics, lifecycle and response store;
    requests go to the one their ``model`` names (:meth:`for_model`)."""

    def all_states(self) -> list["AppState"]:
        """This model's state and those of the server's other models, in the order they were given."""
        return [self, *self.others]

    def engines(self) -> list[Any]:
        """This model's engines (those the app starts and stops)."""
        return [e for e in (self.generator, self.embedder, self.transcriber, self.speaker) if e is not None]

    def serves(self, name: str) -> bool:
        """Whether ``name`` is this model (its id or an alias) or one of its loaded LoRA adapters."""
        return name == self.model_name or name in self.aliases or self.adapter(name) is not None

    def for_model(self, name: Optional[str]) -> "AppState":
        """The state of the model a request's ``model`` names (None: the first model); 404
        ``model_not_found`` naming the served models for any other name."""
        if not self.others:
            self.check_model(name)
            return self
        if name is None:
            return self
        for st in self.all_states():
            if st.serves(name):
                return st
        served = ", ".join(f"'{st.model_name}'" for st in self.all_states())
        raise APIError(404, f"The model '{name}' does not exist; this server serves {served}", param="model",
                       code="model_not_found")

    def check_model(self, name: Optional[str]) -> None:
        """404 for a model this server does not serve; with LoRA, 400 naming ``model`` for an adapter
        name that is not loaded."""
        if name is None or name == self.model_name or name in self.aliases or self.adapter(name) is not None:
            return
        lora = self.generator.lora if self.generator is not None else None
        if lora is not None:
            raise APIError(400, f"'{name}' is neither the served model '{self.model_name}' nor a loaded LoRA "
                           f"adapter ({', '.join(sorted(lora.slots)) or 'none loaded'})", param="model",
                           code="model_not_found", keep=(self.model_name,))
        raise APIError(404, f"The model '{name}' does not exist; this server serves '{self.model_name}'",
                       param="model", code="model_not_found", keep=(self.model_name,))

    def adapter(self, name: Optional[str]) -> Optional[str]:
        """``name`` when it is a loaded LoRA adapter, else None."""
        lora = self.generator.lora if self.generator is not None else None
        return name if lora is not None and lora.has(name) else None

    def need_generator(self, path: str) -> GenerationEngine:
        if self.generator is None and self.speaker is not None:
            raise APIError(400, f"the model '{self.model_name}' is a text-to-speech model; {path} is not available "
                           "(use /v1/audio/speech)", param="model", code="model_not_supported", keep=(self.model_name,))
        if self.generator is None and self.transcriber is not None:
            raise APIError(400, f"the model '{self.model_name}' is a speech recognition model; {path} is not "
                           "available (use /v1/audio/transcriptions or /v1/audio/translations)", param="model",
                           code="model_not_supported", keep=(self.model_name,))
        if self.generator is None:
            raise APIError(400, f"the model '{self.model_name}' is an embeddings model; {path} is not available "
                           "(use /v1/embeddings)", param="model", code="model_not_supported", keep=(self.model_name,))
        return self.generator


def serve_state(request: Request) -> AppState:
    """The :class:`AppState` of the app serving ``request``."""
    return request.app.state.serve


async def read_json(request: Request) -> Any:
    """The decoded JSON body; 415 unless the body is declared as JSON (``Content-Type:
    application/json``, as OpenAI requires), 400 ``invalid_json`` when it does not parse."""
    ctype = request.headers.get("content-type")
    mime = (ctype or "").split(";")[0].strip().lower()
    if mime != "application/json" and not (mime.startswith("application/") and mime.endswith("+json")):
        got = f"'{ctype}'" if ctype else "none"
        raise APIError(415, f"unsupported Content-Type {got}: send the body as JSON with 'Content-Type: "
                       "application/json'", code="unsupported_content_type")
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None


async def parse_body(request: Request, model: type) -> tuple[AppState, Any]:
    """The state of the model the body's ``model`` id names (404 when this server does not serve it) and the
    request body validated as ``model`` (400 naming the field otherwise)."""
    state = serve_state(request)
    req = parse(model, await read_json(request))
    return state.for_model(req.model), req
