"""Pipeline tokenizers over Hugging Face tokenizers.

* :func:`load_hf_tokenizer` loads a ``transformers`` tokenizer from a model folder, a
  repo id in the local HF cache, or a GGUF file (byte-level BPE vocabularies are built
  directly from the GGUF metadata in well under a second, see ``gguf_tokenizer``).
* :class:`TextTokenizer` is the ``PipelineTokenizer`` text pipelines use: encode /
  decode, chat templates, and ``new_context(request) -> TextContext``.
* :class:`PreTrainedPipelineTokenizer` wraps an existing HF tokenizer;
  :class:`IdentityPipelineTokenizer` passes strings through.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar

import numpy as np
import numpy.typing as npt

from max.interfaces import TextGenerationRequest, TextGenerationRequestMessage, TextGenerationRequestTool
from max.interfaces.errors import EmptyPrompt, InvalidRequest, InvalidRequestType, PromptTooLong
from max.pipelines.core import ImageMetadata, TextAndVisionContext, TextContext
from max.pipelines.lib.chat_template import client_template_errors
from max.pipelines.lib.gguf_utils import is_gguf_file
from max.pipelines.lib.hf_utils import eos_token_ids_from_configs, generate_local_model_path, load_generation_config

if TYPE_CHECKING:  # pragma: no cover
    from max.pipelines.lib.config import PipelineConfig

logger = logging.getLogger("max.pipelines")

_R = TypeVar("_R")

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


async def run_with_default_executor(fn: Callable[..., _R], *args: Any, **kwargs: Any) -> _R:
    """Run the blocking ``fn(*args, **kwargs)`` in the event loop's default executor."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, functools.partial(fn, *args, **kwargs))


def max_tokens_to_generate(prompt_size: int, max_length: Optional[int], max_new_tokens: Optional[int] = None
                           ) -> Optional[int]:
    """How many new tokens a request may generate: ``max_length - prompt_size`` capped by
    ``max_new_tokens``; None when neither bound is known."""
    if max_length is None:
        return max_new_tokens
    room = max_length - prompt_size
    if max_new_tokens is None or max_new_tokens < 0:
        return room
    return min(max_new_tokens, room)


def _find_gguf(folder: Path) -> Optional[Path]:
    ggufs = sorted(folder.glob("*.gguf"))
    return ggufs[0] if ggufs else None


def load_hf_tokenizer(source: str | os.PathLike, *, revision: Optional[str] = None,
                      trust_remote_code: bool = False) -> Any:
    """A fast tokenizer for a GGUF file, a model folder (tokenizer files, or else a GGUF file in it),
    or a repo id in the local HF cache: a ``transformers`` one, or for a GGUF BPE vocabulary (byte-level
    or SentencePiece) a :class:`~max.pipelines.lib.gguf_tokenizer.GGUFTokenizer` with the same
    interface (no transformers import).  Offline only."""
    from max.pipelines.lib.gguf_tokenizer import hf_tokenizer_from_gguf

    p = os.path.expanduser(os.fspath(source))
    if os.path.isfile(p):
        if is_gguf_file(p):
            return hf_tokenizer_from_gguf(p)
        p = os.path.dirname(os.path.abspath(p))
    if not os.path.isdir(p):
        p = generate_local_model_path(p, revision or "main")
    folder = Path(p)
    if any((folder / f).is_file() for f in _TOKENIZER_FILES):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    gguf = _find_gguf(folder)
    if gguf is not None:
        return hf_tokenizer_from_gguf(gguf)
    raise FileNotFoundError(f"{folder}: no tokenizer files ({', '.join(_TOKENIZER_FILES)}) and no GGUF file")


