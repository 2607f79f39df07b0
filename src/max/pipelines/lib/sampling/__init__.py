"""Token sampling: the torch sampler the pipeline uses (``sample_tokens``) and the
reference's graph builders (``token_sampler``, ``rejection_sampler``)."""

from max.pipelines.lib.sampling.sampling import (
    GeneratorCache,
    SamplingBatch,
    rejection_sample,
    rejection_sampler,
    rejection_sampler_with_residuals,
    sample_for_contexts,
    sample_tokens,
    token_sampler,
    validate_sampling_params,
)

__all__ = [
    "GeneratorCache",
    "SamplingBatch",
    "rejection_sample",
    "rejection_sampler",
    "rejection_sampler_with_residuals",
    "sample_for_contexts",
    "sample_tokens",
    "token_sampler",
    "validate_sampling_params",
]
