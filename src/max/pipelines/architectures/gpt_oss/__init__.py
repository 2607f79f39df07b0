"""GPT-OSS (``GptOssForCausalLM``): attention sinks, alternating sliding-window / full layers, YaRN RoPE,
and a mixture of experts with biases and the clamped ``swigluoai`` activation."""

from max.pipelines.architectures.gpt_oss.arch import gpt_oss_arch

ARCHITECTURES = [gpt_oss_arch]
