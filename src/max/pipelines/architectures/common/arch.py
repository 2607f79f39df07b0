"""``decoder_architecture``: the ``SupportedArchitecture`` registration of a decoder family."""

from __future__ import annotations

from typing import Any, Callable

from max.graph.quantization import formats
from max.graph.weights import WeightsFormat
from max.interfaces import PipelineTask
from max.nn.kv_cache import KVCacheStrategy
from max.pipelines.lib.registry import SupportedArchitecture
from max.pipelines.lib.tokenizer import TextTokenizer

__all__ = ["DECODER_ENCODINGS", "GGML_ENCODINGS", "decoder_architecture"]

GGML_ENCODINGS = formats.encoding_names(ggml_only=True)
"""The float encodings and the GGML block encodings of GGUF files (the hybrid families: no GPTQ)."""

DECODER_ENCODINGS = GGML_ENCODINGS + ["gptq"]
"""Weight encodings every decoder family loads (GGML block encodings from GGUF files; ``gptq``: GPTQ / AWQ
int4 safetensors checkpoints, run as Q4_0 / Q4_1 blocks)."""


def decoder_architecture(name: str, example_repo_ids: list[str], pipeline_model: type,
                         gguf_architectures: list[str] | None = None,
                         config_from_gguf: Callable[[Any], dict] | None = None,
                         encodings: list[str] | None = None, tokenizer: Callable[..., Any] = TextTokenizer,
                         **kw: Any) -> SupportedArchitecture:
    """A text-generation ``SupportedArchitecture`` over the paged KV cache; ``pipeline_model``'s
    ``weight_adapters`` are registered as the architecture's (``tokenizer``: ``TextAndVisionTokenizer``
    for a vision-language model)."""
    return SupportedArchitecture(
        name=name,
        example_repo_ids=example_repo_ids,
        default_encoding="float32",
        supported_encodings={e: [KVCacheStrategy.PAGED] for e in (encodings or DECODER_ENCODINGS)},
        pipeline_model=pipeline_model,
        task=PipelineTask.TEXT_GENERATION,
        tokenizer=tokenizer,
        default_weights_format=WeightsFormat.safetensors,
        weight_adapters=dict(pipeline_model.weight_adapters),
        gguf_architectures=list(gguf_architectures or []),
        config_from_gguf=config_from_gguf,
        **kw,
    )
