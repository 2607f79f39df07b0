"""Llama 4 text (``Llama4ForCausalLM``): RoPE layers (interleaved pairs, Llama 3 scaling) with an L2 norm
of each q/k head, NoPE layers whose queries are scaled by a position-dependent temperature, and
mixtures of experts (top-1 by sigmoid score, the score applied to the expert's input, plus a shared
expert) on ``moe_layers``; dense MLPs of ``intermediate_size_mlp`` elsewhere.

The RoPE layers' chunked local attention (each token sees only its ``attention_chunk_size`` chunk)
equals causal attention while sequences fit one chunk: ``max_length`` is capped at
``attention_chunk_size`` (a longer one is a clear error)."""

from max.pipelines.architectures.llama4.arch import llama4_arch

ARCHITECTURES = [llama4_arch]
