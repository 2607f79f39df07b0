"""``max.pipelines.lib``: configuration, registry, tokenizers, sampling and HF helpers.

The pipeline itself (``max.pipelines.lib.pipeline``: ``TextGenerationPipeline``,
``PipelineModel``, ...) is a separate module; names not defined here are looked up
there lazily (module ``__getattr__``), so importing this package never imports it.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from max.pipelines.lib.config import (
    AudioGenerationConfig,
    KVCacheConfig,
    LoRAConfig,
    MAXModelConfig,
    PipelineConfig,
    PipelineRole,
    PrependPromptSpeechTokens,
    ProfilingConfig,
    PrometheusMetricsMode,
    SamplingConfig,
    parse_device_specs,
)
from max.pipelines.lib.hf_utils import (
    HuggingFaceRepo,
    RepoType,
    SupportedEncoding,
    download_weight_files,
    generate_local_model_path,
    get_rope_parameters,
    get_rope_theta,
    load_generation_config,
    load_huggingface_config,
    try_to_load_from_cache,
    validate_hf_repo_access,
)
from max.pipelines.lib.log_probabilities import compute_log_probabilities_ragged, log_probabilities_ragged_graph
from max.pipelines.lib.registry import (
    PIPELINE_REGISTRY,
    PipelineRegistry,
    RopeType,
    SupportedArchitecture,
    WeightsAdapter,
    get_pipeline_for_task,
    register_all_models,
)
from max.pipelines.lib.sampling import (
    GeneratorCache,
    SamplingBatch,
    rejection_sample,
    sample_for_contexts,
    rejection_sampler,
    rejection_sampler_with_residuals,
    sample_tokens,
    token_sampler,
    validate_sampling_params,
)
from max.pipelines.lib.tokenizer import (
    IdentityPipelineTokenizer,
    PreTrainedPipelineTokenizer,
    TextAndVisionTokenizer,
    TextTokenizer,
    load_hf_tokenizer,
    max_tokens_to_generate,
    run_with_default_executor,
)

_LAZY_MODULES = ("max.pipelines.lib.pipeline", "max.pipelines.lib.embeddings_pipeline")


def __getattr__(name: str) -> Any:
    # ``TextGenerationPipeline``, ``PipelineModel``, ... live in ``lib/pipeline.py``.
    for mod in _LAZY_MODULES:
        if importlib.util.find_spec(mod) is not None:
            m = importlib.import_module(mod)
            if hasattr(m, name):
                return getattr(m, name)
    raise AttributeError(f"module 'max.pipelines.lib' has no attribute {name!r}")


__all__ = [
    "PIPELINE_REGISTRY", "AudioGenerationConfig", "HuggingFaceRepo", "IdentityPipelineTokenizer", "KVCacheConfig",
    "LoRAConfig", "MAXModelConfig", "PipelineConfig", "PipelineRegistry", "PipelineRole", "PrependPromptSpeechTokens",
    "PreTrainedPipelineTokenizer", "ProfilingConfig", "PrometheusMetricsMode", "RepoType", "RopeType",
    "GeneratorCache", "SamplingBatch", "rejection_sample", "sample_for_contexts", "SamplingConfig", "SupportedArchitecture", "SupportedEncoding", "TextAndVisionTokenizer",
    "TextTokenizer", "WeightsAdapter", "compute_log_probabilities_ragged", "download_weight_files",
    "generate_local_model_path", "get_pipeline_for_task", "get_rope_parameters", "get_rope_theta",
    "load_generation_config", "load_hf_tokenizer", "load_huggingface_config", "log_probabilities_ragged_graph",
    "max_tokens_to_generate", "parse_device_specs", "register_all_models", "rejection_sampler",
    "rejection_sampler_with_residuals", "run_with_default_executor", "sample_tokens", "token_sampler",
    "try_to_load_from_cache", "validate_hf_repo_access", "validate_sampling_params",
]
