"""``LLM``: offline text generation over the shared continuous-batching scheduler."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import os
import threading
import uuid
from typing import Any, Optional, Sequence

from max.interfaces import SamplingParams, TextGenerationRequest
from max.pipelines.lib.scheduler import StepOutput, TokenGenerationScheduler


def run_coro(coro: Any) -> Any:
    """Run a coroutine to completion from sync code, even when an event loop is running."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, coro).result()


def make_context(tokenizer: Any, pipeline_config: Any, prompt: str, sampling_params: SamplingParams, *,
                 request_id: Optional[str] = None, chat: bool = False, response_format: Optional[dict] = None,
                 images: Optional[Sequence[Any]] = None) -> Any:
    """A context for ``prompt`` (as a user turn through the chat template when ``chat``;
    ``response_format`` constrains the output, see :meth:`LLM.generate`); ValueError when the prompt
    does not fit the maximum length or the constraint is invalid.

    ``images`` (paths, encoded bytes, ``data:`` URIs or PIL images) go before the text in the user turn
    (the model's chat template decides where its image tokens go); a model without a chat template gets
    its image placeholders in front of the prompt.  A text-only model raises ValueError."""
    images = list(images or [])
    content: Any = prompt
    if images and getattr(getattr(tokenizer, "delegate", None), "chat_template", None) is not None or \
            images and getattr(getattr(tokenizer, "processor", None), "chat_template", None):
        chat = True
        content = [*({"type": "image", "image": im} for im in images), {"type": "text", "text": prompt}]
        images = []
    elif images:
        from max.pipelines.lib.images import image_bytes_of

        images = [image_bytes_of(im, f"image {i}") if not hasattr(im, "convert") else im for i, im in enumerate(images)]
    req = TextGenerationRequest(
        request_id=request_id or uuid.uuid4().hex, model_name=str(pipeline_config.model_config.model_path),
        prompt=None if chat else prompt, messages=[{"role": "user", "content": content}] if chat else None,
        sampling_params=sampling_params, response_format=response_format, images=images or None)
    return run_coro(tokenizer.new_context(req))


_DEFAULT_MAX_NEW_TOKENS = 100


class _Unset:
    """``LLM.generate``'s ``max_new_tokens`` when the caller did not pass it."""

    def __repr__(self) -> str:
        return str(_DEFAULT_MAX_NEW_TOKENS)


_UNSET: Any = _Unset()


def pipeline_config_of(pipeline_config: Any = None, model: Any = None, **kwargs: Any) -> Any:
    """The ``PipelineConfig`` of ``LLM``'s arguments: a ``PipelineConfig`` as is, or a model path (a
    model folder, a ``.gguf`` file or a cached repo id; positional or ``model=``, as vLLM writes it)
    with ``kwargs`` as more ``PipelineConfig`` options."""
    from max.pipelines.lib.config import PipelineConfig

    if pipeline_config is not None and model is not None:
        raise TypeError("LLM: give the model once (a PipelineConfig or a model path, or model=...)")
    target = pipeline_config if pipeline_config is not None else model
    if target is None:
        raise TypeError("LLM: missing the model: LLM(PipelineConfig(...)), LLM('path/to/model') or LLM(model=...)")
    if isinstance(target, PipelineConfig):
        if kwargs:
            raise TypeError(f"LLM: options {sorted(kwargs)} go into the PipelineConfig, not next to it")
        return target
    if isinstance(target, os.PathLike):
        target = os.fspath(target)
    if not isinstance(target, str):
        raise TypeError(f"LLM: expected a PipelineConfig or a model path, got {type(target).__name__}")
    return PipelineConfig(model_path=target, **kwargs)


