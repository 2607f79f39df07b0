"""Built-in architectures, one folder each; ``register_all_models()`` registers them."""

from __future__ import annotations

_DONE = False


def register_all_models() -> None:
    global _DONE
    if _DONE:
        return
    from max.pipelines.architectures.llama3.arch import llama_arch
    from max.pipelines.architectures.mistral import mistral_arch
    from max.pipelines.architectures.qwen2 import qwen2_arch
    from max.pipelines.architectures.qwen3 import qwen3_arch
    from max.pipelines.architectures.bert import bert_arch
    from max.pipelines.lib.registry import PIPELINE_REGISTRY

    for arch in (llama_arch, mistral_arch, qwen2_arch, qwen3_arch, bert_arch):
        PIPELINE_REGISTRY.register(arch, allow_override=True)
    _DONE = True
