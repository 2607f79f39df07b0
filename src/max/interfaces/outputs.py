"""Pipeline outputs: text, embeddings and audio."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from max.interfaces.log_probabilities import LogProbabilities
from max.interfaces.request import RequestID
from max.interfaces.status import GenerationStatus


@runtime_checkable
class PipelineOutput(Protocol):
    """The output of a pipeline operation: it knows whether it is the last one."""

    @property
    def is_done(self) -> bool:
        """Whether the pipeline operation has completed."""
        ...


@dataclass
class TextGenerationOutput:
    """Generated token ids (since the previous output), status, and optional log probabilities."""

    request_id: RequestID
    """The unique identifier for the generation request."""
    tokens: list[int]
    """List of generated token IDs."""
    final_status: GenerationStatus
    """The final status of the generation process."""
    log_probabilities: Optional[list[LogProbabilities]] = None
    """Optional list of log probabilities for each token."""

    def __post_init__(self) -> None:
        self.final_status = GenerationStatus(self.final_status)

    @property
    def is_done(self) -> bool:
        """True when ``final_status`` is not ``ACTIVE``."""
        return self.final_status.is_done


@dataclass
class EmbeddingsGenerationOutput:
    """Response of an embeddings pipeline."""

    embeddings: npt.NDArray[np.floating[Any]]
    """The generated embeddings as a NumPy array."""

    @property
    def is_done(self) -> bool:
        """Always True: embedding generation is a single step."""
        return True


@dataclass(kw_only=True)
class AudioGenerationMetadata:
    """Structured metadata of an audio generation chunk."""

    sample_rate: Optional[int] = None
    duration: Optional[float] = None
    chunk_id: Optional[int] = None
    timestamp: Optional[str] = None
    final_chunk: Optional[bool] = None
    model_name: Optional[str] = None
    request_id: Optional[str] = None
    tokens_generated: Optional[int] = None
    processing_time: Optional[float] = None
    echo: Optional[str] = None

    def to_dict(self) -> dict[str, Any]:
        """The metadata as a dictionary (fields that are None are left out)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


def _empty_audio() -> npt.NDArray[np.float32]:
    return np.zeros((0,), dtype=np.float32)


@dataclass
class AudioGeneratorOutput:
    """One response of an audio generation pipeline."""

    final_status: GenerationStatus
    """The final status of the generation process."""
    steps_executed: Optional[int] = None
    """The number of steps previously executed."""
    audio_data: npt.NDArray[np.float32] = field(default_factory=_empty_audio)
    """The generated audio data, if available."""
    buffer_speech_tokens: Optional[npt.NDArray[np.integer[Any]]] = None
    """Buffered speech tokens, if available."""
    metadata: AudioGenerationMetadata = field(default_factory=AudioGenerationMetadata)
    """Chunk metadata."""

    def __post_init__(self) -> None:
        self.final_status = GenerationStatus(self.final_status)

    @property
    def is_done(self) -> bool:
        """Whether the audio generation process is complete."""
        return self.final_status.is_done
