"""Per-request sampling configuration: ``SamplingParams`` and ``SamplingParamsInput``.

Validation happens at construction (and so also when a request is decoded from
msgpack).  Wrong types raise ``TypeError``; out-of-range values raise ``ValueError``;
both messages name the offending field.  Ranges (the reference documents only some of
them; the rest follow vLLM / the OpenAI API):

=====================  ============================================================
``top_k``              ``-1`` (the default: the top 255 tokens, as the reference documents),
                       ``0`` (no top-k limit: the whole vocabulary, vLLM's "disabled")
                       or ``>= 1``
``top_p``              ``(0, 1]``
``min_p``              ``[0, 1]``
``temperature``        ``>= 0`` (0 = greedy)
``frequency_penalty``  ``[-2, 2]`` (OpenAI range)
``presence_penalty``   ``[-2, 2]`` (OpenAI range)
``repetition_penalty`` ``> 0``
``max_new_tokens``     ``None`` (up to the maximum length) or ``>= 1``
``min_new_tokens``     ``>= 0`` and ``<= max_new_tokens`` when that is set
``stop``               ``None`` or a list of strings (a single string becomes a list)
``stop_token_ids``     ``None`` or a list of non-negative ints
``seed``               an int in ``0 .. 2**63 - 1``; the default is drawn from ``secrets`` (32 bits)
``logit_bias``         None or ``{token_id: bias}`` with biases in ``[-100, 100]``
                       (OpenAI), added to the logits before sampling
=====================  ============================================================
"""

from __future__ import annotations

import logging
import math
import numbers
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Optional

from max.interfaces.errors import InvalidRequest, InvalidRequestType

if TYPE_CHECKING:  # pragma: no cover
    from max import driver as md
    from max.interfaces.context import InputContext

logger = logging.getLogger("max.interfaces")

TOP_K_DEFAULT_TOKENS = 255
"""How many tokens ``top_k=-1`` considers."""

TOP_K_DISABLED = 0
"""``top_k`` value meaning "no top-k limit" (every token of the vocabulary is a candidate)."""


@dataclass
class ProcessorInputs:
    """Arguments of a per-request logits processor: the logits and the request's context."""

    logits: "md.Tensor"
    context: "InputContext"


@dataclass
class BatchProcessorInputs:
    """Arguments for a batch logits processor.

    * ``logits``: float32 tensor of shape ``(N_batch, vocab_size)``.
    * ``logit_offsets``: when the model returns several logits per sequence, a
      ``(batch_size + 1, 1)`` tensor of offsets of each sequence; otherwise ``None``.
    * ``context_batch``: the contexts of the batch.
    """

    logits: "md.Tensor"
    logit_offsets: "Optional[md.Tensor]"
    context_batch: "Sequence[InputContext]"


SEED_MAX = 2**63 - 1
"""The largest seed (the range of a signed 64-bit integer, as OpenAI and torch generators take)."""


def _random_seed() -> int:
    return secrets.randbits(32)


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _need_int(name: str, v: Any) -> int:
    if not _is_int(v):
        raise InvalidRequestType(f"{name} must be an int, got {type(v).__name__} {v!r}",
                                 param=name, where="SamplingParams")
    return int(v)


def _need_float(name: str, v: Any) -> float:
    if not _is_real(v):
        raise InvalidRequestType(f"{name} must be a number, got {type(v).__name__} {v!r}",
                                 param=name, where="SamplingParams")
    f = float(v)
    if math.isnan(f):
        raise InvalidRequest(f"{name} must not be NaN", param=name, where="SamplingParams")
    return f


def _need_bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise InvalidRequestType(f"{name} must be a bool, got {type(v).__name__} {v!r}",
                                 param=name, where="SamplingParams")
    return v


def _check_logit_bias(bias: Any) -> dict[int, float]:
    if not isinstance(bias, dict):
        raise InvalidRequestType(f"logit_bias must be a dict of token id -> bias, got {type(bias).__name__}",
                                 param="logit_bias", where="SamplingParams")
    out: dict[int, float] = {}
    for k, v in bias.items():
        if isinstance(k, str) and k.strip().lstrip("-").isdigit():
            k = int(k)  # JSON object keys are strings
        t = _need_int("logit_bias", k)
        if t < 0:
            raise InvalidRequest(f"logit_bias token ids must be non-negative, got {t}",
                                 param="logit_bias", where="SamplingParams")
        b = _need_float("logit_bias", v)
        if not -100.0 <= b <= 100.0:
            raise InvalidRequest(f"logit_bias values must be in [-100, 100], got {b} for token {t}",
                                 param="logit_bias", where="SamplingParams")
        out[t] = b
    return out


