"""``LLM``: offline text generation over the shared continuous-batching scheduler."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import os
import threading
import uuid
import warnings
from typing import Any, Optional, Sequence

from max.interfaces import PipelineTask, SamplingParams, TextGenerationRequest
from max.pipelines.lib.scheduler import StepOutput, TokenGenerationScheduler


def run_coro(coro: Any) -> Any:
    """Run a coroutine to completion from sync code, even when an event loop is running."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, coro).result()


def has_chat_template(tokenizer: Any) -> bool:
    """Whether the model's tokenizer (or its multimodal processor) has a chat template."""
    return bool(getattr(getattr(tokenizer, "delegate", None), "chat_template", None)
                or getattr(getattr(tokenizer, "processor", None), "chat_template", None))


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
    if images and has_chat_template(tokenizer):
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
            self.pipeline, self.tokenizer, max_batch_size=pipeline_config.batch_size_for(PipelineTask.TEXT_GENERATION),
            prefill_token_budget=pipeline_config.prefill_chunk_size)
        self._lock = threading.Lock()
        self._chat_hint_given = False

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

        Prompts are continued as plain text: an instruct model answers a conversation through
        :meth:`chat` (which applies its chat template), and ``generate`` says so once (a warning) when the
        model has a chat template.

        Raises TypeError for prompts that are not strings, ValueError for empty or invalid prompts,
        images and constraints (before any work), RuntimeError when generation fails.
        """
        single = isinstance(prompts, str)
        if not single and (isinstance(prompts, (bytes, dict)) or not isinstance(prompts, Sequence)):
            raise TypeError(f"LLM.generate: prompts must be a str or a list of str, got {type(prompts).__name__}")
        plist = [prompts] if single else list(prompts)
        if not plist:
            raise ValueError("LLM.generate: prompts is empty")
        for i, p in enumerate(plist):
            if not isinstance(p, str):
                raise TypeError(f"LLM.generate: prompt {i} must be a str, got {type(p).__name__} ({p!r})")
            if not p:
                raise ValueError(f"LLM.generate: prompt {i} must be a non-empty str, got {p!r}")
        base = self._sampling(sampling_params, max_new_tokens, "generate")
        per_prompt = _images_per_prompt(images, single, len(plist))
        ctxs = [self.make_context(p, base, response_format=response_format, images=im)
                for p, im in zip(plist, per_prompt)]  # validates first
        if has_chat_template(self.tokenizer) and not any(per_prompt) and not self._chat_hint_given:
            self._chat_hint_given = True
            warnings.warn("LLM.generate continues the prompts as plain text, but this model has a chat template: "
                          "use LLM.chat([{'role': 'user', 'content': ...}]) to ask it as a conversation",
                          UserWarning, stacklevel=2)
        return self._run(ctxs, base, use_tqdm, "generate")

    def chat(self, messages: Sequence[Any], sampling_params: Optional[SamplingParams] = None,
             use_tqdm: bool = True, *, chat_template: Optional[str] = None, tools: Optional[list[dict]] = None,
             add_generation_prompt: bool = True, chat_template_kwargs: Optional[dict[str, Any]] = None,
             max_new_tokens: int | None = _UNSET, response_format: Optional[dict] = None) -> Sequence[str]:
        """Answer conversations through the model's chat template, as ``max serve``'s chat endpoint does.

        ``messages`` is one conversation (a list of ``{"role": ..., "content": ...}`` dicts, content a
        string or OpenAI-style parts) or a list of conversations; the result has one answer (the assistant
        text) per conversation.  ``chat_template`` replaces the tokenizer's template for these calls (the
        Jinja text, or the path of a file holding it); ``tools`` are OpenAI tool definitions the template
        renders; ``add_generation_prompt`` (default True) opens the assistant turn;
        ``chat_template_kwargs`` go to the template (e.g. ``{"enable_thinking": False}``).
        ``sampling_params``, ``max_new_tokens`` and ``response_format`` as in :meth:`generate`.

        Raises TypeError for messages of the wrong shape, ValueError when the model has no chat template
        and none is given, or a conversation does not fit (before any work), RuntimeError when
        generation fails."""
        convs = _conversations(messages)
        template = _template_text(chat_template)
        if template is None and not has_chat_template(self.tokenizer):
            raise ValueError(f"LLM.chat: {self.pipeline_config.model_config.model_path} has no chat template; "
                             "pass chat_template= (Jinja text or a file) or use LLM.generate for plain prompts")
        opts: dict[str, Any] = dict(chat_template_kwargs or {})
        opts["add_generation_prompt"] = bool(add_generation_prompt)
        if template is not None:
            opts["chat_template"] = template
        base = self._sampling(sampling_params, max_new_tokens, "chat")
        ctxs = []
        for conv in convs:  # validates every conversation before any work
            req = TextGenerationRequest(
                request_id=uuid.uuid4().hex, model_name=str(self.pipeline_config.model_config.model_path),
                messages=conv, tools=tools, chat_template_options=opts, sampling_params=base,
                response_format=response_format)
            ctxs.append(run_coro(self.tokenizer.new_context(req)))
        return self._run(ctxs, base, use_tqdm, "chat")

    @staticmethod
    def _sampling(sampling_params: Optional[SamplingParams], max_new_tokens: Any, what: str) -> SamplingParams:
        """The sampling parameters of one call: greedy when none are given, ``max_new_tokens`` applied."""
        if sampling_params is not None and not isinstance(sampling_params, SamplingParams):
            raise TypeError(f"LLM.{what}: sampling_params must be a SamplingParams, got "
                            f"{type(sampling_params).__name__}")
        base = sampling_params or SamplingParams(top_k=1)
        if max_new_tokens is _UNSET:
            max_new_tokens = _DEFAULT_MAX_NEW_TOKENS if base.max_new_tokens is None else base.max_new_tokens
        if max_new_tokens != base.max_new_tokens:
            base = dataclasses.replace(base, max_new_tokens=None if max_new_tokens is None else int(max_new_tokens))
        return base

    def _run(self, ctxs: list[Any], base: SamplingParams, use_tqdm: bool, what: str) -> list[str]:
        """Run ``ctxs`` to completion on the shared scheduler; their texts in order."""
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
            raise RuntimeError(f"LLM.{what}: generation failed: {errors}")
        return ["".join(results[c.request_id]) for c in ctxs]


def _conversations(messages: Any) -> list[list[dict]]:
    """``LLM.chat``'s ``messages`` as a list of conversations (each a non-empty list of message dicts)."""
    if isinstance(messages, (str, bytes, dict)) or not isinstance(messages, Sequence):
        raise TypeError("LLM.chat: messages must be a list of {'role': ..., 'content': ...} dicts (one "
                        f"conversation) or a list of such lists, got {type(messages).__name__}")
    if not messages:
        raise ValueError("LLM.chat: messages is empty")
    convs = [messages] if isinstance(messages[0], dict) else list(messages)
    out = []
    for i, conv in enumerate(convs):
        if isinstance(conv, (str, bytes, dict)) or not isinstance(conv, Sequence) or not conv:
            raise TypeError(f"LLM.chat: conversation {i} must be a non-empty list of message dicts, got {conv!r}")
        for j, m in enumerate(conv):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
                raise TypeError(f"LLM.chat: conversation {i}, message {j} must be a dict with 'role' and "
                                f"'content', got {m!r}")
        out.append([dict(m) for m in conv])
    return out


def _template_text(chat_template: Optional[str]) -> Optional[str]:
    """A chat template given as Jinja text or as the path of a file holding it."""
    if chat_template is None:
        return None
    if not isinstance(chat_template, (str, os.PathLike)):
        raise TypeError(f"LLM.chat: chat_template must be a str (Jinja text or a file path), got "
                        f"{type(chat_template).__name__}")
    text = os.fspath(chat_template)
    if "{" not in text and os.path.isfile(text):
        with open(text, encoding="utf-8") as f:
            return f.read()
    return text


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
