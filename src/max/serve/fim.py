"""Fill-in-the-middle (FIM) prompts for code models: which FIM tokens a tokenizer has, and the token
sequence of an infill request.

A model can fill in the middle when its vocabulary has a prefix, a suffix and a middle token; the
families known here (:data:`FIM_FAMILIES`) are Qwen2.5-Coder / CodeGemma style (``<|fim_prefix|>``
``<|fim_suffix|>`` ``<|fim_middle|>``, with ``<|repo_name|>`` and ``<|file_sep|>`` for repository
context), StarCoder (``<fim_prefix>``..., ``<reponame>``, ``<file_sep>``), Code Llama (``<PRE>``
``<SUF>`` ``<MID>``, also spelt with SentencePiece's leading ``▁``) and DeepSeek-Coder
(``<｜fim▁begin｜>`` ``<｜fim▁hole｜>`` ``<｜fim▁end｜>``).

The prompt (:func:`infill_tokens`) follows the repository-level layout llama-server uses::

    [repo]myproject\\n [sep]file0\\n text0 [sep]file1\\n text1 ... [sep]filename\\n
    [BOS] [prefix] input_prefix prompt [suffix] input_suffix [middle]

(each part only where the vocabulary has its token; without a separator token each ``input_extra``
chunk follows a ``\\n\\n--- snippet ---\\n\\n`` line).  ``prompt`` is the text
just before the cursor, so it ends the prefix.  When the whole does not fit the context, the extra
chunks go first (oldest first), then the prefix loses its start and the suffix its end (the suffix keeps at
least a quarter of the room).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

# (prefix, suffix, middle, repository, file separator) token texts; None: the family has no such token
FIM_FAMILIES: tuple[tuple[str, str, str, Optional[str], Optional[str]], ...] = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>"),
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", None, "<|file_separator|>"),
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<reponame>", "<file_sep>"),
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<repo_name>", "<file_sep>"),
    ("<PRE>", "<SUF>", "<MID>", None, None),
    ("\u2581<PRE>", "\u2581<SUF>", "\u2581<MID>", None, None),
    ("<\uff5cfim\u2581begin\uff5c>", "<\uff5cfim\u2581hole\uff5c>", "<\uff5cfim\u2581end\uff5c>", None, None),
)
REPO_NAME = "myproject"
CURRENT_FILE = "filename"
SNIPPET_LINE = "\n\n--- snippet ---\n\n"


@dataclass(frozen=True)
class FimTokens:
    """The FIM token ids of one vocabulary (``repo`` / ``sep``: None when the vocabulary lacks them)."""

    prefix: int
    suffix: int
    middle: int
    repo: Optional[int] = None
    sep: Optional[int] = None


def fim_tokens(vocab: dict[str, int]) -> Optional[FimTokens]:
    """The first :data:`FIM_FAMILIES` entry whose prefix, suffix and middle tokens are all in ``vocab``
    (with its repository / separator tokens where present), else None."""
    for pre, suf, mid, repo, sep in FIM_FAMILIES:
        if pre in vocab and suf in vocab and mid in vocab:
            return FimTokens(vocab[pre], vocab[suf], vocab[mid], vocab.get(repo) if repo else None,
                             vocab.get(sep) if sep else None)
    return None


def fim_token_texts(vocab: dict[str, int]) -> Optional[tuple[str, str, str]]:
    """The (prefix, suffix, middle) token texts of the vocabulary's FIM family, else None."""
    for pre, suf, mid, _, _ in FIM_FAMILIES:
        if pre in vocab and suf in vocab and mid in vocab:
            return pre, suf, mid
    return None


def vocab_of(tokenizer: Any) -> dict[str, int]:
    """The vocabulary (token text -> id) of a pipeline tokenizer's Hugging Face delegate ({} if none)."""
    delegate = getattr(tokenizer, "delegate", None)
    return delegate.get_vocab() if delegate is not None and hasattr(delegate, "get_vocab") else {}


@dataclass
class InfillPrompt:
    tokens: list[int]
    truncated: bool


def _fit(extra: list[int], prefix: list[int], suffix: list[int], fixed: int, budget: int
         ) -> tuple[list[int], list[int], list[int], bool]:
    """Make the prompt (``fixed`` tokens besides these parts) at most ``budget`` tokens: first ``extra`` loses
    its start; then the prefix keeps its end and the suffix its start, the suffix getting at least a quarter
    of the room left (more when the prefix needs less)."""
    over = fixed + len(extra) + len(prefix) + len(suffix) - budget
    if over <= 0:
        return extra, prefix, suffix, False
    extra = extra[min(over, len(extra)):]
    room = budget - fixed - len(extra)
    if len(prefix) + len(suffix) > room:
        n_suf = min(len(suffix), max(room // 4, room - len(prefix)))
        n_pre = min(len(prefix), room - n_suf)
        prefix, suffix = prefix[len(prefix) - n_pre:], suffix[:n_suf]
    return extra, prefix, suffix, True


def infill_tokens(fim: FimTokens, encode: Any, *, prefix: str, suffix: str, prompt: str = "",
                  extra: Sequence[tuple[str, str]] = (), bos: Optional[int] = None,
                  budget: Optional[int] = None) -> InfillPrompt:
    """The token ids of an infill prompt (layout in the module docstring); ``encode(text)`` gives a text's
    ids without special tokens, ``extra`` is ``(filename, text)`` chunks, ``bos`` the id to put before the
    prefix token (None: none), ``budget`` the most tokens the prompt may have (None: no limit)."""
    ctx: list[int] = []
    if fim.repo is not None:
        ctx += [fim.repo, *encode(REPO_NAME + "\n")]
    for filename, text in extra:
        if fim.sep is not None:
            ctx += [fim.sep, *encode((filename or "tmp") + "\n")]
        else:
            ctx += encode(SNIPPET_LINE)
        ctx += encode(text)
    if fim.sep is not None:
        ctx += [fim.sep, *encode(CURRENT_FILE + "\n")]
    pre = encode(prefix) + encode(prompt) if prompt else encode(prefix)
    suf = encode(suffix)
    fixed = 3 + (bos is not None)
    truncated = False
    if budget is not None:
        ctx, pre, suf, truncated = _fit(ctx, pre, suf, fixed, budget)
        if fixed + len(ctx) + len(pre) + len(suf) > budget:
            raise ValueError(f"the infill prompt needs at least {fixed} tokens, more than the {budget} available")
    head = [bos] if bos is not None else []
    return InfillPrompt([*ctx, *head, fim.prefix, *pre, fim.suffix, *suf, fim.middle], truncated)
