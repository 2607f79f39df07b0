"""Registration of the BERT encoder architectures: embeddings (all-MiniLM, BGE, E5 ...) and cross-encoders
(``BertForSequenceClassification``, ``XLMRobertaForSequenceClassification``: rerankers)."""

from max.graph.weights import WeightsFormat
from max.interfaces import PipelineTask
from max.nn.kv_cache import KVCacheStrategy
from max.pipelines.architectures.bert.classifier import CrossEncoderPipelineModel
from max.pipelines.architectures.bert.model import BertPipelineModel
from max.pipelines.lib.embeddings_tokenizer import EmbeddingsTokenizer
from max.pipelines.lib.registry import SupportedArchitecture

bert_arch = SupportedArchitecture(
    name="BertModel",
    example_repo_ids=["sentence-transformers/all-MiniLM-L6-v2", "BAAI/bge-small-en-v1.5"],
    default_encoding="float32",
    supported_encodings={e: [KVCacheStrategy.MODEL_DEFAULT] for e in ("float32", "bfloat16", "float16")},
    pipeline_model=BertPipelineModel,
    task=PipelineTask.EMBEDDINGS_GENERATION,
    tokenizer=EmbeddingsTokenizer,
    default_weights_format=WeightsFormat.safetensors,
    prefix_caching_supported=False,
)

_cross_encoder = dict(
    default_encoding="float32",
    supported_encodings={e: [KVCacheStrategy.MODEL_DEFAULT] for e in ("float32", "bfloat16", "float16")},
    pipeline_model=CrossEncoderPipelineModel,
    task=PipelineTask.EMBEDDINGS_GENERATION,  # an encoder without KV cache; it scores pairs (score_pairs)
    tokenizer=EmbeddingsTokenizer,
    default_weights_format=WeightsFormat.safetensors,
    prefix_caching_supported=False,
)
bert_classifier_arch = SupportedArchitecture(
    name="BertForSequenceClassification", example_repo_ids=["cross-encoder/ms-marco-MiniLM-L6-v2"], **_cross_encoder)
xlm_roberta_classifier_arch = SupportedArchitecture(
    name="XLMRobertaForSequenceClassification", example_repo_ids=["BAAI/bge-reranker-v2-m3"], **_cross_encoder)
