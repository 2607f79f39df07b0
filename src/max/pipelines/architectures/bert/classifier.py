"""Cross-encoders: ``BertForSequenceClassification`` and ``XLMRobertaForSequenceClassification``
(rerankers such as ms-marco-MiniLM, bge-reranker) on the BERT encoder of :mod:`.model`.

The encoder reads ``token_type_ids`` (segment A / B of a query-document pair); XLM-R's positions
start at ``pad_token_id + 1``.  The head reads the first token's last hidden state:

- BERT: ``classifier(tanh(pooler.dense(h0)))``;
- XLM-R / RoBERTa: ``classifier.out_proj(tanh(classifier.dense(h0)))``.

Graph inputs: ``input_ids``, ``attention_mask`` and ``token_type_ids``, int64 ``[batch, seq]``
(right padding).  Output: float32 logits ``[batch, num_labels]``.  Dropout is an identity at
inference and is left out.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from max.driver import Buffer
from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, TensorValue, ops
from max.nn import Module
from max.pipelines.architectures.bert.config import BertConfig
from max.pipelines.architectures.bert.model import BertEmbeddings, BertEncoder
from max.pipelines.architectures.common.encoder import EncoderPipelineModel, additive_mask, tokens_of
from max.pipelines.architectures.common.weights import WeightFactory
from max.pipelines.lib.pipeline import ModelInputs, ModelOutputs

__all__ = ["CrossEncoderPipelineModel", "SequenceClassifier", "build_classifier_graph", "convert_classifier_state_dict"]


class BertPooler(Module):
    def __init__(self, cfg: BertConfig, f: WeightFactory, p: str = "pooler") -> None:
        super().__init__()
        self.dense = f.linear(f"{p}.dense", cfg.hidden_size, cfg.hidden_size, has_bias=True)

    def __call__(self, first: TensorValue) -> TensorValue:
        return ops.tanh(self.dense(first))


class RobertaClassificationHead(Module):
    def __init__(self, cfg: BertConfig, f: WeightFactory, p: str = "classifier") -> None:
        super().__init__()
        self.dense = f.linear(f"{p}.dense", cfg.hidden_size, cfg.hidden_size, has_bias=True)
        self.out_proj = f.linear(f"{p}.out_proj", cfg.hidden_size, cfg.num_labels, has_bias=True)

    def __call__(self, first: TensorValue) -> TensorValue:
        return self.out_proj(ops.tanh(self.dense(first)))


def is_roberta(cfg: BertConfig) -> bool:
    return cfg.architecture.startswith(("Roberta", "XLMRoberta"))


class SequenceClassifier(Module):
    """``(input_ids, attention_mask, token_type_ids) -> logits [batch, num_labels]`` (float32)."""

    def __init__(self, cfg: BertConfig, dtype: DType, device: DeviceRef, factory: WeightFactory | None = None) -> None:
        super().__init__()
        f = factory or WeightFactory(dtype, device)
        self.config = cfg
        self.dtype = dtype
        self.embeddings = BertEmbeddings(cfg, f)
        self.encoder = BertEncoder(cfg, f)
        if is_roberta(cfg):
            self.classifier: Module = RobertaClassificationHead(cfg, f)
        else:
            self.pooler = BertPooler(cfg, f)
            self.classifier = f.linear("classifier", cfg.hidden_size, cfg.num_labels, has_bias=True)
        f.check_paths(self)

    def __call__(self, input_ids: TensorValue, attention_mask: TensorValue, token_type_ids: TensorValue
                 ) -> TensorValue:
        h = self.encoder(self.embeddings(input_ids, token_type_ids), additive_mask(attention_mask, self.dtype))
        first = h[:, 0]  # [b, H]: the [CLS] / <s> token
        if not is_roberta(self.config):
            first = self.pooler(first)
        logits = self.classifier(first)
        return logits if logits.dtype is DType.float32 else ops.cast(logits, DType.float32)


def build_classifier_graph(model: SequenceClassifier, device: DeviceRef, name: str) -> Graph:
    types = [TensorType(DType.int64, ["batch", "seq"], device) for _ in range(3)]
    with Graph(name, input_types=types) as g:
        ids, mask, types_in = g.inputs
        g.output(model(ids.tensor, mask.tensor, types_in.tensor))
    return g


def convert_classifier_state_dict(state_dict: dict[str, Any], **_: Any) -> dict[str, Any]:
    """Checkpoint tensors -> the classifier's module names (the ``bert.`` / ``roberta.`` prefix dropped,
    LayerNorm ``gamma``/``beta`` renamed, position-id buffers left out)."""
    out = {}
    for name, w in state_dict.items():
        for prefix in ("bert.", "roberta.", "model."):
            if name.startswith(prefix):
                name = name[len(prefix):]
        if name.endswith(("position_ids", "token_type_ids")):
            continue
        if name.endswith(".gamma"):
            name = name[: -len(".gamma")] + ".weight"
        elif name.endswith(".beta"):
            name = name[: -len(".beta")] + ".bias"
        out[name] = w
    return out


class CrossEncoderPipelineModel(EncoderPipelineModel):
    """A compiled cross-encoder for ``EmbeddingsPipeline.score_pairs`` (``cross_encoder = True``):
    ``execute`` returns the float32 logits ``[batch, num_labels]`` as ``ModelOutputs.logits``."""

    cross_encoder = True
    config_from_hf = staticmethod(BertConfig.from_hf)
    convert_state_dict = staticmethod(convert_classifier_state_dict)

    @staticmethod
    def build_module(cfg: BertConfig, dtype: DType, device: DeviceRef, pool: bool, factory: WeightFactory) -> Module:
        if cfg.num_labels not in (1, 2):
            raise ValueError(f"{cfg.architecture}: a cross-encoder scores with 1 label (sigmoid) or 2 (softmax, "
                             f"class 1); this one has {cfg.num_labels}")
        return SequenceClassifier(cfg, dtype, device, factory)

    @staticmethod
    def build_graph(module: Module, device: DeviceRef, name: str) -> Graph:
        return build_classifier_graph(module, device, name)  # type: ignore[arg-type]

    @property
    def num_labels(self) -> int:
        return int(self.config.num_labels)

    def prepare_initial_token_inputs(self, context_batch: Sequence[Any], kv_cache_inputs: Any = None,
                                     return_n_logits: int = 1) -> ModelInputs:
        """Rows are ``(input_ids, token_type_ids)`` pairs (or plain id rows: all segment 0)."""
        pairs = [r if isinstance(r, tuple) else (tokens_of(r), None) for r in context_batch]
        inputs = super().prepare_initial_token_inputs([ids for ids, _ in pairs])
        width = int(inputs.input_ids.shape[1])
        types = np.zeros((len(pairs), width), dtype=np.int64)
        for i, (ids, tt) in enumerate(pairs):
            if tt is not None:
                types[i, : len(ids)] = tt
        types_b = Buffer.from_numpy(types)
        if not DeviceRef.from_device(self.devices[0]).is_cpu():
            types_b = types_b.to(self.devices[0])
        inputs.token_type_ids = types_b
        return inputs

    def execute(self, model_inputs: ModelInputs) -> ModelOutputs:
        (out,) = self.model.execute(model_inputs.input_ids, model_inputs.attention_mask, model_inputs.token_type_ids)
        return ModelOutputs(logits=out._torch())
