"""Hugging Face ``transformers`` fallback for causal LMs without a native architecture folder.

The model runs through transformers' own class (``AutoModelForCausalLM``) on the pipeline's device, behind
the same ``TextGenerationPipeline`` / ``LLM`` / ``max generate`` / ``max serve`` surface.  There is no
paged KV cache: each request keeps the per-request state transformers' own ``generate`` would give that
model class (:class:`RequestCaches` stands in for the KV manager):

* the cache object ``GenerationMixin._prepare_cache_for_generation`` builds for it (a ``DynamicCache``
  made from the model's config, whose layers are attention, sliding-window or linear-attention/SSM
  layers as the config says; a static cache when the model's generation config asks for one), or
  none for classes that make their own state in ``forward`` (RWKV, xLSTM, ...: the state returned by the
  first call is kept);
* each step's inputs made by the model's own ``prepare_inputs_for_generation`` from the request's whole
  token sequence (position ids, the slice of new tokens, ``is_first_iteration``).

A step runs the batch's requests one after another (one request per transformers call: the caches of
requests at different positions cannot be merged without padding, which changes recurrent models'
results); this is logged once.  Prompt echo (every position's logits) is not supported.

On load, :func:`self_check` runs a few greedy steps through this per-step path and compares them with one
full forward pass over the same tokens; a model whose per-step path disagrees is refused with an error
naming the architecture.  A model whose state cannot continue a prompt split into chunks (chunked prefill)
recomputes the request's prefix in one call instead.

The registry uses the fallback when ``PipelineConfig.hf_fallback`` is on (the default; ``--no-fallback``
turns it off) and transformers knows the model's class, with one warning naming the architecture.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

import numpy as np
import torch

from max.interfaces import PipelineTask
from max.nn.transformer import ReturnLogits
from max.pipelines.lib.pipeline import ModelInputs, ModelOutputs, PipelineModel, upper_bounded_default

__all__ = ["FallbackRefused", "HFFallbackModel", "RequestCaches", "RequestState", "fallback_class", "self_check"]

logger = logging.getLogger("max.pipelines")


def fallback_class(name: str) -> Any:
    """transformers' causal-LM class called ``name``, or None."""
    import transformers

    cls = getattr(transformers, name, None)
    if cls is None or not (name.endswith("ForCausalLM") or name.endswith("LMHeadModel")):
        return None
    return cls


class FallbackRefused(ValueError):
    """The transformers fallback will not serve this model (its per-step path gives wrong results)."""


class RequestState:
    """One request's transformers generation state: the keyword arguments ``generate`` would carry between
    steps (the cache, ``use_cache``, ``logits_to_keep``), how many tokens the cache holds and whether the
    next call is the request's first."""

    def __init__(self, kwargs: dict, max_cache_len: int | None = None) -> None:
        self.kwargs = kwargs
        self.max_cache_len = max_cache_len
        self.seen = 0
        self.first = True


class StepRunner:
    """The per-request step of a transformers causal LM, the way its ``generate`` prepares it."""

    def __init__(self, model: Any, max_cache_len: int) -> None:
        import inspect

        self.model = model
        self.max_cache_len = max_cache_len
        params = set(inspect.signature(model.forward).parameters)
        self.accepts_position_ids = "position_ids" in params
        self.logits_to_keep = "logits_to_keep" in params
        self.continuation_ok = True
        """Whether a request's state can take a multi-token chunk after earlier tokens (chunked
        prefill); when not, such a chunk recomputes the request from its first token."""

    def new_state(self, max_cache_len: int | None = None) -> RequestState:
        """Fresh per-request state: the cache the model's own ``_prepare_cache_for_generation`` makes for a
        one-sequence ``generate`` of at most ``max_cache_len`` tokens (default: the model's limit) -- none for
        classes that build their state in ``forward``.  A generation config asking for an offloaded cache
        gets the same cache without offloading when the model is not on an accelerator (there is nowhere to
        offload to; transformers' own offloading needs one)."""
        import copy

        kwargs: dict[str, Any] = {"use_cache": True}
        if self.logits_to_keep:
            kwargs["logits_to_keep"] = 1
        gen_cfg = copy.deepcopy(self.model.generation_config)
        gen_cfg.use_cache = True
        for k in ("num_beams", "num_return_sequences"):  # generate fills these in before preparing the cache
            if getattr(gen_cfg, k, None) is None:
                setattr(gen_cfg, k, 1)
        impl = getattr(gen_cfg, "cache_implementation", None)
        if isinstance(impl, str) and impl.startswith("offloaded") and self.model.device.type == "cpu":
            gen_cfg.cache_implementation = {"offloaded": None, "offloaded_static": "static"}.get(impl, impl)
        limit = self.max_cache_len if max_cache_len is None else min(max_cache_len, self.max_cache_len)
        self.model._prepare_cache_for_generation(gen_cfg, kwargs, None, 1, limit)
        return RequestState(kwargs, limit)

    def step(self, state: RequestState, tokens: Any, start: int) -> torch.Tensor:
        """Last-position logits (float32, shape [vocab]) after feeding ``tokens[start:]`` to ``state``,
        which holds ``tokens[:start]``; ``state`` is updated in place."""
        tokens = np.asarray(tokens)
        if start != state.seen or (start > 0 and len(tokens) - start > 1 and not self.continuation_ok):
            state.__dict__.update(vars(self.new_state(state.max_cache_len)))  # recompute the prefix in one call
            start = 0
        device = self.model.device
        ids = torch.as_tensor(tokens, dtype=torch.long, device=device)[None]
        kw = dict(state.kwargs)
        if self.accepts_position_ids:
            kw["position_ids"] = torch.arange(ids.shape[1], device=device)[None]
        inputs = self.model.prepare_inputs_for_generation(ids, next_sequence_length=ids.shape[1] - start,
                                                          is_first_iteration=state.first, **kw)
        out = self.model(**inputs, return_dict=True)
        state.kwargs = self.model._update_model_kwargs_for_generation(
            out, state.kwargs, is_encoder_decoder=bool(getattr(self.model.config, "is_encoder_decoder", False)))
        state.seen = ids.shape[1]
        state.first = False
        return out.logits[0, -1].float()


