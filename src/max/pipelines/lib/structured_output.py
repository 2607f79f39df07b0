"""Structured output: token masks from grammars (llguidance), applied in the batched sampler.

A request's constraint is a ``response_format`` dict (the OpenAI shape, plus the extension types
vLLM users know):

==================  =========================================================================
``json_object``      any JSON object
``json_schema``      ``{"json_schema": {"name": ..., "schema": {...}}}`` (or the schema itself)
``regex``            ``{"regex": "..."}`` (Rust ``regex`` syntax)
``grammar``          ``{"grammar": "..."}``: a Lark grammar or a GBNF/EBNF grammar (llama.cpp)
``choice``           ``{"choice": ["a", "b", ...]}``: exactly one of the strings
==================  =========================================================================

:class:`GrammarCompiler` (one per tokenizer) turns a constraint into an ``llguidance.LLMatcher``;
a constraint the library cannot compile raises :class:`GrammarError` naming the field.  Each step
the sampler fills one bitmask row per constrained request (:func:`fill_token_bitmask`, all rows in
parallel on llguidance's thread pool), sets the logits of forbidden tokens to ``-inf``
(:func:`apply_token_bitmask`) and, after sampling, advances every matcher by its token
(:func:`advance_matchers`).  Free requests in the same batch are untouched.

JSON is generated without free whitespace between tokens (``{"a": 1, "b": [2, 3]}``, separators
``", "`` and ``": "``) unless the constraint sets ``"whitespace_flexible": true``: a model that
may emit unbounded whitespace inside a JSON value can otherwise run to its token limit.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any, Optional, Sequence

import torch

RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema", "regex", "grammar", "choice")
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """A constraint that cannot be compiled; ``param`` names the request field."""

    def __init__(self, message: str, param: str = "response_format") -> None:
        super().__init__(message)
        self.param = param


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise GrammarError(f"structured output needs the llguidance package ({e}); pip install llguidance") from None
    return llguidance


def constraint_kind(response_format: Optional[dict]) -> Optional[str]:
    """The constraint type of ``response_format`` (None for no constraint / ``text``)."""
    if not response_format:
        return None
    kind = response_format.get("type")
    if kind not in RESPONSE_FORMAT_TYPES:
        raise GrammarError(f"response_format.type must be one of {', '.join(RESPONSE_FORMAT_TYPES)}, got {kind!r}",
                           "response_format.type")
    return None if kind == "text" else kind


def json_schema_of(response_format: dict) -> Optional[dict]:
    """The JSON schema a ``json_schema`` / ``json_object`` constraint asks for (None otherwise)."""
    kind = constraint_kind(response_format)
    if kind == "json_object":
        return {"type": "object"}
    if kind != "json_schema":
        return None
    js = response_format.get("json_schema")
    if not isinstance(js, dict):
        raise GrammarError("response_format.json_schema must be an object", "response_format.json_schema")
    schema = js.get("schema", js) if ("schema" in js or "name" in js) else js
    if not isinstance(schema, dict):
        raise GrammarError("response_format.json_schema.schema must be an object (a JSON schema)",
                           "response_format.json_schema.schema")
    return schema


def grammar_for(response_format: dict) -> Optional[str]:
    """The llguidance grammar of a constraint (None for ``text``); GrammarError for malformed ones."""
    lg = _llguidance()
    kind = constraint_kind(response_format)
    if kind is None:
        return None
    if kind in ("json_object", "json_schema"):
        schema = json_schema_of(response_format)
        opts = dict(_JSON_OPTIONS)
        if response_format.get("whitespace_flexible"):
            opts = {"whitespace_flexible": True}
        param = "response_format.json_schema" if kind == "json_schema" else "response_format"
        try:
            return lg.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=opts)
        except (ValueError, TypeError) as e:
            raise GrammarError(f"invalid JSON schema: {one_line(str(e))}", param) from None
    value = response_format.get(kind)
    param = f"response_format.{kind}"
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(s, str) and s for s in value):
            raise GrammarError("response_format.choice must be a non-empty list of non-empty strings", param)
        return lg.grammar_from("choice", value)
    if not isinstance(value, str) or not value:
        raise GrammarError(f"response_format.{kind} must be a non-empty string", param)
    try:
        return lg.grammar_from("regex" if kind == "regex" else "grammar", value)
    except ValueError as e:
        raise GrammarError(f"invalid {kind}: {one_line(str(e))}", param) from None


_AT_RE = re.compile(r"^at \d+\(\d+\):\s*")


def one_line(message: str) -> str:
    """A compiler's multi-line error (source excerpts, ``^`` markers, ``error:`` lines) as one line:
    its first line (without the ``at L(C):`` position prefix and the ``(in regex): regex parse
    error:`` tail) and the reason from its ``error:`` line, e.g. ``invalid regex "[a-": unclosed
    character class``; ``at line L column C`` is kept when the first line had a position."""
    lines = [ln.strip() for ln in str(message).splitlines() if ln.strip()]
    if not lines:
        return str(message).strip()
    first = lines[0]
    pos = re.match(r"^at (\d+)\((\d+)\):", first)
    first = _AT_RE.sub("", first)
    first = re.sub(r"\s*\(in \w+\)\s*:?\s*regex parse error:?\s*$", "", first).rstrip(":").strip()
    reasons = [ln[len("error:"):].strip() for ln in lines[1:] if ln.startswith("error:")]
    out = f"{first}: {'; '.join(reasons)}" if reasons else first
    if pos and "regex" not in first:
        out += f" (at line {pos.group(1)} column {pos.group(2)})"
    return out


def check_json_schema(schema: Any, param: str) -> None:
    """GrammarError (one line, naming ``param``) when ``schema`` is not a JSON schema the structured
    output engine can compile; no tokenizer is needed."""
    lg = _llguidance()
    if not isinstance(schema, dict):
        raise GrammarError(f"{param} must be a JSON schema object", param)
    try:
        grammar = lg.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=dict(_JSON_OPTIONS))
        err = lg.LLMatcher.validate_grammar(grammar, None)
    except (ValueError, TypeError) as e:
        err = str(e)
    if err:
        raise GrammarError(f"{param} is not a valid JSON schema: {one_line(err)}", param)


def _is_transformers(tok: Any) -> bool:
    return any(c.__module__.startswith("transformers.") for c in type(tok).__mro__)


class GrammarCompiler:
    """Compiles constraints into matchers for one tokenizer.  The llguidance tokenizer is built on
    first use (about a second for a 50k vocabulary) and shared; so is the thread pool that fills
    the masks of a batch."""

    def __init__(self, hf_tokenizer: Any, eos_token_ids: Sequence[int] = (), vocab_size: Optional[int] = None
                 ) -> None:
        self.hf_tokenizer = hf_tokenizer
        self.eos_token_ids = sorted(int(t) for t in eos_token_ids)
        self.vocab_size = vocab_size
        self._lltok: Any = None
        self._lock = threading.Lock()

    @property
    def lltokenizer(self) -> Any:
        with self._lock:
            if self._lltok is None:
                tok = self.hf_tokenizer
                n_vocab = self.vocab_size or len(tok)
                eos = self.eos_token_ids or tok.eos_token_id
                try:
                    if _is_transformers(tok):
                        import llguidance.hf

                        self._lltok = llguidance.hf.from_tokenizer(tok, n_vocab=n_vocab, eos_token=eos)
                    else:  # a GGUF vocabulary's tokenizer (no transformers): its tokenizers.Tokenizer as JSON
                        self._lltok = _llguidance().LLTokenizer(tok.backend_tokenizer.to_str(), n_vocab=n_vocab,
                                                                eos_token=eos)
                except ValueError as e:
                    raise GrammarError(f"structured output is not available for this tokenizer: {e}") from None
            return self._lltok

    def matcher(self, response_format: dict) -> Any:
        """A fresh ``LLMatcher`` for the constraint (None for ``text``); GrammarError when it does not
        compile (the message is the library's)."""
        grammar = grammar_for(response_format)
        if grammar is None:
            return None
        lg = _llguidance()
        m = lg.LLMatcher(self.lltokenizer, grammar, log_level=0)
        if m.is_error():
            kind = constraint_kind(response_format)
            param = {"json_schema": "response_format.json_schema", "json_object": "response_format"}.get(
                kind, f"response_format.{kind}")
            raise GrammarError(f"the {kind} constraint does not compile: {one_line(m.get_error())}", param)
        return m


_EXECUTOR: Any = None


def _executor() -> Any:
    global _EXECUTOR
    if _EXECUTOR is None:
        _EXECUTOR = _llguidance().LLExecutor()
    return _EXECUTOR


def fill_token_bitmask(matchers: Sequence[Any], vocab_size: int) -> torch.Tensor:
    """An int32 bitmask ``(len(matchers), ceil(vocab_size / 32))``: bit ``t % 32`` of word ``t // 32`` of
    row ``i`` is set when ``matchers[i]`` allows token ``t``.  Rows are filled in parallel."""
    words = (vocab_size + 31) // 32
    mask = torch.full((len(matchers), words), -1, dtype=torch.int32)
    if len(matchers) == 1:
        row = mask[0]
        matchers[0].unsafe_compute_mask_ptr(row.data_ptr(), words * 4)
    elif matchers:
        _executor().unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)], mask.data_ptr(), words * 4,
                                            len(matchers))
    return mask


