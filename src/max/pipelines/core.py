"""Contexts: ``TextContext`` (per-request token state), ``TextAndVisionContext`` and ``TTSContext``.

Token array layout (the concrete ``TextContext`` definition; see ``max.interfaces.context``)::

    tokens: [ in the KV cache | next_tokens | not yet fed | preallocated ... ]
            0           start_idx      active_idx       end_idx          len(tokens)

* ``next_tokens == tokens[start_idx:active_idx]``, ``active_length == active_idx - start_idx``;
* ``end_idx`` is one past the last valid token (``active_idx < end_idx`` while a prompt is
  being prefilled in chunks); ``current_length == active_idx``;
* ``prompt_tokens == tokens[:prompt_len]``, ``generated_tokens == tokens[prompt_len:end_idx]``;
* tokens in ``[completion_start_idx, completion_end_idx)`` are generated but not yet handed
  to the user (``to_generation_output`` returns them and advances the start).

``update(token)`` writes the sampled token at ``end_idx`` and makes it the only next
token (``start_idx = active_idx; active_idx = end_idx = end_idx + 1``); the EOS /
stop-sequence / ``max_length`` checks set ``status``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import numpy.typing as npt

from max.interfaces import (
    GenerationStatus,
    LogProbabilities,
    PipelineTask,
    SamplingParams,
    TextGenerationOutput,
    TextGenerationRequest,
)

CHUNK_SIZE = 128
"""The token array grows in multiples of this many slots."""


def _uuid() -> str:
    return uuid.uuid4().hex


def _round_up(n: int) -> int:
    return max(CHUNK_SIZE, -(-n // CHUNK_SIZE) * CHUNK_SIZE)


@dataclass(kw_only=True)
class TextContext:
    """Token state and generation parameters of one text generation request."""

    request_id: str = field(default_factory=_uuid)
    max_length: int
    tokens: npt.NDArray[np.integer[Any]]
    eos_token_ids: set[int] = field(default_factory=set)
    eos_sequences: list[list[int]] = field(default_factory=list)
    log_probabilities: int = 0
    log_probabilities_echo: bool = False
    ignore_eos: bool = False
    json_schema: Optional[str] = None
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    model_name: str = ""
    _matcher: Optional[Any] = None
    status: GenerationStatus = GenerationStatus.ACTIVE
    _size: int = -1
    _start_idx: int = 0
    _active_idx: int = -1
    _end_idx: int = -1
    _completion_start_idx: int = -1
    _completion_end_idx: int = -1
    _prompt_len: int = -1
    _log_probabilities_data: dict[int, LogProbabilities] = field(default_factory=dict)
    _is_initial_prompt: bool = True
    _draft_offset: int = 0
    prompt_log_probability_parts: list[LogProbabilities] = field(default_factory=list, repr=False)
    """Echo with log probabilities: the prompt tokens' entries computed so far (one per prefill chunk),
    joined to the first sampled token's entry when it is sampled (pipeline working state)."""
    target_endpoint: Optional[str] = None
    cache_salt: Optional[str] = None
    """Names what the prefix cache may share this request's pages with: only requests of the same salt
    (set from the images' pixels, a LoRA adapter, or Phi-3 LongRoPE's factors); None: any request."""

    def __post_init__(self) -> None:
        toks = np.asarray(self.tokens)
        if toks.ndim != 1:
            raise ValueError(f"TextContext: tokens must be a 1-D array, got shape {toks.shape}")
        if toks.size and not np.issubdtype(toks.dtype, np.integer):
            raise TypeError(f"TextContext: tokens must be integers, got dtype {toks.dtype}")
        n = int(toks.size)
        if self._active_idx == -1:
            self._active_idx = n
        if self._end_idx == -1:
            self._end_idx = self._active_idx
        if self._prompt_len == -1:
            self._prompt_len = self._active_idx
        if self._completion_start_idx == -1:
            self._completion_start_idx = self._end_idx
        if self._completion_end_idx == -1:
            self._completion_end_idx = self._end_idx
        if self._prompt_len <= 0:
            raise ValueError("TextContext: the prompt must contain at least one token")
        if isinstance(self.max_length, bool) or not isinstance(self.max_length, (int, np.integer)):
            raise TypeError(f"TextContext: max_length must be an int, got {self.max_length!r}")
        self.max_length = int(self.max_length)
        if self._prompt_len > self.max_length:
            raise ValueError(f"TextContext: the prompt ({self._prompt_len} tokens) is longer than max_length "
                             f"({self.max_length})")
        if self.min_tokens + self._prompt_len > self.max_length:
            raise ValueError(f"TextContext: min_new_tokens ({self.min_tokens}) + prompt length ({self._prompt_len}) "
                             f"exceeds max_length ({self.max_length})")
        if self._size == -1:
            self._size = _round_up(max(n, self._end_idx))
        buf = np.zeros(max(self._size, n), dtype=np.int64)
        buf[:n] = toks
        self.tokens = buf
        self._size = len(buf)
        self.eos_token_ids = set(int(t) for t in self.eos_token_ids)
        self.status = GenerationStatus(self.status)
        self._check_indices(self._start_idx, self._active_idx, self._end_idx)

    # -- indices
    def _check_indices(self, start: int, active: int, end: int) -> None:
        if not 0 <= start <= active <= end <= self._size:
            raise ValueError(
                f"TextContext: invalid token indices start_idx={start}, active_idx={active}, end_idx={end} "
                f"(need 0 <= start_idx <= active_idx <= end_idx <= {self._size})")

    @property
    def start_idx(self) -> int:
        return self._start_idx

    @property
    def active_idx(self) -> int:
        return self._active_idx

    @property
    def end_idx(self) -> int:
        return self._end_idx

    @property
    def active_length(self) -> int:
        """Tokens input this iteration: the prompt (or chunk) in CE, 1 (or more) in TG."""
        return self._active_idx - self._start_idx

    @property
    def image_spans(self) -> tuple[tuple[int, int], ...]:
        """The token spans ``(start, end)`` that must each run in one step (an image's tokens attend to each
        other both ways); none for text."""
        return ()

    @property
    def current_length(self) -> int:
        """The length of the sequence including completed and active tokens (``active_idx``)."""
        return self._active_idx

    @property
    def prompt_len(self) -> int:
        return self._prompt_len

    def bump_token_indices(self, start_idx: int = 0, active_idx: int = 0, end_idx: int = 0) -> None:
        """Move the indices by the given amounts without touching the token array."""
        self.set_token_indices(self._start_idx + start_idx, self._active_idx + active_idx, self._end_idx + end_idx)

    def set_token_indices(self, start_idx: Optional[int] = None, active_idx: Optional[int] = None,
                          end_idx: Optional[int] = None) -> None:
        """Set the indices (absolute values) without touching the token array."""
        s = self._start_idx if start_idx is None else int(start_idx)
        a = self._active_idx if active_idx is None else int(active_idx)
        e = self._end_idx if end_idx is None else int(end_idx)
        self._check_indices(s, a, e)
        self._start_idx, self._active_idx, self._end_idx = s, a, e

    def compute_num_available_steps(self, max_seq_len: int) -> int:
        """How many decode steps fit before the KV cache holds ``max_seq_len`` tokens
        (``max_seq_len - start_idx``: step k stores the k-th fed token)."""
        return max_seq_len - (self.current_length - self.active_length)

    # -- token views
    @property
    def all_tokens(self) -> npt.NDArray[np.integer[Any]]:
        return self.tokens[: self._end_idx]

    @property
    def next_tokens(self) -> npt.NDArray[np.integer[Any]]:
        """The tokens between start_idx and active_idx (fed to the next forward pass)."""
        return self.tokens[self._start_idx: self._active_idx]

    @property
    def prompt_tokens(self) -> npt.NDArray[np.integer[Any]]:
        return self.tokens[: self._prompt_len]

    @property
    def generated_tokens(self) -> npt.NDArray[np.integer[Any]]:
        """Tokens generated after the prompt: ``tokens[prompt_len:end_idx]``."""
        return self.tokens[self._prompt_len: self._end_idx]

    @property
    def last_generated_token(self) -> int:
        """The most recently generated token; ValueError if none has been generated."""
        if self._end_idx <= self._prompt_len:
            raise ValueError(f"TextContext {self.request_id}: no tokens have been generated yet")
        return int(self.tokens[self._end_idx - 1])

    # -- state
    @property
    def is_done(self) -> bool:
        return self.status.is_done

    @property
    def is_initial_prompt(self) -> bool:
        """True until the context has been updated with a generated token."""
        return self._is_initial_prompt

    @property
    def needs_ce(self) -> bool:
        """Whether prompt tokens remain to be encoded (context encoding)."""
        return self._start_idx < self._prompt_len

    @property
    def min_tokens(self) -> int:
        return self.sampling_params.min_new_tokens

    @property
    def matcher(self) -> Optional[Any]:
        return self._matcher

    def set_matcher(self, matcher: Any) -> None:
        self._matcher = matcher

    def _grow(self, need: int) -> None:
        if need > self._size:
            new = np.zeros(_round_up(need), dtype=self.tokens.dtype)
            new[: self._size] = self.tokens[: self._size]
            self.tokens = new
            self._size = len(new)

    def _update_status(self, new_token: int) -> None:
        if self.status.is_done:
            return
        if not self.ignore_eos:
            if new_token in self.eos_token_ids:
                self.status = GenerationStatus.END_OF_SEQUENCE
                return
            for seq in self.eos_sequences:
                k = len(seq)
                if k and self._end_idx - self._prompt_len >= k and \
                        list(self.tokens[self._end_idx - k: self._end_idx]) == list(seq):
                    self.status = GenerationStatus.END_OF_SEQUENCE
                    return
        if self._end_idx >= self.max_length:
            self.status = GenerationStatus.MAXIMUM_LENGTH

    def update(self, new_token: int, log_probabilities: Optional[LogProbabilities] = None) -> None:
        """Append a sampled token: it becomes the only next token; status is updated
        (EOS token or sequence -> END_OF_SEQUENCE unless ``ignore_eos``; ``max_length``
        reached -> MAXIMUM_LENGTH)."""
        new_token = int(new_token)
        self._grow(self._end_idx + 1)
        self.tokens[self._end_idx] = new_token
        if log_probabilities is not None:
            self._log_probabilities_data[self._end_idx] = log_probabilities
        self._end_idx += 1
        self._start_idx = self._active_idx
        self._active_idx = self._end_idx
        self._completion_end_idx = self._end_idx
        self._is_initial_prompt = False
        self._update_status(new_token)

    def jump_ahead(self, new_token: int) -> None:
        """Append a token that still has to be fed to the model (``start_idx`` stays),
        e.g. a forced token of structured output; it is returned to the user too."""
        new_token = int(new_token)
        self._grow(self._end_idx + 1)
        self.tokens[self._end_idx] = new_token
        self._end_idx += 1
        self._active_idx = self._end_idx
        self._completion_end_idx = self._end_idx
        self._is_initial_prompt = False
        self._update_status(new_token)

    def reset(self) -> None:
        """Make every token part of a new prompt to encode (after KV cache eviction):
        ``start_idx = 0``, ``active_idx = end_idx``.  Already returned tokens are not
        returned again."""
        self._start_idx = 0
        self._active_idx = self._end_idx
        self._is_initial_prompt = True

    def get_min_token_logit_mask(self, num_steps: int) -> list[npt.NDArray[np.int32]]:
        """Per step, ``(row, token_id)`` pairs (row 0) of EOS tokens to mask while fewer
        than ``min_tokens`` tokens have been generated; an empty ``(0, 2)`` array otherwise."""
        out = []
        lo, hi = self._prompt_len, self._prompt_len + self.min_tokens
        eos = sorted(self.eos_token_ids)
        for pos in range(self._active_idx, self._active_idx + num_steps):
            if lo <= pos < hi and eos:
                out.append(np.array([[0, t] for t in eos], dtype=np.int32))
            else:
                out.append(np.zeros((0, 2), dtype=np.int32))
        return out

    def to_generation_output(self) -> TextGenerationOutput:
        """The generated tokens not yet returned (and their log probabilities); advances
        the completion window."""
        lo, hi = self._completion_start_idx, self._completion_end_idx
        toks = [int(t) for t in self.tokens[lo:hi]]
        logprobs = None
        if self.log_probabilities:
            logprobs = [self._log_probabilities_data[i] for i in range(lo, hi) if i in self._log_probabilities_data]
            for i in range(lo, hi):
                self._log_probabilities_data.pop(i, None)
            logprobs = logprobs or None
        self._completion_start_idx = hi
        return TextGenerationOutput(request_id=self.request_id, tokens=toks, final_status=self.status,
                                    log_probabilities=logprobs)

    def __repr__(self) -> str:
        return (f"TextContext(request_id={self.request_id!r}, start_idx={self._start_idx}, "
                f"active_idx={self._active_idx}, end_idx={self._end_idx}, prompt_len={self._prompt_len}, "
                f"max_length={self.max_length}, status={self.status.value})")