def self_check(runner: StepRunner, name: str, vocab_size: int, *, prompt_len: int = 6, steps: int = 4) -> None:
    """Refuse (:class:`FallbackRefused`) a model whose per-step path disagrees with one full forward pass:
    a prompt of ``prompt_len`` fixed pseudo-random tokens, then ``steps`` greedy tokens one at a time through
    :meth:`StepRunner.step`, against the logits of one uncached forward over the same tokens.  Also checks
    a prompt fed in two chunks; when only that disagrees, the runner recomputes chunked prompts in one call
    (``runner.continuation_ok = False``) instead of refusing."""
    model = runner.model
    rng = np.random.default_rng(1234)
    tokens = list(rng.integers(0, vocab_size, size=prompt_len))
    with torch.inference_mode():
        try:
            state = runner.new_state(prompt_len + steps + 1)  # a static cache stays this small
            stepped = [runner.step(state, tokens, 0)]
            for _ in range(steps):
                tokens.append(int(stepped[-1].argmax()))
                stepped.append(runner.step(state, tokens, len(tokens) - 1))
            ids = torch.as_tensor(tokens, dtype=torch.long, device=model.device)[None]
            full = model(input_ids=ids, use_cache=False, return_dict=True).logits[0].float()
        except Exception as e:  # noqa: BLE001 - any failure of the per-step path is a refusal
            raise FallbackRefused(_refusal(name, f"its per-step generation fails ({type(e).__name__}: {e})")) from e
        want = full[prompt_len - 1:]
        got = torch.stack(stepped)
        tol = _tolerance(model.dtype) * float(want.max() - want.min())
        err = (got - want).abs().amax(dim=-1)
        if not bool(torch.isfinite(got).all()) or bool((err > tol).any()):
            bad = int((err > tol).nonzero()[0, 0]) if bool((err > tol).any()) else 0
            raise FallbackRefused(_refusal(
                name, f"its cached per-step logits differ from a full forward pass of the same tokens "
                      f"(step {bad}: max |diff| {float(err[bad]):.3g} > {tol:.3g})"))
        # the prompt in two chunks (chunked prefill): the second chunk continues the first one's state
        half = prompt_len // 2
        try:
            state = runner.new_state(prompt_len + steps + 1)
            runner.step(state, tokens[:half], 0)
            chunked = runner.step(state, tokens[:prompt_len], half)
            ok = bool(torch.isfinite(chunked).all()) and float((chunked - want[0]).abs().max()) <= tol
        except Exception:  # noqa: BLE001 - a state that cannot continue: recompute instead
            ok = False
        if not ok:
            runner.continuation_ok = False
            logger.info("%s through transformers: a prompt split into chunks is recomputed from its first token "
                        "(its cache cannot continue a multi-token chunk)", name)


def _tolerance(dtype: Any) -> float:
    """Allowed max |logit diff| between the per-step and full paths, as a fraction of the logit range."""
    return 2e-3 if dtype in (torch.float32, torch.float64) else 6e-2


def _refusal(name: str, why: str) -> str:
    return (f"{name} cannot run through the transformers fallback: {why}, so it would produce wrong text. "
            f"libremax has no native implementation of {name}; it refuses the model rather than serve it "
            "(--no-fallback / PipelineConfig(hf_fallback=False) turns the fallback off for every model; "
            "`max list` shows the native architectures).")


