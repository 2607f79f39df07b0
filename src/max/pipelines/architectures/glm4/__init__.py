"""GLM-4 (``Glm4ForCausalLM``): q/k/v biases, interleaved RoPE on part of each head, a fused gate/up
projection, and norms after attention and after the MLP as well as before them."""

from max.pipelines.architectures.glm4.arch import glm4_arch

ARCHITECTURES = [glm4_arch]
