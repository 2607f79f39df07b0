"""DeepSeek-V3's router and pipeline model (attention: ``deepseek_v2``'s MLA); with
``speculative_method="mtp"`` the model also returns its hidden states and carries its multi-token
prediction layer as the draft (``mtp.py``)."""

from __future__ import annotations

import dataclasses

import logging
from typing import Any, Sequence

from max.dtype import DType
from max.graph import TensorValue, Weight, ops
from max.nn.kv_cache import KVCacheParams
from max.nn.layer import Module
from max.nn.transformer import ReturnLogits
from max.pipelines.architectures.common.config import DecoderConfig
from max.pipelines.architectures.common.layers import build_decoder, default_mlp
from max.pipelines.architectures.common.moe import DecoderMoE
from max.pipelines.architectures.common.weights import WeightFactory, session_policy
from max.pipelines.architectures.deepseek_v2.model import DeepseekV2Model, MLAttention
from max.pipelines.architectures.deepseek_v3.config import config_from_hf
from max.pipelines.architectures.deepseek_v3.weight_adapters import WEIGHT_ADAPTERS, mtp_state_dict
from max.pipelines.lib.pipeline import ModelInputs, ModelOutputs

logger = logging.getLogger("max.pipelines")


class DeepseekV3MoE(DecoderMoE):
    """Routed and shared experts with V3's routing: ``s = sigmoid(logits)``; the experts are the top-k of
    ``s + e_score_correction_bias`` within the ``topk_group`` groups whose two best biased scores sum
    highest; their weights are ``s`` (renormalised when ``norm_topk_prob``) times
    ``routed_scaling_factor``."""

    def __init__(self, cfg: DecoderConfig, layer: int, factory: WeightFactory) -> None:
        super().__init__(cfg, layer, factory)
        self.e_score_correction_bias = Weight("e_score_correction_bias", DType.float32, [self.num_experts],
                                              factory.device)

    def route(self, x: TensorValue) -> tuple[TensorValue, TensorValue]:
        s = self.spec
        E, G = self.num_experts, s.n_group
        scores = ops.sigmoid(self.gate(x).cast(DType.float32))
        choice = scores + self.e_score_correction_bias
        if G > 1:
            grouped = ops.reshape(choice, [-1, G, E // G])
            best2 = ops.top_k(grouped, 2, axis=-1)[0]
            group_score = ops.reshape(ops.sum(best2, axis=-1), [-1, G])
            kth = ops.top_k(group_score, s.topk_group, axis=-1)[0][:, s.topk_group - 1:]
            keep = ops.greater_equal(group_score, kth)  # [T, G]: the topk_group best groups
            keep = ops.reshape(ops.broadcast_to(ops.unsqueeze(keep, -1), [grouped.shape[0], G, E // G]), [-1, E])
            ninf = ops.broadcast_to(ops.constant(float("-inf"), DType.float32, choice.device), choice.shape)
            choice = ops.where(keep, choice, ninf)
        ids = ops.top_k(choice, s.top_k, axis=-1)[1]
        weights = ops.gather_nd(scores, ops.unsqueeze(ids, -1), batch_dims=1)
        if s.renormalize:
            weights = weights / (ops.sum(weights, axis=-1) + 1e-20)
        return ids.cast(DType.int64), weights * s.scaling


def _mlp(cfg: DecoderConfig, layer: int, factory: WeightFactory) -> Module:
    if layer in cfg.moe.dense_layers:
        return default_mlp(cfg, layer, factory)
    return DeepseekV3MoE(cfg, layer, factory)


class DeepseekV3Model(DeepseekV2Model):
    """DeepSeek-V3's pipeline model.  With ``speculative_method="mtp"`` (speculative decoding built with
    every position's logits) it also returns each step's hidden states after the final norm
    (:attr:`last_hidden`, rows of :attr:`last_rows`) and builds :attr:`mtp_draft`, the checkpoint's first
    MTP layer (``num_nextn_predict_layers``); the target's prefix cache is then off (the draft needs the
    hidden state of every position, which cached pages do not keep)."""

    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = WEIGHT_ADAPTERS
    mtp_draft: Any = None
    last_hidden: Any = None
    last_rows: list[tuple[str, int, int]] = []

    def __init__(self, pipeline_config: Any, session: Any, huggingface_config: Any, encoding: Any, devices: list,
                 kv_cache_config: Any, weights: Any, adapter: Any, return_logits: ReturnLogits) -> None:
        self._with_mtp = getattr(pipeline_config, "speculative_method", None) == "mtp" and \
            return_logits == ReturnLogits.ALL
        hf = huggingface_config
        hfd = hf.to_dict() if hasattr(hf, "to_dict") else dict(hf)
        if self._with_mtp:
            if int(hfd.get("num_nextn_predict_layers") or 0) < 1:
                raise ValueError("DeepseekV3ForCausalLM: speculative_method 'mtp' needs a checkpoint with a "
                                 "multi-token prediction layer (num_nextn_predict_layers >= 1); this one has none")
            if kv_cache_config.enable_prefix_caching:
                logger.info("DeepSeek-V3 MTP draft: prefix caching is off (the draft reads every position's "
                            "hidden state)")
                kv_cache_config = dataclasses.replace(kv_cache_config, enable_prefix_caching=False)
        super().__init__(pipeline_config, session, huggingface_config, encoding, devices, kv_cache_config, weights,
                         adapter, return_logits)
        if self._with_mtp:
            self._build_mtp(pipeline_config, session, hfd, encoding, devices, kv_cache_config, weights)

    def _build_mtp(self, pipeline_config: Any, session: Any, hfd: dict, encoding: Any, devices: list,
                   kvc: Any, weights: Any) -> None:
        from max.pipelines.architectures.common.model import kv_params_for
        from max.pipelines.architectures.deepseek_v3.mtp import MTPDraftModel

        cfg = self.config
        n = int(cfg.num_hidden_layers)
        checkpoint = mtp_state_dict(dict(weights.items()), n, bool(hfd.get("tie_word_embeddings")))
        if not checkpoint:
            raise ValueError(f"DeepseekV3ForCausalLM: speculative_method 'mtp': the checkpoint has no tensors of "
                             f"its multi-token prediction layer (model.layers.{n}.*)")
        kv_params = kv_params_for(cfg, self.kv_params.dtype, page_size=kvc.kv_cache_page_size,
                                  enable_prefix_caching=False, shape=self.kv_cache_shape(cfg))
        factory = self.weight_factory(pipeline_config, encoding, self.compute_dtype, self.device_refs[0], checkpoint,
                                      policy=session_policy(session))
        self.mtp_draft = MTPDraftModel(cfg, checkpoint, factory, kv_params, self.max_seq_len,
                                       self.batch_limit(), devices, session,
                                       self.device_refs[0], n, kvc)
        release = getattr(weights, "release_resident_pages", None)
        if callable(release):
            release()

    def build_step_graph(self, module: Module, kv_input_symbols: Any, device: Any, name: str, lora: Any = None,
                         signals: Any = None) -> Any:
        if self._with_mtp:
            module.return_hidden_states = True
        return super().build_step_graph(module, kv_input_symbols, device, name, lora, signals=signals)

    def prepare_initial_token_inputs(self, context_batch: Sequence[Any], kv_cache_inputs: Any = None,
                                     return_n_logits: int = 1) -> ModelInputs:
        if self._with_mtp:  # the rows of the next execute: (request, first position, count)
            self.last_rows = [(c.request_id, int(c.start_idx), len(c.next_tokens)) for c in context_batch]
        return super().prepare_initial_token_inputs(context_batch, kv_cache_inputs, return_n_logits)

    def execute(self, model_inputs: ModelInputs) -> ModelOutputs:
        if not self._with_mtp:
            return super().execute(model_inputs)
        logits, hidden = self.run_graph(model_inputs)
        self.last_hidden = hidden._torch()
        return ModelOutputs(logits=logits._torch())

    @classmethod
    def build_module(cls, cfg: DecoderConfig, factory: WeightFactory, kv_params: KVCacheParams,
                     max_seq_len: int) -> Any:
        return build_decoder(cfg, factory, kv_params, max_seq_len, make_mlp=_mlp,
                             make_attention=lambda c, i, f, kvp, n: MLAttention(c, i, f, kvp, n))
