"""Llama 4 text (``Llama4ForCausalLM``): RoPE layers (interleaved pairs, Llama 3 scaling) with an L2 norm
of each q/k head, NoPE layers whose queries are scaled by a position-dependent temperature, and
mixtures of experts (top-1 by sigmoid score, the score applied to the expert's input, plus a shared
expert) on ``moe_layers``; dense MLPs of ``intermediate_size_mlp`` elsewhere.

The RoPE layers use chunked local attention: a token at position ``p`` attends only to positions
``attention_chunk_size * (p // attention_chunk_size) .. p`` (its own chunk); the NoPE layers attend to
every earlier position.  Both read the one paged KV cache (prefill, chunked prefill and decode)."""

from max.pipelines.architectures.llama4.arch import llama4_arch

ARCHITECTURES = [llama4_arch]
