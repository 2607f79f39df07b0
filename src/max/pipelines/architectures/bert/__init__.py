"""BERT encoders for embeddings: config translation, graph builder, pipeline model, registration."""

from max.pipelines.architectures.bert.arch import bert_arch

ARCHITECTURES = [bert_arch]

__all__ = ["ARCHITECTURES", "bert_arch"]