@dataclass(frozen=True)
class ImageMetadata:
    """One image of a request: its placeholder tokens are ``tokens[start_idx:end_idx]`` and its processed
    pixels ``pixel_values`` (what the model's processor made of it)."""

    start_idx: int
    end_idx: int
    pixel_values: npt.NDArray[Any]
    image_hash: Optional[str] = None


@dataclass(kw_only=True)
class TextAndVisionContext(TextContext):
    """A ``TextContext`` with image inputs for vision-language models.

    Both forms of the reference are kept: ``pixel_values`` (one processed array per image) and
    ``images`` (:class:`ImageMetadata`: where each image's placeholder tokens are).  ``vision_token_ids``
    are the placeholder ids; ``image_token_indices`` their positions in the token array.

    The model encodes a request's images once, on its first prefill step, and keeps the embeddings in
    ``vision_embeddings`` (decode steps and later prefill chunks never re-encode; they stay valid across
    ``reset()``).  ``cache_salt`` (a hash of the pixels) keeps the prefix cache from sharing the K/V
    of the same placeholder tokens between requests with different images.
    """

    pixel_values: tuple[npt.NDArray[Any], ...] = ()
    extra_model_args: dict[str, npt.NDArray[Any]] = field(default_factory=dict)
    _needs_vision_encoding: bool = True
    vision_token_ids: list[int] = field(default_factory=list)
    images: list[ImageMetadata] = field(default_factory=list)
    vision_embeddings: Any = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.pixel_values and self.images:
            self.pixel_values = tuple(im.pixel_values for im in self.images)
        if self.images and len(self.images) != len(self.pixel_values):
            raise ValueError(f"TextAndVisionContext: {len(self.images)} image spans but {len(self.pixel_values)} "
                             "pixel_values arrays")
        for a, b in zip(self.images, self.images[1:]):
            if b.start_idx < a.end_idx:
                raise ValueError(f"TextAndVisionContext: image spans {a.start_idx}:{a.end_idx} and "
                                 f"{b.start_idx}:{b.end_idx} overlap")
        if not self.pixel_values:
            self._needs_vision_encoding = False

    @property
    def needs_vision_encoding(self) -> bool:
        """Whether the images still have to go through the vision encoder."""
        return self._needs_vision_encoding and self.vision_embeddings is None

    def mark_vision_encoded(self, embeddings: Any) -> None:
        """Keep the images' embeddings (``[n_image_tokens, hidden]`` in image order) for every later step."""
        self.vision_embeddings = embeddings
        self._needs_vision_encoding = False

    @property
    def image_token_indices(self) -> npt.NDArray[np.int32]:
        """Positions of the image placeholder tokens in the token array (those of ``vision_token_ids`` when an
        image's span also holds other tokens, e.g. row breaks)."""
        if not self.images:
            return np.zeros(0, np.int32)
        idx = np.concatenate([np.arange(im.start_idx, im.end_idx, dtype=np.int32) for im in self.images])
        return idx[np.isin(self.tokens[idx], self.vision_token_ids)] if self.vision_token_ids else idx

    @property
    def image_idx(self) -> int:
        """Index of the first image not yet fully in the KV cache."""
        return next((i for i, im in enumerate(self.images) if im.end_idx > self.start_idx), len(self.images))

    @property
    def next_images(self) -> list[ImageMetadata]:
        """The images not yet fully in the KV cache."""
        return self.images[self.image_idx:]

    @property
    def image_spans(self) -> tuple[tuple[int, int], ...]:
        return tuple((im.start_idx, im.end_idx) for im in self.images)

    def compute_image_aligned_idx(self, idx: int) -> int:
        """``idx`` moved down to the start of the image whose span it cuts (unchanged otherwise)."""
        for im in self.images:
            if im.start_idx < idx < im.end_idx:
                return im.start_idx
        return idx

    def image_span_end(self, idx: int) -> int:
        """The end of the image whose span ``idx`` cuts (``idx`` itself otherwise)."""
        for im in self.images:
            if im.start_idx < idx < im.end_idx:
                return im.end_idx
        return idx

    def reset(self) -> None:
        super().reset()
        self._needs_vision_encoding = bool(self.pixel_values)

    def update(self, new_token: int, log_probabilities: Optional[LogProbabilities] = None) -> None:
        super().update(new_token, log_probabilities)
        self._needs_vision_encoding = False


