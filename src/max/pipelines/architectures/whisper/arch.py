"""Registration of Whisper (speech recognition; float weights).  The registry lists it (``max list``) and
resolves its config and weights; it runs through :class:`~max.pipelines.architectures.whisper.transcribe.WhisperPipeline`
(``max transcribe``, ``/v1/audio/transcriptions``), not the text-generation pipeline."""

from typing import Any

from max.graph.weights import WeightsFormat
from max.interfaces import PipelineTask
from max.nn.kv_cache import KVCacheStrategy
from max.pipelines.architectures.whisper.config import ARCHITECTURE
from max.pipelines.architectures.whisper.pipeline_model import WEIGHT_ADAPTERS, WhisperPipelineModel
from max.pipelines.lib.registry import SupportedArchitecture
from max.pipelines.lib.tokenizer import TextTokenizer


def _transcriber(pipeline_config: Any) -> Any:
    from max.pipelines.architectures.whisper.transcribe import WhisperPipeline

    return WhisperPipeline(pipeline_config)


whisper_arch = SupportedArchitecture(
    name=ARCHITECTURE,
    example_repo_ids=["openai/whisper-tiny", "openai/whisper-large-v3-turbo"],
    default_encoding="float32",
    supported_encodings={e: [KVCacheStrategy.PAGED] for e in ("float32", "bfloat16", "float16")},
    pipeline_model=WhisperPipelineModel,
    task=PipelineTask.TEXT_GENERATION,
    tokenizer=TextTokenizer,
    default_weights_format=WeightsFormat.safetensors,
    weight_adapters=dict(WEIGHT_ADAPTERS),
    prefix_caching_supported=False,
    transcription_pipeline=_transcriber,
)