class LLM:
    """A high level interface for generating text with an LLM (thread safe).

    ``LLM(pipeline_config)`` (the reference's form), or ``LLM("model folder | file.gguf | repo id")`` /
    ``LLM(model=...)`` with more ``PipelineConfig`` options as keywords (``LLM(model=p,
    max_length=512)``, ``chat_template="template.jinja"``)."""

    def __init__(self, pipeline_config: Any = None, *, model: Any = None, **kwargs: Any) -> None:
        from max.pipelines.lib.registry import PIPELINE_REGISTRY, register_all_models

        pipeline_config = pipeline_config_of(pipeline_config, model, **kwargs)
        register_all_models()
        self.pipeline_config = pipeline_config
        self.tokenizer, self.pipeline = PIPELINE_REGISTRY.retrieve(pipeline_config)
        self.scheduler = TokenGenerationScheduler(
            self.pipeline, self.tokenizer, max_batch_size=pipeline_config.max_batch_size or 16,
            prefill_token_budget=pipeline_config.prefill_chunk_size)
        self._lock = threading.Lock()

    def make_context(self, prompt: str, sampling_params: SamplingParams, *, request_id: Optional[str] = None,
                     chat: bool = False, response_format: Optional[dict] = None,
                     images: Optional[Sequence[Any]] = None) -> Any:
        """A ``TextContext`` for ``prompt`` (a user turn through the chat template when ``chat``);
        ``response_format`` constrains the output, ``images`` go with the prompt (see :meth:`generate`)."""
        return make_context(self.tokenizer, self.pipeline_config, prompt, sampling_params, request_id=request_id,
                            chat=chat, response_format=response_format, images=images)

    def generate(self, prompts: str | Sequence[str], max_new_tokens: int | None = _UNSET, use_tqdm: bool = True,
                 sampling_params: Optional[SamplingParams] = None, *, response_format: Optional[dict] = None,
                 images: Optional[Sequence[Any]] = None) -> Sequence[str]:
        """One completion per prompt (the continuation text only).

        ``max_new_tokens`` caps every output (None: up to the maximum length).  When it is not passed,
        the cap is ``sampling_params.max_new_tokens`` if that is set, else 100; an explicit
        ``max_new_tokens`` wins.  Without ``sampling_params`` decoding is greedy.

        ``response_format`` (as ``TextGenerationRequest.response_format``) constrains every output:
        ``{"type": "json_object"}``, ``{"type": "json_schema", "json_schema": {"name": ..., "schema":
        {...}}}``, or the extensions ``{"type": "regex", "regex": ...}``, ``{"type": "grammar",
        "grammar": <Lark or GBNF>}``, ``{"type": "choice", "choice": [...]}``.

        ``images`` (vision-language models): for one prompt, a list of images; for a list of prompts, one
        list (or None) per prompt.  An image is a local path, encoded bytes, a ``data:`` URI or a PIL image;
        a prompt with images becomes a user turn of the model's chat template, images first.

        Raises ValueError for empty or invalid prompts, images and constraints (before any work),
        RuntimeError when generation fails.
        """
        single = isinstance(prompts, str)
        plist = [prompts] if single else list(prompts)
        if not plist:
            raise ValueError("LLM.generate: prompts is empty")
        for i, p in enumerate(plist):
            if not isinstance(p, str) or not p:
                raise ValueError(f"LLM.generate: prompt {i} must be a non-empty str, got {p!r}")
        if sampling_params is not None and not isinstance(sampling_params, SamplingParams):
            raise TypeError(f"LLM.generate: sampling_params must be a SamplingParams, got "
                            f"{type(sampling_params).__name__}")
        base = sampling_params or SamplingParams(top_k=1)
        if max_new_tokens is _UNSET:
            max_new_tokens = _DEFAULT_MAX_NEW_TOKENS if base.max_new_tokens is None else base.max_new_tokens
        if max_new_tokens != base.max_new_tokens:
            base = dataclasses.replace(base, max_new_tokens=None if max_new_tokens is None else int(max_new_tokens))
        per_prompt = _images_per_prompt(images, single, len(plist))
        ctxs = [self.make_context(p, base, response_format=response_format, images=im)
                for p, im in zip(plist, per_prompt)]  # validates first
        results: dict[str, list[str]] = {c.request_id: [] for c in ctxs}
        errors: dict[str, str] = {}
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(ctxs), desc="Generating", unit="req")

        def on_output(out: StepOutput) -> None:
            results[out.request_id].append(out.text)
            if out.done:
                if out.error:
                    errors[out.request_id] = out.error
                if bar is not None:
                    bar.update(1)

        with self._lock:
            for c in ctxs:
                self.scheduler.submit(c, on_output, stop=list(base.stop or []))
            self.scheduler.run_until_idle()
        if bar is not None:
            bar.close()
        if errors:
            raise RuntimeError(f"LLM.generate: generation failed: {errors}")
        out = ["".join(results[c.request_id]) for c in ctxs]
        return out


def _images_per_prompt(images: Any, single: bool, n: int) -> list[Any]:
    """``LLM.generate``'s ``images`` as one list (or None) per prompt."""
    if images is None:
        return [None] * n
    if isinstance(images, (str, bytes)) or not isinstance(images, Sequence):
        raise ValueError("LLM.generate: images must be a list of images (one prompt) or a list of such lists")
    if single:
        return [list(images)]
    if len(images) != n:
        raise ValueError(f"LLM.generate: {n} prompts but {len(images)} image lists")
    out = []
    for i, im in enumerate(images):
        if im is not None and (isinstance(im, (str, bytes)) or not isinstance(im, Sequence)):
            raise ValueError(f"LLM.generate: images[{i}] must be a list of images or None")
        out.append(None if im is None else list(im))
    return out
