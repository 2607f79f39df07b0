"""Registration of the Qwen3 architectures: text generation, and embeddings (Qwen3-Embedding)."""

from max.graph.weights import WeightsFormat
from max.interfaces import PipelineTask
from max.nn.kv_cache import KVCacheStrategy
from max.pipelines.architectures.common.arch import DECODER_ENCODINGS, decoder_architecture
from max.pipelines.architectures.qwen3.config import config_from_gguf
from max.pipelines.architectures.qwen3.model import Qwen3EmbeddingModel, Qwen3Model
from max.pipelines.lib.embeddings_tokenizer import EmbeddingsTokenizer
from max.pipelines.lib.registry import SupportedArchitecture

qwen3_arch = decoder_architecture("Qwen3ForCausalLM", ["Qwen/Qwen3-0.6B"], Qwen3Model,
                                  gguf_architectures=["qwen3"], config_from_gguf=config_from_gguf)

qwen3_embedding_arch = SupportedArchitecture(
    name="Qwen3Model",
    example_repo_ids=["Qwen/Qwen3-Embedding-0.6B"],
    default_encoding="float32",
    supported_encodings={e: [KVCacheStrategy.PAGED] for e in DECODER_ENCODINGS},
    pipeline_model=Qwen3EmbeddingModel,
    task=PipelineTask.EMBEDDINGS_GENERATION,
    tokenizer=EmbeddingsTokenizer,
    default_weights_format=WeightsFormat.safetensors,
    weight_adapters=dict(Qwen3EmbeddingModel.weight_adapters),
    prefix_caching_supported=False,
)
"""Qwen3-Embedding: the decoder's last-token hidden state, normalised (``common.embeddings``)."""
