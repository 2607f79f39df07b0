"""Falcon-H1 (``FalconH1ForCausalLM``): every layer runs a Mamba-2 mixer and attention side by side on
the same normed input and adds both; SwiGLU feed-forward; µP multipliers folded into the weights at load."""

from max.pipelines.architectures.falcon_h1.arch import falcon_h1_arch

ARCHITECTURES = [falcon_h1_arch]
