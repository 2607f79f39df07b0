"""Mamba-2 (``Mamba2ForCausalLM``): every layer a Mamba-2 SSD mixer (no attention); per-request conv
windows and SSM states in the hybrid cache's slots."""

from max.pipelines.architectures.mamba2.arch import mamba2_arch

ARCHITECTURES = [mamba2_arch]
