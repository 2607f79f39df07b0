"""Pipeline contracts: ``Pipeline``, ``PipelineTask``, ``PipelineTokenizer``, inputs."""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Generic, Optional, Protocol, TypeVar, runtime_checkable

from max.interfaces.request import RequestID
from max.interfaces.scheduler import StepPlan

PipelineInputsType = TypeVar("PipelineInputsType")
PipelineOutputType = TypeVar("PipelineOutputType")
TextGenerationContextType = TypeVar("TextGenerationContextType")
EmbeddingsGenerationContextType = TypeVar("EmbeddingsGenerationContextType")
UnboundContextType = TypeVar("UnboundContextType")
TokenizerEncoded = TypeVar("TokenizerEncoded")
RequestType = TypeVar("RequestType", contravariant=True)
AudioGeneratorContext = TypeVar("AudioGeneratorContext")


class PipelineTask(str, enum.Enum):
    """The kinds of pipeline tasks."""

    TEXT_GENERATION = "text_generation"
    EMBEDDINGS_GENERATION = "embeddings_generation"
    AUDIO_GENERATION = "audio_generation"
    SPEECH_TOKEN_GENERATION = "speech_token_generation"

    @property
    def output_type(self) -> type:
        """The output class of the task."""
        from max.interfaces.outputs import AudioGeneratorOutput, EmbeddingsGenerationOutput, TextGenerationOutput

        return {
            PipelineTask.TEXT_GENERATION: TextGenerationOutput,
            PipelineTask.EMBEDDINGS_GENERATION: EmbeddingsGenerationOutput,
            PipelineTask.AUDIO_GENERATION: AudioGeneratorOutput,
            PipelineTask.SPEECH_TOKEN_GENERATION: TextGenerationOutput,
        }[self]


def _merge_batches(batches: list, who: str) -> dict:
    merged: dict = {}
    for b in batches:
        for rid, ctx in b.items():
            if rid in merged:
                raise ValueError(f"{who}: request {rid!r} appears in more than one batch")
            merged[rid] = ctx
    return merged


@dataclass
class TextGenerationInputs(Generic[TextGenerationContextType]):
    """A batch for one text-generation step: one dict per data-parallel replica, and the
    number of tokens to generate."""

    batches: list[dict[RequestID, TextGenerationContextType]]
    """One batch per data-parallel device, each mapping request id to context."""
    num_steps: int
    """Number of tokens to generate."""
    plan: Optional["StepPlan"] = None
    """libremax extension: the scheduler's plan for this step (tokens per request); None: every request
    runs all it has (whole prompts)."""

    def __post_init__(self) -> None:
        if isinstance(self.batches, dict):  # a single batch
            self.batches = [self.batches]
        if isinstance(self.num_steps, bool) or not isinstance(self.num_steps, int) or self.num_steps < 1:
            raise ValueError(f"TextGenerationInputs: num_steps must be an int >= 1, got {self.num_steps!r}")

    @property
    def batch(self) -> dict[RequestID, TextGenerationContextType]:
        """All batches merged into one dict (request ids must be unique across batches)."""
        return _merge_batches(self.batches, "TextGenerationInputs")


@dataclass
class EmbeddingsGenerationInputs(Generic[EmbeddingsGenerationContextType]):
    """A batch for an embeddings pipeline (one dict per data-parallel replica)."""

    batches: list[dict[RequestID, EmbeddingsGenerationContextType]]

    def __post_init__(self) -> None:
        if isinstance(self.batches, dict):
            self.batches = [self.batches]

    @property
    def batch(self) -> dict[RequestID, EmbeddingsGenerationContextType]:
        """All batches merged into one dict."""
        return _merge_batches(self.batches, "EmbeddingsGenerationInputs")


class Pipeline(ABC, Generic[PipelineInputsType, PipelineOutputType]):
    """Base class of pipelines: ``execute(inputs) -> dict[RequestID, output]`` and ``release``."""

    @abstractmethod
    def execute(self, inputs: PipelineInputsType) -> dict[RequestID, PipelineOutputType]:
        """Run the pipeline on ``inputs``.

        Raises:
            NotImplementedError: If not implemented by a concrete subclass.
        """
        raise NotImplementedError(f"{type(self).__name__}.execute is not implemented")

    @abstractmethod
    def release(self, request_id: RequestID) -> None:
        """Free the resources held for ``request_id``.

        Raises:
            NotImplementedError: If not implemented by a concrete subclass.
        """
        raise NotImplementedError(f"{type(self).__name__}.release is not implemented")


@runtime_checkable
class PipelineTokenizer(Protocol[UnboundContextType, TokenizerEncoded, RequestType]):
    """Interface for LLM tokenizers used by pipelines and the server."""

    @property
    def eos(self) -> int:
        """The end of sequence token of this tokenizer."""
        ...

    @property
    def expects_content_wrapping(self) -> bool:
        """If true, text message parts are ``{"type": "text", "content": ...}`` instead of
        OpenAI's ``{"type": "text", "text": ...}``, and image parts become ``{"type": "image"}``
        with their bytes in the request's ``images``."""
        ...

    async def new_context(self, request: RequestType) -> UnboundContextType:
        """Create a new context from a request."""
        ...

    async def encode(self, prompt: str, add_special_tokens: bool) -> TokenizerEncoded:
        """Encode a prompt.

        Raises:
            ValueError: If the prompt exceeds the configured maximum length.
        """
        ...

    async def decode(self, encoded: TokenizerEncoded, **kwargs: Any) -> str:
        """Decode tokens to text."""
        ...


@runtime_checkable
class AudioGenerator(Protocol[AudioGeneratorContext]):
    """Interface for audio generation models."""

    def next_chunk(self, batch: dict[str, AudioGeneratorContext]) -> dict[str, Any]:
        """Compute the next audio chunk of each request in ``batch``."""
        ...

    def release(self, request_id: RequestID) -> None:
        """Release the resources held for ``request_id``."""
        ...