SPEECH_TOKEN_audio_chunk_size = 128
"""Initial capacity of a :class:`TTSContext`'s speech-token buffer (it grows by doubling)."""


def _no_tokens() -> npt.NDArray[np.integer[Any]]:
    return np.zeros(0, np.int64)


def _now() -> float:
    import time

    return time.time()


@dataclass
class TTSContext(TextContext):
    """A text-to-speech request's state: the text context of the speech-token model plus the speech tokens it
    generated, how far an audio decoder has consumed them (``decoded_index``), and the decoder's carried state.

    ``update_speech_tokens`` appends a block of generated speech tokens; ``next_speech_tokens`` returns the
    next unseen chunk (with up to ``buffer`` already-decoded tokens before it, as codecs that need left
    context want) without moving ``decoded_index``: the caller sets it once the chunk is decoded.  The request
    is done when ``audio_generation_status`` is (the audio, not the token stream, is the product).
    """

    audio_prompt_tokens: npt.NDArray[np.integer[Any]] = field(default_factory=_no_tokens)
    """Speech tokens of a reference voice (voice cloning)."""
    buffer_speech_tokens: Optional[npt.NDArray[np.integer[Any]]] = None
    audio_buffer: Optional[npt.NDArray[np.floating[Any]]] = None
    prev_samples_beyond_offset: int = 0
    streaming: bool = False
    """Whether the audio is streamed to the client chunk by chunk."""
    _speech_token_size: int = SPEECH_TOKEN_audio_chunk_size
    _speech_token_end_idx: int = 0
    _speech_tokens: npt.NDArray[np.integer[Any]] = field(default_factory=_no_tokens)
    decoded_index: int = 0
    _block_counter: int = 0
    _arrival_time: float = field(default_factory=_now)
    audio_generation_status: GenerationStatus = GenerationStatus.ACTIVE

    def __post_init__(self) -> None:
        super().__post_init__()
        self.audio_prompt_tokens = np.asarray(self.audio_prompt_tokens, dtype=np.int64).reshape(-1)
        if self._speech_token_size < 1:
            raise ValueError(f"TTSContext: _speech_token_size must be >= 1, got {self._speech_token_size}")
        if self._speech_tokens.size < self._speech_token_size:
            buf = np.zeros(self._speech_token_size, np.int64)
            buf[:self._speech_tokens.size] = self._speech_tokens
            self._speech_tokens = buf
        self.audio_generation_status = GenerationStatus(self.audio_generation_status)

    @property
    def block_counter(self) -> int:
        """How many blocks of speech tokens :meth:`update_speech_tokens` has appended."""
        return self._block_counter

    @property
    def speech_tokens(self) -> npt.NDArray[np.integer[Any]]:
        """Every speech token generated so far, in order."""
        return self._speech_tokens[:self._speech_token_end_idx]

    @property
    def is_done(self) -> bool:
        return self.audio_generation_status.is_done

    def update_speech_tokens(self, new_tokens: npt.NDArray[np.integer[Any]]) -> None:
        """Append ``new_tokens`` (one block) to the speech tokens."""
        new = np.asarray(new_tokens, dtype=np.int64).reshape(-1)
        end = self._speech_token_end_idx + new.size
        if end > self._speech_tokens.size:
            size = max(self._speech_tokens.size, 1)
            while size < end:
                size *= 2
            grown = np.zeros(size, np.int64)
            grown[:self._speech_token_end_idx] = self.speech_tokens
            self._speech_tokens = grown
            self._speech_token_size = size
        self._speech_tokens[self._speech_token_end_idx:end] = new
        self._speech_token_end_idx = end
        self._block_counter += 1

    def next_speech_tokens(self, audio_chunk_size: Optional[int] = None, buffer: Optional[int] = None
                           ) -> tuple[npt.NDArray[np.integer[Any]], int]:
        """``(tokens, n_buffered)``: the speech tokens from ``decoded_index`` (at most ``audio_chunk_size`` of
        them; all when None), preceded by up to ``buffer`` already-decoded ones (``n_buffered`` says how many
        were available).  ``decoded_index`` does not move."""
        for name, v in (("audio_chunk_size", audio_chunk_size), ("buffer", buffer)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0):
                raise ValueError(f"next_speech_tokens: {name} must be a non-negative int or None, got {v!r}")
        start = min(self.decoded_index, self._speech_token_end_idx)
        end = self._speech_token_end_idx if audio_chunk_size is None else \
            min(self._speech_token_end_idx, start + int(audio_chunk_size))
        n_buf = min(int(buffer or 0), start)
        return self._speech_tokens[start - n_buf:end].copy(), n_buf


def get_request_payload_from_pipeline_task(pipeline_task: PipelineTask) -> type:
    """``(request type, context type)`` used for a task."""
    task = PipelineTask(pipeline_task)
    if task in (PipelineTask.TEXT_GENERATION, PipelineTask.EMBEDDINGS_GENERATION):
        return tuple[TextGenerationRequest, TextContext]  # type: ignore[return-value]
    if task in (PipelineTask.AUDIO_GENERATION, PipelineTask.SPEECH_TOKEN_GENERATION):
        from max.interfaces import AudioGenerationRequest

        return tuple[AudioGenerationRequest, TTSContext]  # type: ignore[return-value]
    raise ValueError(f"no request payload known for task {task.value!r}")
