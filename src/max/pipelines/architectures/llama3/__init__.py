"""Llama 2/3 and SmolLM: config translation, weight adapters, graph builder, registration."""

from max.pipelines.architectures.llama3.arch import llama_arch

ARCHITECTURES = [llama_arch]