class RequestCaches:
    """Per-request transformers generation states with the KV manager calls the pipeline makes."""

    def __init__(self, max_batch_size: int, max_seq_len: int, new_state: Callable[[int], Any]) -> None:
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self._new_state = new_state
        self._caches: dict[str, Any] = {}

    def contains(self, request_id: str) -> bool:
        return request_id in self._caches

    def claim(self, request_id: str) -> None:
        """Reserve a slot; the state is made on the request's first fetch (sized to its ``max_length``)."""
        if request_id in self._caches:
            raise ValueError(f"request {request_id!r} already has a cache")
        self._caches[request_id] = None

    external_claim = claim

    def release(self, request_id: str) -> None:
        self._caches.pop(request_id, None)

    def fetch(self, batch: Sequence[Any], num_steps: int = 1) -> list[Any]:
        for c in batch:
            if c.request_id not in self._caches:
                self.claim(c.request_id)
            if self._caches[c.request_id] is None:
                self._caches[c.request_id] = self._new_state(getattr(c, "max_length", None) or self.max_seq_len)
        return [self._caches[c.request_id] for c in batch]

    def step(self, batch: Sequence[Any]) -> None:
        """Nothing to do: each request's state was updated by its transformers call."""

    prefix_caching = False
    """No prefix cache: every request computes its whole prompt."""
    state_snapshot_interval = None
    """No recurrent-state snapshots."""

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
        from max.pipelines.architectures.common.weights import compute_dtype, session_policy

        if return_logits is not None and ReturnLogits(return_logits) is not ReturnLogits.LAST_TOKEN:
            raise NotImplementedError(f"{huggingface_config.architectures}: the transformers fallback returns "
                                      "last-token logits only (no prompt echo / prompt log probabilities)")
        t0 = time.perf_counter()
        mc = pipeline_config.model_config
        dev_ref = DeviceRef.from_device(devices[0])
        self.compute_dtype = compute_dtype(encoding, dev_ref, session_policy(session))
        kv_cache_config.refuse_kv_cache_dtype(
            f"{huggingface_config.architectures} (transformers fallback)", allowed=(self.compute_dtype,),
            why=f"transformers keeps its own KV cache in the model's dtype, {self.compute_dtype}; other cache dtypes "
                "need a natively supported architecture")
        kv_cache_config.refuse_swapping(f"{huggingface_config.architectures} (transformers fallback)")
        self.device = torch.device("cpu") if dev_ref.is_cpu() else torch.device("cuda", dev_ref.id)
        kw: dict[str, Any] = dict(dtype=self.compute_dtype.to_torch(), trust_remote_code=mc.trust_remote_code)
        if mc.gguf_file is not None:
            kw["gguf_file"] = mc.gguf_file.name
        self.model = transformers.AutoModelForCausalLM.from_pretrained(str(mc.model_dir), **kw).eval().to(self.device)
        name = ", ".join(getattr(huggingface_config, "architectures", None) or []) or type(self.model).__name__
        self.max_seq_len = self.calculate_max_seq_len(pipeline_config, huggingface_config)
        self.runner = StepRunner(self.model, self.max_seq_len)
        self.weights_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        text_cfg = self.model.config.get_text_config(decoder=True)
        vocab = int(getattr(text_cfg, "vocab_size", None) or self.model.get_output_embeddings().weight.shape[0])
        vocab = min(vocab, int(getattr(text_cfg, "unpadded_vocab_size", None) or vocab))  # ids with embeddings
        self_check(self.runner, name, vocab)
        self.compile_seconds = time.perf_counter() - t0
        self.kv_manager = RequestCaches(pipeline_config.batch_size_for(PipelineTask.TEXT_GENERATION), self.max_seq_len,
                                        self.runner.new_state)
        self._name = name
        self._logged_sequential = False

    @classmethod
    def calculate_max_seq_len(cls, pipeline_config: Any, huggingface_config: Any) -> int:
        hf = huggingface_config if huggingface_config is not None else pipeline_config.model_config.huggingface_config
        hf = getattr(hf, "text_config", None) or hf
        limit = getattr(hf, "max_position_embeddings", None) or getattr(hf, "n_positions", None)
        limit = int(limit) if isinstance(limit, int) and limit > 0 else 2048  # XLNet says -1: no limit
        return upper_bounded_default(limit, pipeline_config.max_length)

    def prepare_initial_token_inputs(self, context_batch: Sequence[Any], kv_cache_inputs: Any = None,
                                     return_n_logits: int = 1) -> ModelInputs:
        caches = kv_cache_inputs if kv_cache_inputs is not None else self.kv_manager.fetch(context_batch)
        return ModelInputs(contexts=list(context_batch), caches=caches)

    def execute(self, model_inputs: ModelInputs) -> ModelOutputs:
        if len(model_inputs.contexts) > 1 and not self._logged_sequential:
            self._logged_sequential = True
            logger.info("%s through transformers: a batch's requests run one after another (per-request "
                        "transformers caches at different positions are not merged into one batch)", self._name)
        rows = []
        with torch.inference_mode():
            for ctx, state in zip(model_inputs.contexts, model_inputs.caches):
                rows.append(self.runner.step(state, ctx.tokens[:ctx.active_idx], ctx.start_idx))
        return ModelOutputs(logits=torch.stack(rows) if rows else torch.zeros(0, device=self.device))
