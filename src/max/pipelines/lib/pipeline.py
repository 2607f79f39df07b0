"""``TextGenerationPipeline`` and the per-architecture ``PipelineModel`` contract.

One ``execute(inputs)`` call runs up to ``num_steps`` model steps for a batch
of requests (ragged: prefill chunks and decode tokens of different requests
share a step), samples the next token of each request, and returns each
request's new tokens.  The paged KV cache keeps every request's keys and
values between calls; ``release(request_id)`` frees its pages.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncGenerator, Iterator, Optional, Sequence

import numpy as np
import torch

from max.driver import Buffer, load_devices
from max.engine import InferenceSession
from max.interfaces import GenerationStatus, Pipeline, PipelineTask, StepPlan, TextGenerationInputs, TextGenerationOutput
from max.nn.transformer import ReturnLogits
from max.pipelines.lib.config import batch_size_for
from max.pipelines.lib.cuda_graph_decode import plain_greedy
from max.pipelines.lib.scheduler import prefill_chunk_size_of
from max.pipelines.lib.step_plan import StepCapabilities, StepPlanner

logger = logging.getLogger("max.pipelines")

__all__ = ["BatchInfo", "GenerateMixin", "KVCacheMixin", "ModelInputs", "ModelOutputs", "PipelineModel",
           "TextGenerationPipeline", "get_paged_manager", "upper_bounded_default"]


class ModelInputs:
    """The tensors of one model step; iterating yields them in graph-input order."""

    kv_cache_inputs: Any = None
    lora_ids: Any = None
    lora_ranks: Any = None

    def __init__(self, tokens: Any = None, input_row_offsets: Any = None, kv_cache_inputs: Any = None,
                 return_n_logits: Any = None, **extra: Any) -> None:
        self.tokens = tokens
        self.input_row_offsets = input_row_offsets
        self.return_n_logits = return_n_logits
        self.kv_cache_inputs = kv_cache_inputs
        for k, v in extra.items():
            setattr(self, k, v)

    def __iter__(self) -> Iterator[Any]:
        for name in ("tokens", "input_row_offsets", "return_n_logits"):
            v = getattr(self, name, None)
            if v is not None:
                yield v

    def update(self, **kwargs: Any) -> None:
        for k, v in kwargs.items():
            setattr(self, k, v)


@dataclass
class ModelOutputs:
    logits: Any
    next_token_logits: Any = None
    logit_offsets: Any = None
    greedy_tokens: Any = None
    """The argmax of each row of ``logits``, computed on the device (a CUDA-graph decode step), or None."""


def upper_bounded_default(upper_bound: int, default: Optional[int]) -> int:
    """``default`` (or ``upper_bound`` when None); ValueError when ``default`` exceeds ``upper_bound``."""
    if default is None:
        return upper_bound
    if default > upper_bound:
        raise ValueError(f"default {default} is larger than the upper bound {upper_bound}")
    return default


@dataclass
class BatchInfo:
    """What one pipeline call runs: each request's context length (tokens already cached), its new
    tokens this step (the prompt length, or 1 when decoding), and the number of steps."""

    past_seq_lens: list[int]
    seq_lens: list[int]
    num_steps: int


class KVCacheMixin:
    """Builds a pipeline model's paged KV cache from its architecture's answers to three questions
    (classmethods to implement): :meth:`get_kv_params`, :meth:`get_num_layers` and
    :meth:`estimate_kv_cache_size`.  :meth:`load_kv_manager` needs ``pipeline_config``,
    ``huggingface_config``, ``devices`` and ``kv_cache_config`` attributes (as ``PipelineModel`` has)."""

    @classmethod
    @abc.abstractmethod
    def get_kv_params(cls, huggingface_config: Any, n_devices: int, kv_cache_config: Any, cache_dtype: Any) -> Any:
        """The model's ``KVCacheParams``."""

    @classmethod
    @abc.abstractmethod
    def get_num_layers(cls, huggingface_config: Any) -> int:
        """The number of layers that keep a KV cache."""

    @classmethod
    @abc.abstractmethod
    def estimate_kv_cache_size(cls, pipeline_config: Any, available_cache_memory: int, devices: list[Any],
                               huggingface_config: Any, kv_cache_config: Any, cache_dtype: Any) -> int:
        """Bytes the KV cache will take."""

    def load_kv_manager(self, session: InferenceSession, available_cache_memory: Optional[int]) -> Any:
        """A ``PagedKVCacheManager`` over this model's devices holding at most ``available_cache_memory``
        bytes (None: room for ``max_batch_size`` sequences of the model's maximum length)."""
        from max.nn.kv_cache import PagedKVCacheManager

        missing = [a for a in ("pipeline_config", "huggingface_config", "devices", "kv_cache_config")
                   if not hasattr(self, a)]
        if missing:
            raise AttributeError(f"{type(self).__name__}.load_kv_manager needs the attributes {', '.join(missing)}")
        pc, hf, devices, kvc = self.pipeline_config, self.huggingface_config, list(self.devices), self.kv_cache_config
        cache_dtype = getattr(kvc, "cache_dtype", None) or getattr(getattr(self, "encoding", None), "dtype", None)
        params = self.get_kv_params(hf, len(devices), kvc, cache_dtype)
        max_seq_len = self.calculate_max_seq_len(pc, hf) if hasattr(self, "calculate_max_seq_len") else \
            int(pc.max_length)
        slots = batch_size_for(getattr(pc, "max_batch_size", None),
                               getattr(self, "batch_workload", PipelineTask.TEXT_GENERATION))
        return PagedKVCacheManager(params, max_batch_size=slots, max_seq_len=max_seq_len,
                                   num_layers=self.get_num_layers(hf), devices=devices, session=session,
                                   available_cache_memory=available_cache_memory)