def _flatten_content(messages: Sequence[TextGenerationRequestMessage]) -> list[dict[str, Any]]:
    """OpenAI content-part lists -> plain strings (text parts joined by newlines); ValueError for image
    parts (a text-only model) and unknown part types."""
    out, images = _split_images(messages)
    if images:
        raise InvalidRequest("this model's tokenizer takes text only; the message has an image part", param="images")
    if video_parts(out):
        raise InvalidRequest("this model's tokenizer takes text only; the message has a video part", param="video_url")
    for m in out:
        if isinstance(m["content"], list):
            m["content"] = "\n".join(p["text"] for p in m["content"])
    return out


class _HFTokenizerMixin:
    """Encode/decode/chat-template logic shared by the HF-backed tokenizers."""

    delegate: Any
    max_length: Optional[int]

    @property
    def eos(self) -> int:
        """The end of sequence token for this tokenizer."""
        eos = self.delegate.eos_token_id
        if eos is None:
            raise ValueError("the tokenizer has no EOS token")
        return int(eos)

    @property
    def expects_content_wrapping(self) -> bool:
        """False: messages use OpenAI content parts (or plain strings)."""
        return False

    def _check_length(self, n: int) -> None:
        if self.max_length is not None and n > self.max_length:
            raise PromptTooLong(f"the prompt has {n} tokens, more than the maximum length {self.max_length}",
                                length=n, limit=self.max_length)

    @functools.cached_property
    def vocab_size(self) -> int:
        """Valid token ids are ``0 .. vocab_size - 1``: the model's vocabulary (its embedding rows) when
        the tokenizer belongs to a pipeline config, else the tokenizer's own."""
        pc = getattr(self, "pipeline_config", None)
        if pc is not None:
            try:
                cfg = pc.model_config.huggingface_config
                n = getattr(getattr(cfg, "text_config", None) or cfg, "vocab_size", None)
                if n:
                    return int(n)
            except Exception:  # noqa: BLE001 - no readable config: the tokenizer's size
                pass
        return len(self.delegate)

    @functools.cached_property
    def _max_token_bytes(self) -> Optional[int]:
        """The most UTF-8 bytes any one token can stand for, when that bounds the token count of a
        text from below (byte-level BPE without a normalizer: every byte of the text is in some
        token); None otherwise."""
        backend = getattr(self.delegate, "backend_tokenizer", None)
        if backend is None or backend.normalizer is not None:
            return None
        if type(backend.decoder).__name__ != "ByteLevel":
            return None
        vocab = backend.get_vocab(with_added_tokens=True)
        return max((len(t.encode("utf-8")) for t in vocab), default=None) or None

    def _check_text_length(self, text: str) -> None:
        """Reject a text that cannot fit ``max_length`` without tokenising it (a cheap lower bound on
        its token count), so an oversized prompt costs microseconds, not seconds."""
        if self.max_length is None or len(text) <= self.max_length:
            return
        per_token = self._max_token_bytes
        if per_token is None:
            return
        n_bytes = len(text.encode("utf-8", errors="replace"))
        at_least = -(-n_bytes // per_token)
        if at_least > self.max_length:
            raise PromptTooLong(f"the prompt has at least {at_least} tokens ({n_bytes} bytes), more than the maximum "
                                f"length {self.max_length}", length=at_least, limit=self.max_length)

    def check_token_ids(self, ids: Sequence[int], what: str = "prompt") -> npt.NDArray[np.int64]:
        """``ids`` as an int64 array; ValueError naming the first id outside the vocabulary."""
        n = self.vocab_size
        try:
            arr = np.asarray(ids, dtype=np.int64).reshape(-1)
            bad = np.flatnonzero((arr < 0) | (arr >= n))
            first = int(bad[0]) if bad.size else None
        except OverflowError:  # an id beyond int64
            arr = None
            first = next(i for i, t in enumerate(ids) if not 0 <= t < n)
        if first is not None:
            raise InvalidRequest(f"{what} token id {ids[first]} at index {first} is outside the vocabulary: ids must "
                                 f"be in 0..{n - 1} (vocabulary size {n})", param=what)
        return arr

    def encode_sync(self, prompt: str | Sequence[int], add_special_tokens: bool = True) -> npt.NDArray[np.int64]:
        """Token ids of ``prompt`` (a sequence of ids is checked against the vocabulary and passed
        through); ValueError when longer than ``max_length``."""
        if isinstance(prompt, str):
            self._check_text_length(prompt)
            ids = np.asarray(self.delegate.encode(prompt, add_special_tokens=add_special_tokens), dtype=np.int64)
        else:
            try:
                as_ints = [int(t) for t in prompt]
            except (TypeError, ValueError):
                raise InvalidRequestType("a token-id prompt must be a list of integers", param="prompt") from None
            ids = self.check_token_ids(as_ints)
        self._check_length(len(ids))
        return ids

    def decode_sync(self, encoded: npt.ArrayLike | int, **kwargs: Any) -> str:
        ids = np.atleast_1d(np.asarray(encoded)).astype(np.int64).tolist()
        return self.delegate.decode(ids, **kwargs)

    async def encode(self, prompt: str | Sequence[int], add_special_tokens: bool = True) -> npt.NDArray[np.int64]:
        """Transform the prompt into a token array (ValueError if it exceeds max_length)."""
        return self.encode_sync(prompt, add_special_tokens)

    async def decode(self, encoded: npt.ArrayLike, **kwargs: Any) -> str:
        """Token ids back to text (keyword arguments go to the HF ``decode``, e.g.
        ``skip_special_tokens=True``)."""
        return self.decode_sync(encoded, **kwargs)


class TextTokenizer(_HFTokenizerMixin):
    """Creates ``TextContext`` objects and encodes/decodes text with a HF tokenizer.

    ``model_path`` is a model folder, a GGUF file, or a repo id in the local HF cache.
    ``max_length`` bounds prompt + generated tokens (None: ``pipeline_config``'s
    ``max_length``, else the model's ``max_position_embeddings`` when known).
    """

    def __init__(
        self,
        model_path: str,
        *,
        revision: Optional[str] = None,
        max_length: Optional[int] = None,
        trust_remote_code: bool = False,
        enable_llama_whitespace_fix: bool = False,
        pipeline_config: Optional["PipelineConfig"] = None,
        chat_template: Optional[str] = None,
        **unused_kwargs: Any,
    ) -> None:
        self.model_path = os.fspath(model_path)
        self.revision = revision
        self.trust_remote_code = trust_remote_code
        self.pipeline_config = pipeline_config
        self.delegate = load_hf_tokenizer(self.model_path, revision=revision, trust_remote_code=trust_remote_code)
        if max_length is None and pipeline_config is not None:
            try:
                max_length = pipeline_config.resolved_max_length
            except ValueError:
                max_length = None
        self.max_length = max_length
        self._custom_template = chat_template
        if chat_template is not None:
            self.delegate.chat_template = chat_template
        self._enable_llama_whitespace_fix = enable_llama_whitespace_fix
        self._default_eos_token_ids = self._collect_eos_ids()

    def _collect_eos_ids(self) -> set[int]:
        ids: set[int] = set()
        if self.delegate.eos_token_id is not None:
            ids.add(int(self.delegate.eos_token_id))
        cfgs: list[Any] = []
        if self.pipeline_config is not None:
            mc = self.pipeline_config.model_config
            cfgs.append(getattr(mc.huggingface_config, "text_config", None) or mc.huggingface_config)
            cfgs.append(mc.generation_config)
        else:
            folder = Path(self.model_path)
            if folder.is_dir():
                cfgs.append(load_generation_config(folder))
                cj = folder / "config.json"
                if cj.is_file():
                    cfgs.append(json.loads(cj.read_text()))
        return ids | eos_token_ids_from_configs(*cfgs)

    @property
    def eos_token_ids(self) -> set[int]:
        """Every token id that ends generation (tokenizer, config and generation config)."""
        return set(self._default_eos_token_ids)

    def apply_chat_template(
        self,
        messages: list[TextGenerationRequestMessage],
        tools: Optional[list[TextGenerationRequestTool]] = None,
        chat_template_options: Optional[dict[str, Any]] = None,
    ) -> str:
        """The prompt text for chat ``messages`` (with the generation prompt appended)."""
        opts = dict(chat_template_options or {})
        if not opts.get("chat_template") and not getattr(self.delegate, "chat_template", None):
            raise InvalidRequest(f"{self.model_path}: the tokenizer has no chat template; pass chat_template= or "
                                 "send a plain prompt", param="messages", code="no_chat_template")
        opts.setdefault("add_generation_prompt", True)
        flat = _flatten_content(messages)
        with client_template_errors():
            return self.delegate.apply_chat_template(flat, tools=tools, tokenize=False, **opts)

    def decode_sync(self, encoded: npt.ArrayLike | int, **kwargs: Any) -> str:
        ids = np.atleast_1d(np.asarray(encoded)).astype(np.int64).tolist()
        if self._enable_llama_whitespace_fix and len(ids) == 1:
            # SentencePiece drops the leading space of a lone piece; decode it after a
            # dummy token and cut the dummy's text off.
            dummy = ids[0] if self.delegate.bos_token_id is None else int(self.delegate.bos_token_id)
            lead = self.delegate.decode([dummy], **kwargs)
            both = self.delegate.decode([dummy, ids[0]], **kwargs)
            return both[len(lead):]
        return self.delegate.decode(ids, **kwargs)

    async def new_context(self, request: TextGenerationRequest) -> TextContext:
        """A ``TextContext`` for the request: chat messages go through the chat template
        (without adding special tokens again), prompt strings are encoded with special
        tokens, token-id prompts are used as they are."""
        return self._new_context(request, TextContext)

    def _prompt_ids(self, request: TextGenerationRequest) -> npt.NDArray[np.int64]:
        if request.messages:
            text = self.apply_chat_template(request.messages, request.tools, request.chat_template_options)
            return self.encode_sync(text, add_special_tokens=False)
        if request.prompt is None:
            raise EmptyPrompt("no prompt and no messages", param="prompt", where=f"request {request.request_id}")
        return self.encode_sync(request.prompt, add_special_tokens=True)

    def _new_context(self, request: TextGenerationRequest, cls: type, ids: Optional[npt.NDArray[np.int64]] = None,
                     **extra: Any) -> Any:
        if ids is None:
            if request.images:
                raise InvalidRequest(f"this model takes text only; the request has {len(request.images)} image(s)",
                                     param="images", where=f"request {request.request_id}")
            ids = self._prompt_ids(request)
        if len(ids) == 0:
            raise EmptyPrompt("the prompt is empty (it encodes to no tokens)", param="prompt",
                              where=f"request {request.request_id}")
        n_vocab = self.vocab_size  # token-id prompts were checked against it by encode_sync
        sp = request.sampling_params
        max_new = max_tokens_to_generate(len(ids), self.max_length, sp.max_new_tokens)
        if max_new is not None and max_new <= 0 and self.max_length is not None:
            raise PromptTooLong(f"the prompt ({len(ids)} tokens) leaves no room to generate within the maximum length "
                                f"{self.max_length}", length=len(ids), limit=self.max_length,
                                where=f"request {request.request_id}")
        if max_new is None:
            raise InvalidRequest("no maximum length: set max_length on the tokenizer "
                                 "or max_new_tokens on the request",
                                 param="prompt", where=f"request {request.request_id}")
        if sp.logit_bias:
            bad = sorted(t for t in sp.logit_bias if t >= n_vocab)
            if bad:
                raise InvalidRequest(f"logit_bias: token id {bad[0]} is outside the vocabulary ({n_vocab} tokens)",
                                     param="logit_bias")
        eos = set(self._default_eos_token_ids)
        if sp.stop_token_ids:
            eos.update(sp.stop_token_ids)
        json_schema, matcher = self._constraint(request.response_format)
        ctx = cls(
            request_id=request.request_id,
            max_length=len(ids) + max_new,
            tokens=ids,
            eos_token_ids=eos,
            log_probabilities=request.logprobs,
            log_probabilities_echo=request.echo,
            ignore_eos=sp.ignore_eos,
            json_schema=json_schema,
            sampling_params=sp,
            model_name=request.model_name,
            target_endpoint=request.target_endpoint,
            **extra,
        )
        if matcher is not None:
            ctx.set_matcher(matcher)
        return ctx

    @property
    def grammar_compiler(self) -> Any:
        """The :class:`~max.pipelines.lib.structured_output.GrammarCompiler` of this tokenizer (made on
        first use)."""
        gc = getattr(self, "_grammar_compiler", None)
        if gc is None:
            from max.pipelines.lib.structured_output import GrammarCompiler

            gc = self._grammar_compiler = GrammarCompiler(self.delegate, self._default_eos_token_ids)
        return gc

    def _constraint(self, response_format: Optional[dict]) -> tuple[Optional[str], Any]:
        """``(json_schema, matcher)`` of a request's ``response_format`` (both None without a constraint);
        ``GrammarError`` (a ValueError naming the field) when it does not compile."""
        from max.pipelines.lib.structured_output import constraint_kind, json_schema_of

        if constraint_kind(response_format) is None:
            return None, None
        schema = json_schema_of(response_format)
        return (json.dumps(schema) if schema is not None else None), self.grammar_compiler.matcher(response_format)


class TextAndVisionTokenizer(TextTokenizer):
    """Builds ``TextAndVisionContext`` objects through the model folder's own ``transformers`` processor
    (``AutoProcessor``: its image processor resizes/normalises/patches the images, and it expands each
    image placeholder to the model's number of image tokens).

    Images come from ``request.images`` (encoded bytes) and from the chat messages' ``image_url`` /
    ``image`` parts (``data:`` URIs, local paths, http(s) URLs when ``allow_image_urls``; see
    ``max.pipelines.lib.images``), messages' images first, in order.  A plain prompt without the
    processor's image placeholder gets one placeholder per image in front of it.  Bad images, refused
    URLs and prompts that no longer fit ``max_length`` with their image tokens raise ValueError before
    any model work.
    """

    def __init__(self, model_path: str, *, revision: Optional[str] = None, max_length: Optional[int] = None,
                 trust_remote_code: bool = False, pipeline_config: Optional["PipelineConfig"] = None,
                 allow_image_urls: Optional[bool] = None, **unused_kwargs: Any) -> None:
        super().__init__(model_path, revision=revision, max_length=max_length, trust_remote_code=trust_remote_code,
                         pipeline_config=pipeline_config, **unused_kwargs)
        if allow_image_urls is None:
            allow_image_urls = bool(getattr(pipeline_config, "allow_image_urls", False))
        self.allow_image_urls = allow_image_urls
        """Whether http(s) image URLs are fetched (default: ``PipelineConfig.allow_image_urls``)."""
        from transformers import AutoProcessor

        folder = os.path.expanduser(self.model_path)
        if os.path.isfile(folder):
            folder = os.path.dirname(os.path.abspath(folder))
        try:
            self.processor = AutoProcessor.from_pretrained(folder, trust_remote_code=trust_remote_code)
            if getattr(self.processor, "image_processor", None) is None:  # e.g. only the tokenizer could load
                raise ValueError(f"AutoProcessor gave a {type(self.processor).__name__} without an image processor")
        except Exception as e:  # noqa: BLE001 - e.g. a video processor that needs torchvision: images alone
            self.processor = self.processor_without_auto(folder, e)
        if getattr(self.processor, "image_processor", None) is None:
            raise ValueError(f"{folder}: the processor has no image processor")
        self.image_token_id = self._image_token_id(folder)

    def processor_without_auto(self, folder: str, why: Exception) -> Any:
        """The processor to use when ``AutoProcessor`` cannot load, or loads one without an image processor (a
        family may offer one; the default says why the folder is unusable)."""
        raise ValueError(f"{folder}: cannot load the model's processor ({why}); a vision-language model folder "
                         "needs its processor files") from None

    def split_images(self, out: dict[str, Any], request_id: str) -> tuple[Sequence[np.ndarray], dict[str, Any]]:
        """The processor's output -> (one pixel array per image placeholder span, extra model args).

        The default reads ``pixel_values`` as ``[images, C, H, W]``; families whose processors pack
        images differently (patch grids, tiles) override this in their folder."""
        return np.asarray(out["pixel_values"], dtype=np.float32), {}

    def image_spans(self, ids: npt.NDArray[np.int64]) -> list[tuple[int, int]]:
        """``[(start, end)]`` of each image's placeholder span in ``ids``.

        The default: the maximal runs of the image token.  Families whose layout puts other tokens
        inside an image (row breaks) override this; only the image token's positions take embeddings."""
        return _runs(ids, self.image_token_id)

    def _image_token_id(self, folder: str) -> int:
        cfg: Any = None
        if self.pipeline_config is not None:
            cfg = self.pipeline_config.model_config.huggingface_config
            cfg = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
        elif os.path.isfile(os.path.join(folder, "config.json")):
            cfg = json.loads(Path(folder, "config.json").read_text())
        for key in ("image_token_index", "image_token_id"):
            if cfg and cfg.get(key) is not None:
                return int(cfg[key])
        tid = getattr(self.processor, "image_token_id", None)
        if tid is None:
            raise ValueError(f"{folder}: no image token id in config.json or the processor")
        return int(tid)

    @property
    def expects_content_wrapping(self) -> bool:
        return True

    takes_video = False
    """Whether the family reads ``video_url`` parts (its tokenizer overrides :meth:`new_context_sync`)."""

    def apply_chat_template(self, messages: list[TextGenerationRequestMessage],  # type: ignore[override]
                            tools: Optional[list[TextGenerationRequestTool]] = None,
                            chat_template_options: Optional[dict[str, Any]] = None) -> str:
        """The prompt text; image parts become the template's ``{"type": "image"}`` parts."""
        msgs, _ = _split_images(messages)
        opts = dict(chat_template_options or {})
        opts.setdefault("add_generation_prompt", True)
        if getattr(self.processor, "chat_template", None):
            with client_template_errors():
                return self.processor.apply_chat_template(msgs, tools=tools, tokenize=False, **opts)
        if not opts.get("chat_template") and not getattr(self.delegate, "chat_template", None):
            raise InvalidRequest(f"{self.model_path}: the model has no chat template; send a plain prompt",
                                 param="messages", code="no_chat_template")
        with client_template_errors():
            return self.delegate.apply_chat_template(msgs, tools=tools, tokenize=False, **opts)

    async def new_context(self, request: TextGenerationRequest) -> TextAndVisionContext:  # type: ignore[override]
        return self.new_context_sync(request)

    def new_context_sync(self, request: TextGenerationRequest) -> TextAndVisionContext:
        from max.pipelines.lib.images import decode_image

        refs: list[Any] = []
        if request.messages:
            msgs, refs = _split_images(request.messages)
            if video_parts(msgs) and not self.takes_video:
                raise InvalidRequest("this model does not take video input", param="video_url",
                                     where=f"request {request.request_id}")
        refs += list(request.images or [])
        if not refs:
            return self._new_context(request, TextAndVisionContext)
        images = [decode_image(r, f"image {i}", self.allow_image_urls) for i, r in enumerate(refs)]
        placeholder = getattr(self.processor, "image_token", None) or getattr(self.processor, "boi_token", None)
        if request.messages:
            text, special = self.apply_chat_template(request.messages, request.tools, request.chat_template_options), \
                False
        elif isinstance(request.prompt, str):
            text, special = request.prompt, True
            if placeholder and placeholder not in text:
                text = placeholder * len(images) + text
        else:
            raise InvalidRequest("images need a text prompt or chat messages, not token ids",
                                 param="images", where=f"request {request.request_id}")
        try:
            out = self.processor(text=[text], images=[images], return_tensors="np", add_special_tokens=special)
        except ValueError as e:  # e.g. the number of placeholders differs from the number of images
            raise InvalidRequest(f"the processor rejected the prompt and images: {e}",
                                 param="images", where=f"request {request.request_id}") \
                from None
        ids = np.asarray(out["input_ids"][0], dtype=np.int64)
        pixels, extra = self.split_images(out, request.request_id)
        spans = self.image_spans(ids)
        if len(spans) != len(pixels):
            raise InvalidRequest(f"{len(pixels)} processed images but {len(spans)} image "
                                 "placeholder spans in the prompt", param="images",
                                 where=f"request {request.request_id}")
        if self.max_length is not None and len(ids) >= self.max_length:
            raise PromptTooLong(f"the prompt with its {len(images)} image(s) is {len(ids)} tokens, which leaves no "
                                f"room to generate within the maximum length {self.max_length}; send fewer or smaller "
                                "images", length=len(ids), limit=self.max_length, where=f"request {request.request_id}")
        import hashlib

        metas = [ImageMetadata(start_idx=a, end_idx=b, pixel_values=pixels[i],
                               image_hash=hashlib.sha256(pixels[i].tobytes()).hexdigest())
                 for i, (a, b) in enumerate(spans)]
        salt = "images:" + hashlib.sha256("".join(m.image_hash or "" for m in metas).encode()).hexdigest()
        return self._new_context(request, TextAndVisionContext, ids=ids, pixel_values=tuple(pixels[i] for i in
                                                                                            range(len(pixels))),
                                 images=metas, vision_token_ids=[self.image_token_id], cache_salt=salt,
                                 extra_model_args=extra)


def _split_images(messages: Sequence[Any]) -> tuple[list[dict[str, Any]], list[Any]]:
    """``(messages for the chat template, image references in order)``: OpenAI ``image_url`` parts (and
    ``image`` parts carrying ``image``/``url``) become ``{"type": "image"}``."""
    out: list[dict[str, Any]] = []
    refs: list[Any] = []
    for m in messages:
        m = dict(m)
        c = m.get("content")
        if isinstance(c, list):
            parts = []
            for part in c:
                kind = part.get("type")
                if kind == "image_url":
                    iu = part.get("image_url")
                    url = iu.get("url") if isinstance(iu, dict) else iu
                    if not url:
                        raise InvalidRequest("an image_url part needs image_url.url", param="messages")
                    refs.append(url)
                    parts.append({"type": "image"})
                elif kind == "image":
                    ref = part.get("image", part.get("url"))
                    if ref is None:
                        raise InvalidRequest("an image part needs 'image' (bytes, data: URI or path) or 'url'",
                                             param="messages")
                    refs.append(ref)
                    parts.append({"type": "image"})
                elif kind in ("video_url", "video"):
                    parts.append(_video_part(part))
                elif kind == "text":
                    parts.append({"type": "text", "text": part.get("text", part.get("content", ""))})
                else:
                    raise InvalidRequest(f"unsupported content part type {kind!r} (supported: text, image_url, "
                                         "video_url)", param="messages")
            m["content"] = parts
        elif c is None:
            m["content"] = ""
        out.append(m)
    return out, refs


def _video_part(part: dict[str, Any]) -> dict[str, Any]:
    """A ``video_url`` part (``{"url": ...}``) or ``video`` part (a file reference or a list of frame images)
    as the chat template's ``{"type": "video"}`` part, carrying the reference (and ``fps`` when given)."""
    vu = part.get("video_url")
    if part.get("type") == "video_url":
        ref = vu.get("url") if isinstance(vu, dict) else vu
    else:
        ref = part.get("video", part.get("url"))
    if ref is None or (isinstance(ref, (str, list, tuple)) and not len(ref)):
        raise InvalidRequest("a video part needs video_url.url (a data: URI or a local file) or 'video' (a file "
                             "reference or a list of frame images)", param="video_url")
    out = {"type": "video", "video": ref}
    fps = part.get("fps", vu.get("fps") if isinstance(vu, dict) else None)
    if fps is not None:
        out["fps"] = fps
    return out


def video_parts(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """The ``{"type": "video"}`` parts of template messages (``_split_images``' output), in order."""
    return [p for m in messages if isinstance(m.get("content"), list) for p in m["content"]
            if p.get("type") == "video"]


def _runs(ids: npt.NDArray[np.int64], token: int) -> list[tuple[int, int]]:
    """``[(start, end)]`` of the maximal runs of ``token`` in ``ids``."""
    hit = np.concatenate([[False], ids == token, [False]])
    edges = np.flatnonzero(hit[1:] != hit[:-1])
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])]


