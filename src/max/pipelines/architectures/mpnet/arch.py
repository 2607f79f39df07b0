"""Registration of the MPNet encoder architecture (embeddings)."""

from max.graph.weights import WeightsFormat
from max.interfaces import PipelineTask
from max.nn.kv_cache import KVCacheStrategy
from max.pipelines.architectures.mpnet.model import MPNetPipelineModel
from max.pipelines.lib.embeddings_tokenizer import EmbeddingsTokenizer
from max.pipelines.lib.registry import SupportedArchitecture

mpnet_arch = SupportedArchitecture(
    name="MPNetModel",
    example_repo_ids=["sentence-transformers/all-mpnet-base-v2"],
    default_encoding="float32",
    supported_encodings={e: [KVCacheStrategy.MODEL_DEFAULT] for e in ("float32", "bfloat16", "float16")},
    pipeline_model=MPNetPipelineModel,
    task=PipelineTask.EMBEDDINGS_GENERATION,
    tokenizer=EmbeddingsTokenizer,
    default_weights_format=WeightsFormat.safetensors,
    prefix_caching_supported=False,
)