def get_paged_manager(pipeline: Any) -> Any:
    """The ``PagedKVCacheManager`` a pipeline runs on (its first KV manager of that kind), or None."""
    from max.nn.kv_cache import PagedKVCacheManager

    for mgr in getattr(pipeline, "kv_managers", None) or []:
        if isinstance(mgr, PagedKVCacheManager):
            return mgr
    return None


class GenerateMixin:
    """``generate(prompts)`` / ``generate_async(prompts)`` for a pipeline with ``tokenizer``, ``execute``
    and ``release``: each prompt (a ``TextGenerationRequest``) becomes a context, all of them run together
    one step per ``execute`` call until done, and their KV cache is released."""

    def generate(self, prompts: Any) -> list[TextGenerationOutput]:
        """One finished ``TextGenerationOutput`` per prompt (all its tokens), in the prompts' order.
        Inside a running event loop, use :meth:`generate_async`."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._collect(prompts))
        raise RuntimeError(f"{type(self).__name__}.generate: called inside a running event loop; "
                           "iterate generate_async(prompts) instead")

    async def _collect(self, prompts: Any) -> list[TextGenerationOutput]:
        done: dict[str, list[TextGenerationOutput]] = {}
        async for step in self.generate_async(prompts):
            for out in step:
                done.setdefault(out.request_id, []).append(out)
        results = []
        for rid, parts in done.items():
            lps = [lp for p in parts for lp in (p.log_probabilities or [])]
            results.append(TextGenerationOutput(request_id=rid, tokens=[t for p in parts for t in p.tokens],
                                                final_status=parts[-1].final_status, log_probabilities=lps or None))
        return results

    async def generate_async(self, prompts: Any) -> AsyncGenerator[list[TextGenerationOutput], None]:
        """Yields, after each step, every unfinished prompt's new tokens (one output per prompt)."""
        requests = list(prompts) if isinstance(prompts, (list, tuple)) else [prompts]
        if not requests:
            raise ValueError(f"{type(self).__name__}.generate: no prompts")
        tokenizer = getattr(self, "tokenizer")
        batch: dict[str, Any] = {}
        for req in requests:
            ctx = await tokenizer.new_context(req)
            if ctx.request_id in batch:
                raise ValueError(f"{type(self).__name__}.generate: request id {ctx.request_id!r} given twice")
            batch[ctx.request_id] = ctx
        order = list(batch)
        try:
            while batch:
                outs = self.execute(TextGenerationInputs([dict(batch)], num_steps=1))  # type: ignore[attr-defined]
                yield [outs[rid] for rid in order if rid in outs]
                for rid, out in outs.items():
                    if out.is_done:
                        batch.pop(rid, None)
                        self.release(rid)  # type: ignore[attr-defined]
        finally:
            for rid in list(batch):
                self.release(rid)  # type: ignore[attr-defined]