class PreTrainedPipelineTokenizer(_HFTokenizerMixin):
    """A ``PipelineTokenizer`` over an existing HF tokenizer (``delegate``)."""

    def __init__(self, delegate: Any, max_length: Optional[int] = None) -> None:
        self.delegate = delegate
        self.max_length = max_length

    def apply_chat_template(self, messages: list[TextGenerationRequestMessage]) -> str:
        flat = _flatten_content(messages)
        with client_template_errors():
            return self.delegate.apply_chat_template(flat, tokenize=False, add_generation_prompt=True)

    async def encode(self, prompt: str | Sequence[int], add_special_tokens: bool = False) -> npt.NDArray[np.int64]:
        return self.encode_sync(prompt, add_special_tokens)

    async def new_context(self, request: TextGenerationRequest) -> TextContext:
        if request.messages:
            ids = self.encode_sync(self.apply_chat_template(request.messages), add_special_tokens=False)
        else:
            ids = self.encode_sync(request.prompt, add_special_tokens=True)  # type: ignore[arg-type]
        max_new = max_tokens_to_generate(len(ids), self.max_length, request.sampling_params.max_new_tokens)
        if max_new is None or max_new <= 0:
            raise PromptTooLong(f"no room to generate (prompt {len(ids)} tokens, max_length {self.max_length})",
                                length=len(ids), limit=self.max_length, where=f"request {request.request_id}")
        return TextContext(request_id=request.request_id, max_length=len(ids) + max_new, tokens=ids,
                           eos_token_ids={self.eos}, sampling_params=request.sampling_params,
                           log_probabilities=request.logprobs, log_probabilities_echo=request.echo,
                           ignore_eos=request.sampling_params.ignore_eos, model_name=request.model_name)


class IdentityPipelineTokenizer:
    """Passes strings through unchanged (for models that take text directly)."""

    def __init__(self, *args: Any, max_length: Optional[int] = None, **kwargs: Any) -> None:
        self.max_length = max_length

    @property
    def eos(self) -> int:
        return 0

    @property
    def expects_content_wrapping(self) -> bool:
        return False

    async def encode(self, prompt: str, add_special_tokens: bool = False) -> str:
        if self.max_length is not None and len(prompt) > self.max_length:
            raise PromptTooLong(f"the prompt has {len(prompt)} characters, more than the maximum length "
                                f"{self.max_length}", length=len(prompt), limit=self.max_length)
        return prompt

    async def decode(self, encoded: str, **kwargs: Any) -> str:
        return encoded if isinstance(encoded, str) else str(encoded)

    async def new_context(self, request: Any) -> Any:
        raise NotImplementedError("IdentityPipelineTokenizer does not create contexts")
