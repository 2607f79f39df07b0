"""Hugging Face ``transformers`` fallback for causal LMs without a native architecture folder.

The model runs through transformers' own class (``AutoModelForCausalLM``) on the pipeline's device, behind
the same ``TextGenerationPipeline`` / ``LLM`` / ``max generate`` / ``max serve`` surface.  There is no
paged KV cache: each request keeps a transformers ``DynamicCache`` (:class:`RequestCaches` stands in for
the KV manager), and a step runs the batch's requests one after another.  Prompt echo (every
position's logits) is not supported.  The registry uses it when ``PipelineConfig.hf_fallback`` is on
(the default; ``--no-fallback`` turns it off) and transformers knows the model's class, with one warning
naming the architecture.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import torch

from max.nn.transformer import ReturnLogits
from max.pipelines.lib.pipeline import ModelInputs, ModelOutputs, PipelineModel, upper_bounded_default

__all__ = ["HFFallbackModel", "RequestCaches", "fallback_class"]


def fallback_class(name: str) -> Any:
    """transformers' causal-LM class called ``name``, or None."""
    import transformers

    cls = getattr(transformers, name, None)
    if cls is None or not (name.endswith("ForCausalLM") or name.endswith("LMHeadModel")):
        return None
    return cls


class RequestCaches:
    """Per-request transformers caches with the KV manager calls the pipeline makes."""

    def __init__(self, max_batch_size: int, max_seq_len: int) -> None:
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self._caches: dict[str, Any] = {}

    def contains(self, request_id: str) -> bool:
        return request_id in self._caches

    def claim(self, request_id: str) -> None:
        from transformers import DynamicCache

        if request_id in self._caches:
            raise ValueError(f"request {request_id!r} already has a cache")
        self._caches[request_id] = DynamicCache()

    external_claim = claim

    def release(self, request_id: str) -> None:
        self._caches.pop(request_id, None)

    def fetch(self, batch: Sequence[Any], num_steps: int = 1) -> list[Any]:
        for c in batch:
            if c.request_id not in self._caches:
                self.claim(c.request_id)
        return [self._caches[c.request_id] for c in batch]

    def step(self, batch: Sequence[Any]) -> None:
        """Nothing to do: transformers appended this step's keys/values to each request's cache."""

    @property
    def total_num_pages(self) -> int:
        """Request slots (there are no pages): every slot is free once every request was released."""
        return self.max_batch_size

    @property
    def num_free_pages(self) -> int:
        return self.max_batch_size - len(self._caches)


class HFFallbackModel(PipelineModel):
    """A transformers causal LM as a ``PipelineModel`` (see the module docstring)."""

    def __init__(self, pipeline_config: Any, session: Any, huggingface_config: Any, encoding: Any, devices: list,
                 kv_cache_config: Any, weights: Any, adapter: Any, return_logits: Any) -> None:
        super().__init__(pipeline_config, session, huggingface_config, encoding, devices, kv_cache_config, weights,
                         adapter, return_logits)
        import transformers

        from max.graph import DeviceRef
        from max.pipelines.architectures.common.weights import compute_dtype

        if return_logits is not None and ReturnLogits(return_logits) is not ReturnLogits.LAST_TOKEN:
            raise NotImplementedError(f"{huggingface_config.architectures}: the transformers fallback returns "
                                      "last-token logits only (no prompt echo / prompt log probabilities)")
        kv_dtype = getattr(kv_cache_config, "kv_cache_dtype", "auto")
        if kv_dtype in ("int8", "fp8_e4m3"):
            raise NotImplementedError(f"{huggingface_config.architectures}: the transformers fallback keeps its own "
                                      f"float KV cache; --kv-cache-dtype {kv_dtype} needs a natively supported "
                                      "architecture")
        t0 = time.perf_counter()
        mc = pipeline_config.model_config
        dev_ref = DeviceRef.from_device(devices[0])
        self.compute_dtype = compute_dtype(encoding, dev_ref)
        self.device = torch.device("cpu") if dev_ref.is_cpu() else torch.device("cuda", dev_ref.id)
        kw: dict[str, Any] = dict(dtype=self.compute_dtype.to_torch(), trust_remote_code=mc.trust_remote_code)
        if mc.gguf_file is not None:
            kw["gguf_file"] = mc.gguf_file.name
        self.model = transformers.AutoModelForCausalLM.from_pretrained(str(mc.model_dir), **kw).eval().to(self.device)
        self.max_seq_len = self.calculate_max_seq_len(pipeline_config, huggingface_config)
        self.kv_manager = RequestCaches(pipeline_config.max_batch_size or 16, self.max_seq_len)
        self.weights_seconds = time.perf_counter() - t0
        self.compile_seconds = 0.0

    @classmethod
    def calculate_max_seq_len(cls, pipeline_config: Any, huggingface_config: Any) -> int:
        hf = huggingface_config if huggingface_config is not None else pipeline_config.model_config.huggingface_config
        hf = getattr(hf, "text_config", None) or hf
        limit = getattr(hf, "max_position_embeddings", None) or getattr(hf, "n_positions", None) or 2048
        return upper_bounded_default(int(limit), pipeline_config.max_length)

    def prepare_initial_token_inputs(self, context_batch: Sequence[Any], kv_cache_inputs: Any = None,
                                     return_n_logits: int = 1) -> ModelInputs:
        caches = kv_cache_inputs if kv_cache_inputs is not None else self.kv_manager.fetch(context_batch)
        return ModelInputs(contexts=list(context_batch), caches=caches)

    def execute(self, model_inputs: ModelInputs) -> ModelOutputs:
        rows = []
        with torch.inference_mode():
            for ctx, cache in zip(model_inputs.contexts, model_inputs.caches):
                ids = torch.as_tensor(ctx.next_tokens, dtype=torch.long, device=self.device)[None]
                out = self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
                rows.append(out.logits[0, -1].float())
        return ModelOutputs(logits=torch.stack(rows) if rows else torch.zeros(0, device=self.device))