class PipelineModel(abc.ABC):
    """A compiled model of one architecture plus its KV cache manager."""

    batch_workload: str = PipelineTask.TEXT_GENERATION.value
    """The workload whose ``MAX_BATCH_SIZE_DEFAULTS`` entry (``max.pipelines.lib.config``) gives
    :meth:`batch_limit` when ``PipelineConfig.max_batch_size`` is unset (speech and embedding families
    override it)."""

    def batch_limit(self) -> int:
        """Requests sharing a step: the KV cache's slots (and the scheduler's limit, from the same field)."""
        return batch_size_for(getattr(self.pipeline_config, "max_batch_size", None), self.batch_workload)

    def __init__(self, pipeline_config: Any, session: InferenceSession, huggingface_config: Any, encoding: Any,
                 devices: list[Any], kv_cache_config: Any, weights: Any, adapter: Any,
                 return_logits: ReturnLogits) -> None:
        self.pipeline_config = pipeline_config
        self.session = session
        self.huggingface_config = huggingface_config
        self.encoding = encoding
        self.devices = devices
        self.kv_cache_config = kv_cache_config
        self.weights = weights
        self.adapter = adapter
        self.return_logits = return_logits
        self.kv_manager: Any = None

    @classmethod
    @abc.abstractmethod
    def calculate_max_seq_len(cls, pipeline_config: Any, huggingface_config: Any) -> int: ...

    @property
    def dtype(self) -> Any:
        return self.encoding.dtype

    @property
    def lora_manager(self) -> Any:
        """The model's LoRA adapters (a ``LoRAManager``), or None: a model built without LoRA."""
        return None

    def prepare_contexts(self, ctxs: Sequence[Any]) -> None:
        """Called by the pipeline before it fetches the KV cache for a step, with the step's contexts at
        their planned indices; a model whose computation depends on a request's length may adjust them here
        (Phi-3 LongRoPE recomputes a request crossing its original context).  Default: nothing."""

    def draft_token_limit(self, ctx: Any) -> Optional[int]:
        """The most draft tokens a speculative verification step may add to ``ctx`` (None: any)."""
        return None

    @abc.abstractmethod
    def execute(self, model_inputs: ModelInputs) -> ModelOutputs: ...

    @abc.abstractmethod
    def prepare_initial_token_inputs(self, context_batch: Sequence[Any], kv_cache_inputs: Any = None,
                                     return_n_logits: int = 1) -> ModelInputs: ...

    def prepare_next_token_inputs(self, next_tokens: Any, prev_model_inputs: ModelInputs) -> ModelInputs:
        raise NotImplementedError

    def compute_log_probabilities(self, *a: Any, **k: Any) -> Any:
        return None

    @classmethod
    def estimate_weights_size(cls, pipeline_config: Any) -> int:
        return int(pipeline_config.model_config.weights_size())

    @classmethod
    def estimate_activation_memory(cls, pipeline_config: Any, huggingface_config: Any) -> int:
        return 0

    @classmethod
    def infer_optimal_batch_size(cls, pipeline_config: Any, available_cache_memory: int, huggingface_config: Any,
                                 devices: list[Any], kv_cache_config: Any, cache_dtype: Any) -> int:
        """How many sequences of the model's maximum length fit in ``available_cache_memory`` (>= 1),
        from the model's KV cache parameters (a :class:`KVCacheMixin` model's; other models override this)."""
        from max.nn.kv_cache import PagedKVCacheManager

        if not issubclass(cls, KVCacheMixin):
            raise NotImplementedError(f"{cls.__name__}: infer_optimal_batch_size needs the model's KV cache "
                                      "parameters (implement KVCacheMixin or override it)")
        params = cls.get_kv_params(huggingface_config, len(devices), kv_cache_config, cache_dtype)
        num_layers = cls.get_num_layers(huggingface_config)
        return PagedKVCacheManager.infer_optimal_batch_size(
            params, cls.calculate_max_seq_len(pipeline_config, huggingface_config), num_layers,
            available_cache_memory, devices)