@dataclass
class SamplingParams:
    """Request specific sampling parameters that are only known at run time."""

    top_k: int = -1
    """Limits sampling to the K most probable tokens. -1 (default) evaluates the top 255
    tokens; 0 disables the limit (the whole vocabulary). For greedy sampling, set to 1."""
    top_p: float = 1
    """Only use the tokens whose cumulative probability is within the top_p threshold.
    This applies to the top_k tokens."""
    min_p: float = 0.0
    """Minimum probability for a token to be considered, relative to the probability of
    the most likely token. Must be in [0, 1]. 0 disables it."""
    temperature: float = 1
    """Randomness of the output; higher values give more diverse responses. 0 is greedy."""
    frequency_penalty: float = 0.0
    """Penalty proportional to how often a token has appeared in the generated text."""
    presence_penalty: float = 0.0
    """Constant penalty for tokens that have appeared in the generated text."""
    repetition_penalty: float = 1.0
    """Values > 1 penalise tokens already seen by dividing their logits."""
    max_new_tokens: Optional[int] = None
    """Maximum number of new tokens; None means no explicit limit."""
    min_new_tokens: int = 0
    """Minimum number of tokens to generate."""
    ignore_eos: bool = False
    """Keep generating past EOS until max tokens or a stop string is hit."""
    stop: Optional[list[str]] = None
    """Detokenized sequences that stop generation."""
    stop_token_ids: Optional[list[int]] = None
    """Token ids that stop generation."""
    detokenize: bool = True
    """Whether to detokenize the output tokens into text."""
    seed: int = field(default_factory=_random_seed)
    """Seed of the random number generator; defaults to a cryptographically secure random value."""
    logits_processors: Optional[Sequence[Callable[[ProcessorInputs], None]]] = None
    """Callables to post-process the model logits: each is called on every step with the request's
    logits row (``ProcessorInputs.logits``, ``(1, vocab)`` float32, edit it in place) and context."""
    logit_bias: Optional[dict[int, float]] = None
    """Per token id, a value added to its logit before sampling (OpenAI ``logit_bias``; -100 bans a
    token, 100 all but forces it)."""

    def __post_init__(self) -> None:
        self.top_k = _need_int("top_k", self.top_k)
        if self.top_k < -1:
            raise InvalidRequest(f"top_k must be -1 (top {TOP_K_DEFAULT_TOKENS} tokens), 0 (the whole vocabulary) "
                f"or a positive integer, got {self.top_k}", param="top_k", where="SamplingParams")
        self.top_p = _need_float("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p}", param="top_p", where="SamplingParams")
        self.min_p = _need_float("min_p", self.min_p)
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidRequest(f"min_p must be in [0, 1], got {self.min_p}", param="min_p", where="SamplingParams")
        self.temperature = _need_float("temperature", self.temperature)
        if self.temperature < 0.0 or math.isinf(self.temperature):
            raise InvalidRequest(f"temperature must be a finite value >= 0, got {self.temperature}",
                                 param="temperature", where="SamplingParams")
        for name in ("frequency_penalty", "presence_penalty"):
            v = _need_float(name, getattr(self, name))
            if not -2.0 <= v <= 2.0:
                raise InvalidRequest(f"{name} must be in [-2, 2], got {v}", param=name, where="SamplingParams")
            setattr(self, name, v)
        self.repetition_penalty = _need_float("repetition_penalty", self.repetition_penalty)
        if not 0.0 < self.repetition_penalty < math.inf:
            raise InvalidRequest(f"repetition_penalty must be a finite value > 0, got {self.repetition_penalty}",
                                 param="repetition_penalty", where="SamplingParams")
        if self.max_new_tokens is not None:
            self.max_new_tokens = _need_int("max_new_tokens", self.max_new_tokens)
            if self.max_new_tokens < 1:
                raise InvalidRequest(f"max_new_tokens must be None or >= 1, got {self.max_new_tokens}",
                                     param="max_new_tokens", where="SamplingParams")
        self.min_new_tokens = _need_int("min_new_tokens", self.min_new_tokens)
        if self.min_new_tokens < 0:
            raise InvalidRequest(f"min_new_tokens must be >= 0, got {self.min_new_tokens}",
                                 param="min_new_tokens", where="SamplingParams")
        if self.max_new_tokens is not None and self.min_new_tokens > self.max_new_tokens:
            raise InvalidRequest(f"min_new_tokens ({self.min_new_tokens}) must be <= max_new_tokens "
                f"({self.max_new_tokens})", param="min_new_tokens", where="SamplingParams")
        self.ignore_eos = _need_bool("ignore_eos", self.ignore_eos)
        self.detokenize = _need_bool("detokenize", self.detokenize)
        if self.stop is not None:
            if isinstance(self.stop, str):
                self.stop = [self.stop]
            if not isinstance(self.stop, (list, tuple)) or not all(isinstance(s, str) for s in self.stop):
                raise InvalidRequestType(f"stop must be None or a list of strings, got {self.stop!r}",
                                         param="stop", where="SamplingParams")
            if any(s == "" for s in self.stop):
                raise InvalidRequest("stop must not contain empty strings", param="stop", where="SamplingParams")
            self.stop = list(self.stop)
        if self.stop_token_ids is not None:
            if isinstance(self.stop_token_ids, (str, bytes)) or not isinstance(self.stop_token_ids, Sequence):
                raise InvalidRequestType(f"stop_token_ids must be None or a list of ints, got {self.stop_token_ids!r}",
                                         param="stop_token_ids", where="SamplingParams")
            ids = [_need_int("stop_token_ids", t) for t in self.stop_token_ids]
            if any(t < 0 for t in ids):
                raise InvalidRequest(f"stop_token_ids must be non-negative, got {ids}",
                                     param="stop_token_ids", where="SamplingParams")
            self.stop_token_ids = ids
        self.seed = _need_int("seed", self.seed)
        if not 0 <= self.seed <= SEED_MAX:
            raise InvalidRequest(f"seed must be in 0..{SEED_MAX} (2**63 - 1), got {self.seed}",
                                 param="seed", where="SamplingParams")
        if self.logits_processors is not None:
            if not isinstance(self.logits_processors, Sequence) or not all(
                callable(p) for p in self.logits_processors
            ):
                raise InvalidRequestType("logits_processors must be None or a sequence of callables",
                                         param="logits_processors", where="SamplingParams")
        if self.logit_bias is not None:
            self.logit_bias = _check_logit_bias(self.logit_bias)

    @property
    def is_greedy(self) -> bool:
        """True when sampling reduces to argmax (``temperature == 0`` or ``top_k == 1``)."""
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def effective_top_k(self) -> Optional[int]:
        """The number of candidate tokens: ``top_k``, 255 for the default ``-1``, None (the whole
        vocabulary) for ``0``."""
        if self.top_k == TOP_K_DISABLED:
            return None
        return TOP_K_DEFAULT_TOKENS if self.top_k == -1 else self.top_k

    def top_k_for(self, vocab_size: int) -> int:
        """The number of candidate tokens for a vocabulary of ``vocab_size`` tokens."""
        k = self.effective_top_k
        return int(vocab_size) if k is None else min(k, int(vocab_size))

    @classmethod
    def from_input(cls, input_params: "SamplingParamsInput") -> "SamplingParams":
        """A ``SamplingParams`` from ``input_params``; fields that are ``None`` take the class default."""
        if not isinstance(input_params, SamplingParamsInput):
            raise TypeError(
                f"SamplingParams.from_input: expected a SamplingParamsInput, got {type(input_params).__name__}"
            )
        kwargs = {f.name: getattr(input_params, f.name) for f in fields(input_params)}
        return cls(**{k: v for k, v in kwargs.items() if v is not None})

    def log_sampling_info(self) -> None:
        """Log every sampling parameter in a consistent format."""
        lines = ["", "Sampling Config", "=" * 40]
        if self.is_greedy:
            lines.append("  Strategy           : greedy (argmax)")
        else:
            lines.append("  Strategy           : stochastic")
            lines.append(f"  Temperature        : {self.temperature}")
            lines.append(f"  Top K              : {self.top_k}" + {-1: " (top 255)", 0: " (whole vocabulary)"}.get(self.top_k, ""))
            lines.append(f"  Top P              : {self.top_p}")
            lines.append(f"  Min P              : {self.min_p}")
            lines.append(f"  Seed               : {self.seed}")
        lines.append(f"  Frequency penalty  : {self.frequency_penalty}")
        lines.append(f"  Presence penalty   : {self.presence_penalty}")
        lines.append(f"  Repetition penalty : {self.repetition_penalty}")
        lines.append(f"  Max new tokens     : {self.max_new_tokens if self.max_new_tokens is not None else 'unlimited'}")
        lines.append(f"  Min new tokens     : {self.min_new_tokens}")
        lines.append(f"  Ignore EOS         : {self.ignore_eos}")
        lines.append(f"  Stop strings       : {self.stop}")
        lines.append(f"  Stop token ids     : {self.stop_token_ids}")
        lines.append(f"  Detokenize         : {self.detokenize}")
        n = len(self.logits_processors) if self.logits_processors else 0
        lines.append(f"  Logits processors  : {n}")
        logger.info("\n".join(lines))


@dataclass
class SamplingParamsInput:
    """Partial ``SamplingParams``: every field defaults to ``None`` ("use the default")."""

    top_k: Optional[int] = None
    top_p: Optional[float] = None
    min_p: Optional[float] = None
    temperature: Optional[float] = None
    frequency_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None
    max_new_tokens: Optional[int] = None
    min_new_tokens: Optional[int] = None
    ignore_eos: Optional[bool] = None
    stop: Optional[list[str]] = None
    stop_token_ids: Optional[list[int]] = None
    detokenize: Optional[bool] = None
    seed: Optional[int] = None
    logits_processors: Optional[Sequence[Callable[[ProcessorInputs], None]]] = None
    logit_bias: Optional[dict[int, float]] = None