_BITS = torch.arange(32, dtype=torch.int32)


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The boolean ``(rows, vocab_size)`` form of a token bitmask."""
    bits = (bitmask.to(torch.int32)[:, :, None] >> _BITS.to(bitmask.device)) & 1
    allowed = bits.reshape(bitmask.shape[0], -1).bool()
    if allowed.shape[1] < vocab_size:  # tokens past the mask (padded vocabularies) are never allowed
        pad = torch.zeros(allowed.shape[0], vocab_size - allowed.shape[1], dtype=torch.bool, device=allowed.device)
        allowed = torch.cat([allowed, pad], dim=1)
    return allowed[:, :vocab_size]


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: Optional[Sequence[int]] = None
                        ) -> torch.Tensor:
    """Set the logits of tokens the bitmask forbids to ``-inf`` (in place), in ``rows`` of ``logits``
    (bitmask row j masks logits row ``rows[j]``; all rows when None).  Returns ``logits``."""
    allowed = allowed_tokens(bitmask.to(logits.device), logits.shape[-1])
    if rows is None:
        logits.masked_fill_(~allowed, float("-inf"))
    else:
        idx = torch.as_tensor(list(rows), dtype=torch.long, device=logits.device)
        logits[idx] = logits[idx].masked_fill(~allowed, float("-inf"))
    return logits


def advance_matchers(matchers: Sequence[Any], tokens: Sequence[int]) -> list[bool]:
    """Consume one token per matcher; False where the matcher rejected it (it is then in its error state)."""
    if not matchers:
        return []
    if len(matchers) == 1:
        return [bool(matchers[0].consume_token(int(tokens[0])))]
    return list(_executor().consume_token_par([(m, int(t)) for m, t in zip(matchers, tokens)]))