def build_pipeline_model(pipeline_config: Any, pipeline_model: type, weight_adapters: Any,
                         return_logits: Any) -> tuple[list[Any], PipelineModel]:
    """The devices and the ``PipelineModel`` for a resolved config: one session on its devices,
    its weight files opened (memory-mapped), the model class built on them."""
    from max.graph.weights import load_weights

    mc = pipeline_config.model_config
    if not mc.weight_path:
        raise ValueError(f"no weight files found for {mc.model_path!r}")
    devices = load_devices(mc.device_specs)
    session = InferenceSession(devices=devices, num_threads=getattr(pipeline_config, "num_threads", None))
    weights = load_weights(list(mc.weight_path))
    model = pipeline_model(
        pipeline_config=pipeline_config, session=session, huggingface_config=mc.huggingface_config,
        encoding=mc.quantization_encoding, devices=devices, kv_cache_config=mc.kv_cache_config,
        weights=weights, adapter=(weight_adapters or {}).get(mc.weights_format), return_logits=return_logits)
    return devices, model


class TextGenerationPipeline(GenerateMixin, Pipeline):
    """Generates text for batches of ``TextContext`` with one ``PipelineModel``.

    Each step runs a :class:`~max.interfaces.StepPlan` made by the step planner (``step_plan.py``): the
    scheduler's, handed in ``TextGenerationInputs.plan``, or -- for a direct ``execute`` call without one --
    a planner with the config's prefill chunk size.  The pipeline sets each context to its planned step,
    runs the model, samples where the plan says so, and decides nothing itself.  What it can do that
    changes a plan it declares in :attr:`step_capabilities`."""

    _force_all_logits = False
    """A subclass that needs every position's logits (verifying speculative drafts) sets this."""

    def __init__(self, pipeline_config: Any, pipeline_model: type, eos_token_id: int, weight_adapters: Any,
                 tokenizer: Any) -> None:
        t0 = time.perf_counter()
        self._pipeline_config = pipeline_config
        self._tokenizer = tokenizer
        self._eos_token_id = eos_token_id
        # every position's logits: echo (prompt log probabilities) or a subclass verifying drafts
        self._all_logits = bool(getattr(pipeline_config, "enable_echo", False)) or self._force_all_logits
        self._devices, self._pipeline_model = build_pipeline_model(
            pipeline_config, pipeline_model, weight_adapters,
            ReturnLogits.ALL if self._all_logits else ReturnLogits.LAST_TOKEN)
        self._log_softmax_model: Any = None
        from max.pipelines.lib.sampling.sampling import GeneratorCache

        self._generators = GeneratorCache()
        self.load_seconds = time.perf_counter() - t0

    # ---------------------------------------------------------------- API
    @property
    def pipeline_config(self) -> Any:
        return self._pipeline_config

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def kv_managers(self) -> list[Any]:
        return [self._pipeline_model.kv_manager]

    @property
    def echo_enabled(self) -> bool:
        """Whether the model returns every position's logits, so echoing requests get their prompt's
        log probabilities (``PipelineConfig.enable_echo``)."""
        return self._all_logits

    @property
    def pipeline_model(self) -> PipelineModel:
        return self._pipeline_model

    @property
    def step_capabilities(self) -> StepCapabilities:
        """What this pipeline can do that changes a step's plan: its KV manager's prefix cache and state
        snapshots, its model's LoRA adapters (see :class:`~max.pipelines.lib.step_plan.StepCapabilities`)."""
        mgr = self._pipeline_model.kv_manager
        return StepCapabilities(prefix_cache=mgr if mgr.prefix_caching else None,
                                snapshot_interval=mgr.state_snapshot_interval,
                                adapters=self._pipeline_model.lora_manager)

    def calculate_num_steps(self, num_steps: int, context: Any) -> int:
        """``num_steps`` capped by what the request's ``max_length`` leaves."""
        left = context.max_length - context.current_length
        if left <= 0:
            raise ValueError(f"request {context.request_id}: already at max_length {context.max_length}")
        return max(1, min(num_steps, left))

    def release(self, request_id: str) -> None:
        mgr = self._pipeline_model.kv_manager
        if mgr.contains(request_id):
            mgr.release(request_id)
        self._generators.release(request_id)

    def prepare_batch(self, batches: list[dict[str, Any]], num_steps: int) -> tuple[ModelInputs, int, Any]:
        ctxs = [c for b in batches for c in b.values()]
        kv = self._pipeline_model.kv_manager.fetch(ctxs, num_steps)
        return self._pipeline_model.prepare_initial_token_inputs(ctxs, kv), num_steps, None

    def execute(self, inputs: TextGenerationInputs) -> dict[str, TextGenerationOutput]:
        """Runs ``inputs.plan`` (one step), or without a plan ``inputs.num_steps`` steps, each planned by a
        :class:`StepPlanner` with the config's prefill chunk size (a direct call, as MAX's pipelines take)."""
        batch = inputs.batch
        if inputs.plan is not None and inputs.num_steps != 1:
            raise ValueError(f"{type(self).__name__}.execute: a StepPlan covers one step, but num_steps is "
                             f"{inputs.num_steps}")
        mgr = self._pipeline_model.kv_manager
        for rid in batch:
            if not mgr.contains(rid):
                mgr.external_claim(rid)
        planner = None if inputs.plan is not None else \
            StepPlanner(prefill_chunk_size_of(self._pipeline_config), self.step_capabilities)
        for _ in range(inputs.num_steps):
            active = [c for c in batch.values() if not c.is_done]
            if not active:
                break
            self._run_step(active, inputs.plan if planner is None else planner.plan(active))
        return {rid: ctx.to_generation_output() for rid, ctx in batch.items()}

    def _run_step(self, ctxs: list[Any], plan: StepPlan) -> None:
        """One step over the unfinished contexts as ``plan`` says (subclasses split it, e.g. speculative
        decoding)."""
        self._step(ctxs, plan)

    # ---------------------------------------------------------------- log probabilities
    def _log_softmax(self) -> Any:
        """The compiled ``log_probabilities_ragged_graph`` (log-softmax over the vocabulary) on the
        model's device, built on first use."""
        if self._log_softmax_model is None:
            from max.graph import DeviceRef
            from max.pipelines.lib.log_probabilities import log_probabilities_ragged_graph

            dev = DeviceRef.from_device(self._devices[0])
            self._log_softmax_model = self._pipeline_model.session.load(
                log_probabilities_ragged_graph(dev, levels=3))
        return self._log_softmax_model

    def _prompt_log_probabilities(self, ctxs: list[Any], logits: torch.Tensor, starts: Any, ends: Any) -> None:
        """For contexts that echo with log probabilities, the log probabilities of the prompt tokens this
        step's rows score (row i scores token i + 1; the prompt's last row scores the first new token,
        which sampling handles), computed by the log-softmax graph and kept on the context until its
        first token is sampled."""
        from max.pipelines.lib.log_probabilities import log_probabilities_of

        for i, c in enumerate(ctxs):
            if not _prompt_lp_wanted(c) or c.start_idx >= c.prompt_len - 1:
                continue
            n = min(c.active_idx, c.prompt_len - 1) - c.start_idx
            lo = int(starts[i])
            lp = log_probabilities_of(logits[lo:lo + n], c.tokens[c.start_idx + 1:c.start_idx + 1 + n],
                                      int(c.log_probabilities), self._log_softmax())
            c.prompt_log_probability_parts.append(lp)

    # ---------------------------------------------------------------- one step
    def _step(self, ctxs: list[Any], plan: StepPlan) -> None:
        """One model call running each context's step of ``plan`` (prompt chunks and decode tokens
        together), then sampling the contexts whose step samples."""
        steps = [plan.step_for(c) for c in ctxs]
        pending = [c.active_idx for c in ctxs]
        mgr = self._pipeline_model.kv_manager
        try:
            for c, s in zip(ctxs, steps):
                c.set_token_indices(active_idx=s.end)
            self._pipeline_model.prepare_contexts(ctxs)
            kv = mgr.fetch(ctxs, 1)  # the prefix cache may advance start_idx; the step keeps its end
            out = self._pipeline_model.execute(self._pipeline_model.prepare_initial_token_inputs(ctxs, kv))
        except BaseException:  # nothing ran: every request keeps all it had pending (for a retry)
            for c, end in zip(ctxs, pending):
                c.set_token_indices(active_idx=end)
            raise
        logits = out.logits
        if self._all_logits:  # every position's logits: keep the prompts' for echo, sample from the last rows
            lens = [c.active_length for c in ctxs]
            ends = np.cumsum(lens)
            self._prompt_log_probabilities(ctxs, logits, ends - np.asarray(lens), ends)
            logits = logits[torch.as_tensor(ends - 1, device=logits.device)]
        sample_rows = [i for i, s in enumerate(steps) if s.samples]
        if sample_rows:
            from max.pipelines.lib.sampling.sampling import sample_for_contexts

            rows = [ctxs[i] for i in sample_rows]
            lg = logits if len(sample_rows) == len(ctxs) else logits[torch.tensor(sample_rows)]
            if out.greedy_tokens is not None and len(sample_rows) == len(ctxs) and not self._all_logits \
                    and all(plain_greedy(c) for c in rows):
                toks = out.greedy_tokens  # chosen on the device: only the token ids come back
            else:
                toks = sample_for_contexts(lg, rows, self._generators)
            logprobs = _with_prompt_parts(rows, _sampled_log_probabilities(lg, toks, rows))
            toks = toks.tolist()
            for c, t, lp in zip(rows, toks, logprobs):
                c.update(int(t), lp)
            _advance_grammars(rows, toks)
        for c, s, end in zip(ctxs, steps, pending):
            if not s.samples:  # a prompt chunk: the rest of the prompt is pending for the next step
                c.set_token_indices(start_idx=c.active_idx, active_idx=end)
        mgr.step(ctxs)


