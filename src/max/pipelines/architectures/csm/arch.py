"""Registration of Sesame CSM (text to speech; float weights).  The registry lists it (``max list``) and
resolves it to :class:`~max.pipelines.architectures.csm.pipeline.CsmPipeline` for
``PipelineTask.AUDIO_GENERATION`` (``max generate --output x.wav``, ``/v1/audio/speech``)."""

from max.graph.weights import WeightsFormat
from max.interfaces import PipelineTask
from max.nn.kv_cache import KVCacheStrategy
from max.pipelines.architectures.csm.config import ARCHITECTURE
from max.pipelines.architectures.csm.pipeline_model import WEIGHT_ADAPTERS, CsmPipelineModel
from max.pipelines.lib.registry import SupportedArchitecture
from max.pipelines.lib.tokenizer import TextTokenizer

csm_arch = SupportedArchitecture(
    name=ARCHITECTURE,
    example_repo_ids=["sesame/csm-1b"],
    default_encoding="float32",
    supported_encodings={e: [KVCacheStrategy.PAGED] for e in ("float32", "bfloat16")},
    pipeline_model=CsmPipelineModel,
    task=PipelineTask.AUDIO_GENERATION,
    tokenizer=TextTokenizer,
    default_weights_format=WeightsFormat.safetensors,
    weight_adapters=dict(WEIGHT_ADAPTERS),
    prefix_caching_supported=False,
)
