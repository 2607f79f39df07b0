"""Registration of the Gemma 3 multimodal architecture (images + text in, text out)."""

from max.graph.weights import WeightsFormat
from max.interfaces import PipelineTask
from max.nn.kv_cache import KVCacheStrategy
from max.pipelines.architectures.gemma3multimodal.config import ARCHITECTURE
from max.pipelines.architectures.gemma3multimodal.model import Gemma3MultimodalModel
from max.pipelines.lib.registry import SupportedArchitecture
from max.pipelines.lib.tokenizer import TextAndVisionTokenizer

gemma3multimodal_arch = SupportedArchitecture(
    name=ARCHITECTURE,
    example_repo_ids=["google/gemma-3-4b-it", "google/gemma-3-12b-it", "google/gemma-3-27b-it"],
    default_encoding="float32",
    supported_encodings={e: [KVCacheStrategy.PAGED] for e in ("float32", "bfloat16", "float16")},
    pipeline_model=Gemma3MultimodalModel,
    task=PipelineTask.TEXT_GENERATION,
    tokenizer=TextAndVisionTokenizer,
    default_weights_format=WeightsFormat.safetensors,
    weight_adapters=dict(Gemma3MultimodalModel.weight_adapters),
)