def _prompt_lp_wanted(c: Any) -> bool:
    return bool(c.log_probabilities_echo) and int(c.log_probabilities or 0) > 0


def _with_prompt_parts(ctxs: list[Any], logprobs: list[Any]) -> list[Any]:
    """Echo: the first sampled token's entry is preceded by the prompt tokens' (MAX's layout: one
    ``LogProbabilities`` covering prompt tokens 1.. and then the sampled token)."""
    from max.interfaces import LogProbabilities

    out = list(logprobs)
    for i, c in enumerate(ctxs):
        parts = c.prompt_log_probability_parts
        if not parts or out[i] is None:
            continue
        allp = [*parts, out[i]]
        out[i] = LogProbabilities(token_log_probabilities=[v for p in allp for v in p.token_log_probabilities],
                                  top_log_probabilities=[d for p in allp for d in p.top_log_probabilities])
        parts.clear()
    return out


def _advance_grammars(ctxs: list[Any], tokens: list[int]) -> None:
    """Advance the grammar matcher of each constrained context by its new token; a grammar that has
    ended (or rejected the token: a logits processor forced it) ends the request."""
    pairs = [(c, t) for c, t in zip(ctxs, tokens) if c.matcher is not None]
    if not pairs:
        return
    from max.pipelines.lib.structured_output import advance_matchers

    oks = advance_matchers([c.matcher for c, _ in pairs], [t for _, t in pairs])
    for (c, _), ok in zip(pairs, oks):
        if not c.is_done and (not ok or c.matcher.is_stopped()):
            c.status = GenerationStatus.END_OF_SEQUENCE


def _sampled_log_probabilities(logits: torch.Tensor, tokens: torch.Tensor, ctxs: list[Any]) -> list[Any]:
    """Per context, the ``LogProbabilities`` of its sampled token (raw model logits: before
    penalties and temperature, as OpenAI and vLLM report them), or None when not asked for."""
    want = [int(c.log_probabilities or 0) for c in ctxs]
    if not any(want):
        return [None] * len(ctxs)
    from max.pipelines.lib.log_probabilities import compute_log_probabilities_ragged

    n = len(ctxs)
    return compute_log_probabilities_ragged(
        None, None, input_row_offsets=np.arange(n + 1), logits=None, next_token_logits=logits,
        tokens=np.zeros(n, np.int64), sampled_tokens=tokens.cpu().numpy(), batch_top_n=want,
        batch_echo=[False] * n)


def logits_to_torch(buf: Any) -> torch.Tensor:
    return buf._torch() if hasattr(buf, "_torch") else torch.as_tensor(np.asarray(buf))


_ = (Buffer, GenerationStatus)
