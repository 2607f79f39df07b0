"""Registration of the Llama architecture (Llama 2/3, SmolLM)."""

from max.graph.weights import WeightsFormat
from max.interfaces import PipelineTask
from max.nn.kv_cache import KVCacheStrategy
from max.pipelines.architectures.llama3.model import Llama3Model
from max.pipelines.lib.registry import SupportedArchitecture
from max.pipelines.lib.tokenizer import TextTokenizer

_ENCODINGS = ["float32", "bfloat16", "float16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k"]


def make(name: str, example: str, gguf_names: list[str]) -> SupportedArchitecture:
    return SupportedArchitecture(
        name=name,
        example_repo_ids=[example],
        default_encoding="float32",
        supported_encodings={e: [KVCacheStrategy.PAGED] for e in _ENCODINGS},
        pipeline_model=Llama3Model,
        task=PipelineTask.TEXT_GENERATION,
        tokenizer=TextTokenizer,
        default_weights_format=WeightsFormat.safetensors,
        gguf_architectures=gguf_names,
    )


llama_arch = make("LlamaForCausalLM", "HuggingFaceTB/SmolLM2-135M-Instruct", ["llama"])
