"""EXAONE 4 (``Exaone4ForCausalLM``): hybrid attention -- sliding-window layers with RoPE and global
layers without (when the model has a sliding window) -- per-head q/k norms, norms after attention
and after the MLP."""

from max.pipelines.architectures.exaone4.arch import exaone4_arch

ARCHITECTURES = [exaone4_arch]
