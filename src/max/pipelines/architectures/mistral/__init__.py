"""Mistral: the Llama decoder with an optional sliding attention window."""

from max.pipelines.architectures.llama3.arch import make

mistral_arch = make("MistralForCausalLM", "mistralai/Mistral-7B-Instruct-v0.3", ["mistral"])
