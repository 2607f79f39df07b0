"""BERT encoders for embeddings and cross-encoder scoring: config translation, graph builders, pipeline models,
registration."""

from max.pipelines.architectures.bert.arch import bert_arch, bert_classifier_arch, xlm_roberta_classifier_arch

ARCHITECTURES = [bert_arch, bert_classifier_arch, xlm_roberta_classifier_arch]

__all__ = ["ARCHITECTURES", "bert_arch", "bert_classifier_arch", "xlm_roberta_classifier_arch"]
