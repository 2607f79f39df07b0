"""Build a fast tokenizer straight from GGUF tokenizer metadata.

Byte-level BPE vocabularies (``tokenizer.ggml.model == "gpt2"``: GPT-2, Llama-3,
Qwen2, SmolLM, ...): the vocabulary, merges and special tokens are
read with :func:`~max.pipelines.lib.gguf_utils.read_gguf_metadata` and handed to
``tokenizers.models.BPE`` directly, which takes well under a second (transformers'
own GGUF conversion builds a slow Python tokenizer first and takes 10-20 s).

The result follows what ``AutoTokenizer.from_pretrained(dir, gguf_file=...)`` builds,
so token ids are identical:

* tokens spelled outside the byte-level alphabet are re-spelled byte by byte;
* tokens of type CONTROL (3) become special added tokens (unless they use characters
  outside the alphabet: llama.cpp mislabels), USER_DEFINED (4) plain added tokens;
* the split regex depends on ``tokenizer.ggml.pre`` (Llama-3 / Qwen2 / GPT-4o
  families); others use the GPT-2 byte-level regex;
* ``tokenizer.ggml.add_bos_token`` / ``add_eos_token`` decide the post-processor;
* ``tokenizer.chat_template`` becomes the chat template.

SentencePiece BPE vocabularies (``tokenizer.ggml.model == "llama"``: Llama 2, Mistral 7B, Gemma,
Phi-3) are built the same way by :func:`sentencepiece_tokenizer_from_gguf_metadata` (merges from the
file or derived from the pieces' scores, byte fallback, the family's way of marking spaces).

:class:`GGUFTokenizer` puts the interface of a ``transformers`` fast tokenizer over either, so loading
a GGUF model does not import transformers.  Other vocabularies (``t5`` Unigram, ...) fall back to
transformers.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

from max.graph.weights.gguf_meta import GGUFStringArray
from max.graph.weights.mapped import file_identity
from max.pipelines.lib.gguf_utils import GGUFMetadata, read_gguf_metadata

STRINGS_CACHE_VERSION = 1


def _strings_cache_path(arr: GGUFStringArray) -> Path | None:
    """Where the decoded strings of ``arr`` are cached: ``<cache dir>/strings/<key>.marshal``, the key a hash
    of the file's identity (real path, inode, size, modification and status-change times), the array's place
    in it, the Python version (marshal's format) and this cache's version; None when the file changed since
    its metadata was read (the array then refuses to decode)."""
    from max.engine.native.build import cache_dir

    ident = file_identity(arr.path)
    if (ident[3], ident[4]) != arr.stamp:
        return None
    key = repr((ident, arr.offset, arr.count, sys.version_info[:2], STRINGS_CACHE_VERSION))
    return cache_dir() / "strings" / (hashlib.sha256(key.encode()).hexdigest()[:40] + ".marshal")


def file_strings(meta: GGUFMetadata, key: str) -> list[str]:
    """The string array ``key`` of the file as a list.  A long one left in the file (``GGUFStringArray``: a
    vocabulary's tokens and merges) is read back from a cache of its decoded strings when the same file was
    read before (decoding ~150k length-prefixed strings costs ~0.1 s per array, reading them back ~0.02 s:
    a quarter of loading a 1.5B model's tokenizer), and cached on a miss.  An entry holds the sha256 of its
    payload: a damaged one is decoded afresh and rewritten."""
    arr = meta.fields.get(key)
    if not isinstance(arr, GGUFStringArray):
        return list(arr) if arr is not None else []
    try:
        path = _strings_cache_path(arr)
    except OSError:
        path = None
    if path is None:
        return arr.tolist()
    try:
        with open(path, "rb") as f:
            blob = f.read()
        payload = blob[32:]
        if blob[:32] == hashlib.sha256(payload).digest():
            got = marshal.loads(payload)
            if isinstance(got, list) and len(got) == arr.count:
                return got
    except (OSError, EOFError, ValueError, TypeError):
        pass
    from max.engine.native.build import atomic_write

    out = arr.tolist()
    try:
        payload = marshal.dumps(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, [hashlib.sha256(payload).digest(), payload])
    except OSError:
        pass
    return out

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4


@lru_cache(maxsize=1)
def byte_level_alphabet() -> dict[int, str]:
    """The GPT-2 byte -> printable character table (printable Latin-1 bytes map to
    themselves, the 68 others to code points 256 and up, in byte order)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table: dict[int, str] = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


# Split patterns (the pre-tokenizer regexes the vocabularies were trained with).
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_SPLITS: dict[str, str] = {
    **dict.fromkeys(
        ["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "dbrx",
         "smaug-bpe"], _LLAMA3),
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen", "megrez"], _QWEN2),
    **dict.fromkeys(["gpt-4o", "llama4", "minimax-m2"], _GPT4O),
    "tekken": _TEKKEN,
}


def gguf_has_fast_tokenizer(meta: GGUFMetadata) -> bool:
    """Whether :func:`tokenizer_from_gguf_metadata` can build this file's tokenizer."""
    return meta.get("tokenizer.ggml.model") == "gpt2" and "tokenizer.ggml.tokens" in meta.fields


def _token_at(tokens: list[str], key: str, meta: GGUFMetadata) -> str | None:
    tid = meta.get(key)
    if tid is None:
        return None
    tid = int(tid)
    return tokens[tid] if 0 <= tid < len(tokens) else None


def tokenizer_from_gguf_metadata(meta: GGUFMetadata) -> tuple[Any, dict[str, Any]]:
    """``(tokenizers.Tokenizer, info)`` for a byte-level BPE GGUF vocabulary.

    ``info`` holds ``bos_token``/``eos_token``/``unk_token``/``pad_token`` (strings or
    None), ``add_bos_token``, ``add_eos_token`` and ``chat_template``.
    Raises ValueError for vocabularies that are not byte-level BPE.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = meta.get("tokenizer.ggml.model")
    if not gguf_has_fast_tokenizer(meta):
        raise ValueError(
            f"{meta.path}: no byte-level BPE vocabulary (tokenizer.ggml.model={kind!r}); "
            "only 'gpt2' vocabularies are built directly"
        )
    tokens: list[str] = file_strings(meta, "tokenizer.ggml.tokens")
    types = meta.get("tokenizer.ggml.token_type")
    types = [] if types is None else types.tolist()
    alphabet = byte_level_alphabet()
    alpha_set = frozenset(alphabet.values())

    def spell(tok: str) -> str:
        if alpha_set.issuperset(tok):
            return tok
        return "".join(alphabet[b] for b in tok.encode("utf-8"))

    vocab = {spell(t): i for i, t in enumerate(tokens)}
    raw_merges = file_strings(meta, "tokenizer.ggml.merges")
    merges = []
    for m in raw_merges:
        a, sep, b = m.partition(" ")
        merges.append((a, b))
    model = models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None, fuse_unk=False,
                       byte_fallback=False, ignore_merges=False)
    tok = Tokenizer(model)
    split = PRE_TOKENIZER_SPLITS.get(meta.get("tokenizer.ggml.pre"))
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()

    control = [t for t, ty in zip(tokens, types) if ty == TOKEN_TYPE_CONTROL and alpha_set.issuperset(t)]
    if control:
        tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    user = [t for t, ty in zip(tokens, types) if ty == TOKEN_TYPE_USER_DEFINED and t in vocab]
    if user:
        tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])

    info: dict[str, Any] = {
        "bos_token": _token_at(tokens, "tokenizer.ggml.bos_token_id", meta),
        "eos_token": _token_at(tokens, "tokenizer.ggml.eos_token_id", meta),
        "unk_token": _token_at(tokens, "tokenizer.ggml.unknown_token_id", meta),
        "pad_token": _token_at(tokens, "tokenizer.ggml.padding_token_id", meta),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "chat_template": meta.get("tokenizer.chat_template"),
    }
    # Special tokens named by id must be whole tokens even when not marked CONTROL.
    named = [info[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token") if info[k] is not None]
    missing = [t for t in dict.fromkeys(named) if t not in control and alpha_set.issuperset(t)]
    if missing:
        tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in missing])

    single, pair, specials = "$A:0", "$A:0 $B:1", []
    if info["add_bos_token"] and info["bos_token"] is not None:
        single, pair = f"{info['bos_token']}:0 {single}", f"{info['bos_token']}:0 $A:0 {info['bos_token']}:1 $B:1"
        specials.append((info["bos_token"], vocab[spell(info["bos_token"])]))
    if info["add_eos_token"] and info["eos_token"] is not None:
        single, pair = f"{single} {info['eos_token']}:0", f"{pair} {info['eos_token']}:1"
        if info["eos_token"] != info["bos_token"] or not info["add_bos_token"]:
            specials.append((info["eos_token"], vocab[spell(info["eos_token"])]))
    tok.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)
    return tok, info


SENTENCEPIECE_STYLES = {"gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "phi3": "phi3"}
"""``general.architecture`` -> how its SentencePiece vocabulary splits text (others: ``llama``)."""


def gguf_has_sentencepiece_tokenizer(meta: GGUFMetadata) -> bool:
    """Whether :func:`sentencepiece_tokenizer_from_gguf_metadata` can build this file's tokenizer: a
    SentencePiece BPE vocabulary (``tokenizer.ggml.model == "llama"``) with its merges or scores."""
    return (meta.get("tokenizer.ggml.model") == "llama" and "tokenizer.ggml.tokens" in meta.fields
            and ("tokenizer.ggml.merges" in meta.fields or "tokenizer.ggml.scores" in meta.fields))


def sentencepiece_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """The BPE merges a SentencePiece vocabulary implies (its files store pieces and scores, not merges):
    every split of a piece into two pieces of the vocabulary, the best-scored pieces' first; a piece's
    splits in vocabulary order, ties between pieces by shorter left, then right part (the order
    transformers derives, so the merges -- and the token ids -- are the same)."""
    found = []
    for piece, score in scores.items():
        splits = [(piece[:i], piece[i:], score) for i in range(1, len(piece))
                  if piece[:i] in vocab and piece[i:] in vocab]
        splits.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        found.extend(splits)
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in found]


def sentencepiece_tokenizer_from_gguf_metadata(meta: GGUFMetadata) -> tuple[Any, dict[str, Any]]:
    """``(tokenizers.Tokenizer, info)`` for a SentencePiece BPE GGUF vocabulary (``tokenizer.ggml.model ==
    "llama"``: Llama 2, Mistral 7B, Gemma, Phi-3 ...), as transformers builds it from the file:

    * merges from the file, else derived from the pieces' scores (Gemma: from their order, its scores
      do not follow the merges; its pieces of plain spaces are spelled with ``▁``);
    * byte fallback, unknown pieces fused; the text split as the family does: ``▁``-prefixed words
      (Llama), a ``▁`` prepended by the normalizer (Phi-3), spaces replaced and split after (Gemma);
    * CONTROL pieces special added tokens, USER_DEFINED ones plain added tokens; BOS added unless
      ``tokenizer.ggml.add_bos_token`` says otherwise; Gemma's tokenizer also names ``<mask>``.

    ``info`` is as :func:`tokenizer_from_gguf_metadata`'s (plus ``mask_token``).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    if not gguf_has_sentencepiece_tokenizer(meta):
        raise ValueError(f"{meta.path}: no SentencePiece BPE vocabulary with merges or scores "
                         f"(tokenizer.ggml.model={meta.get('tokenizer.ggml.model')!r})")
    style = SENTENCEPIECE_STYLES.get(meta.architecture or "", "llama")
    tokens: list[str] = file_strings(meta, "tokenizer.ggml.tokens")
    types = meta.get("tokenizer.ggml.token_type")
    types = [] if types is None else types.tolist()
    pieces = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens] if style == "gemma" else tokens
    vocab = {t: i for i, t in enumerate(pieces)}
    if "tokenizer.ggml.merges" in meta.fields:
        merges = [tuple(m.split(" ")) for m in file_strings(meta, "tokenizer.ggml.merges")]
    elif style == "gemma":
        merges = sentencepiece_merges(vocab, {t: -i for i, t in enumerate(pieces)})
    else:
        merges = sentencepiece_merges(vocab, dict(zip(pieces, meta.fields["tokenizer.ggml.scores"].tolist())))
    bpe = dict(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True, dropout=None)
    tok = Tokenizer(models.BPE(**bpe, unk_token="<unk>") if style == "gemma" else models.BPE(**bpe))
    strip = [] if style == "gemma" else [decoders.Strip(content=" ", left=1)]
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), *strip])
    if style == "gemma":
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    elif style == "phi3":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    # the special tokens of the tokenizer class transformers builds the vocabulary with, then the file's kinds
    defaults = ("<bos>", "<eos>", "<unk>", "<pad>", "<mask>") if style == "gemma" else ("<s>", "</s>", "<unk>")
    _add_missing(tok, defaults)
    control = [AddedToken(t, normalized=False, special=True) for t, ty in zip(tokens, types)
               if ty == TOKEN_TYPE_CONTROL]
    if control:
        tok.add_special_tokens(control)
    known = tok.get_vocab(with_added_tokens=True)
    user = [AddedToken(t, normalized=False, special=False) for t, ty in zip(tokens, types)
            if ty == TOKEN_TYPE_USER_DEFINED and t in known]
    if user:
        tok.add_tokens(user)
    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    info: dict[str, Any] = {
        "bos_token": _token_at(tokens, "tokenizer.ggml.bos_token_id", meta),
        "eos_token": _token_at(tokens, "tokenizer.ggml.eos_token_id", meta),
        "unk_token": _token_at(tokens, "tokenizer.ggml.unknown_token_id", meta),
        "pad_token": _token_at(tokens, "tokenizer.ggml.padding_token_id", meta),
        "add_bos_token": True if add_bos is None else bool(add_bos),  # llama.cpp's default for SentencePiece
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "chat_template": meta.get("tokenizer.chat_template"),
    }
    if style == "gemma":
        info["mask_token"] = "<mask>"
    _add_missing(tok, [info[k] for k in SPECIAL_TOKEN_NAMES if info.get(k) is not None])
    bos, eos = info["bos_token"], info["eos_token"]
    info["add_bos_token"] = info["add_bos_token"] and bos is not None
    info["add_eos_token"] = info["add_eos_token"] and eos is not None
    single = f"{bos + ':0 ' if info['add_bos_token'] else ''}$A:0{' ' + eos + ':0' if info['add_eos_token'] else ''}"
    pair = (f"{single}{' ' + bos + ':1' if info['add_bos_token'] else ''} $B:1"
            f"{' ' + eos + ':1' if info['add_eos_token'] else ''}")
    specials = ([(bos, tok.token_to_id(bos))] if info["add_bos_token"] else []) + \
        ([(eos, tok.token_to_id(eos))] if info["add_eos_token"] else [])
    tok.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)
    return tok, info


def _add_missing(tok: Any, names: Sequence[str]) -> None:
    """Add the named special tokens the added vocabulary lacks (as transformers' tokenizer classes do)."""
    from tokenizers import AddedToken

    added = {t.content for t in tok.get_added_tokens_decoder().values()}
    missing = [t for t in dict.fromkeys(names) if t not in added]
    if missing:
        tok.add_tokens([AddedToken(t, special=True) for t in missing])


SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
"""The named special tokens of a transformers tokenizer, in its order (a GGUF file names bos/eos/unk/pad by
id; Gemma's tokenizer class adds ``<mask>``)."""


class GGUFTokenizer:
    """A GGUF file's vocabulary (a ``tokenizers.Tokenizer``) behind the interface of a
    ``transformers`` fast tokenizer, as far as libremax and its users call it: ``encode``/``decode``/
    ``__call__``, the named special tokens and their ids, ``get_vocab``, ``convert_tokens_to_ids``,
    ``backend_tokenizer``, ``chat_template`` and ``apply_chat_template`` (jinja2, see
    :mod:`~max.pipelines.lib.chat_template`).  Token ids, decoded text, special tokens and chat text are
    those of ``PreTrainedTokenizerFast(tokenizer_object=..., bos_token=...)`` over the same vocabulary
    (``tests/pipelines/test_tokenizer.py`` compares them) -- without importing transformers.
    """

    is_fast = True

    def __init__(self, tokenizer: Any, *, bos_token: str | None = None, eos_token: str | None = None,
                 unk_token: str | None = None, pad_token: str | None = None, sep_token: str | None = None,
                 cls_token: str | None = None, mask_token: str | None = None, chat_template: str | None = None,
                 add_bos_token: bool = False, add_eos_token: bool = False, name_or_path: str = "") -> None:
        from tokenizers import AddedToken

        self._tokenizer = tokenizer
        self.bos_token, self.eos_token, self.unk_token, self.pad_token = bos_token, eos_token, unk_token, pad_token
        self.sep_token, self.cls_token, self.mask_token = sep_token, cls_token, mask_token
        self.chat_template = chat_template
        self.name_or_path = name_or_path
        self.init_kwargs: dict[str, Any] = {"add_bos_token": add_bos_token, "add_eos_token": add_eos_token}
        # a named special token missing from the added vocabulary becomes one (as transformers does)
        added = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
        missing = [t for t in dict.fromkeys(self.special_tokens_map.values()) if t not in added]
        if missing:
            tokenizer.add_tokens([AddedToken(t, special=True) for t in missing])

    # -- vocabulary
    @property
    def backend_tokenizer(self) -> Any:
        """The ``tokenizers.Tokenizer``."""
        return self._tokenizer

    def __len__(self) -> int:
        """Size of the vocabulary with the added tokens."""
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def vocab_size(self) -> int:
        """Size of the base vocabulary (without the added tokens)."""
        return self._tokenizer.get_vocab_size(with_added_tokens=False)

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab(with_added_tokens=True)

    def get_added_vocab(self) -> dict[str, int]:
        return {t.content: i for i, t in sorted(self._tokenizer.get_added_tokens_decoder().items())}

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> Any:
        if isinstance(tokens, str):
            return self._tokenizer.token_to_id(tokens)
        return [self._tokenizer.token_to_id(t) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | Sequence[int], skip_special_tokens: bool = False) -> Any:
        if isinstance(ids, int):
            return self._tokenizer.id_to_token(ids)
        skip = set(self.all_special_ids) if skip_special_tokens else set()
        return [self._tokenizer.id_to_token(int(i)) for i in ids if int(i) not in skip]

    # -- special tokens
    @property
    def special_tokens_map(self) -> dict[str, str]:
        """``{"bos_token": "<s>", ...}`` for the named special tokens the vocabulary has."""
        return {k: getattr(self, k) for k in SPECIAL_TOKEN_NAMES if getattr(self, k) is not None}

    @property
    def all_special_tokens(self) -> list[str]:
        return list(dict.fromkeys(self.special_tokens_map.values()))

    @property
    def all_special_ids(self) -> list[int]:
        return [self._tokenizer.token_to_id(t) for t in self.all_special_tokens]

    @property
    def bos_token_id(self) -> int | None:
        return None if self.bos_token is None else self._tokenizer.token_to_id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return None if self.eos_token is None else self._tokenizer.token_to_id(self.eos_token)

    @property
    def unk_token_id(self) -> int | None:
        return None if self.unk_token is None else self._tokenizer.token_to_id(self.unk_token)

    @property
    def pad_token_id(self) -> int | None:
        return None if self.pad_token is None else self._tokenizer.token_to_id(self.pad_token)

    @property
    def sep_token_id(self) -> int | None:
        return None if self.sep_token is None else self._tokenizer.token_to_id(self.sep_token)

    @property
    def cls_token_id(self) -> int | None:
        return None if self.cls_token is None else self._tokenizer.token_to_id(self.cls_token)

    @property
    def mask_token_id(self) -> int | None:
        return None if self.mask_token is None else self._tokenizer.token_to_id(self.mask_token)

    # -- encode / decode
    def _encode(self, text: str, add_special_tokens: bool, max_length: int | None) -> list[int]:
        if max_length is None:
            return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        enc = self._tokenizer.encode(text, add_special_tokens=False)
        room = max_length - (self._tokenizer.num_special_tokens_to_add(False) if add_special_tokens else 0)
        enc.truncate(max(room, 0))
        return self._tokenizer.post_process(enc, add_special_tokens=add_special_tokens).ids

    def encode(self, text: str, add_special_tokens: bool = True, truncation: bool = False,
               max_length: int | None = None, **unused: Any) -> list[int]:
        """Token ids of ``text`` (``truncation`` with ``max_length``: at most that many, special tokens
        included)."""
        return self._encode(text, add_special_tokens, max_length if truncation else None)

    def __call__(self, text: str | Sequence[str], add_special_tokens: bool = True, truncation: bool = False,
                 max_length: int | None = None, **unused: Any) -> dict[str, Any]:
        """``{"input_ids": ..., "attention_mask": ...}`` of a text or a list of texts."""
        limit = max_length if truncation else None
        if isinstance(text, str):
            ids = self._encode(text, add_special_tokens, limit)
            return {"input_ids": ids, "attention_mask": [1] * len(ids)}
        rows = [self._encode(t, add_special_tokens, limit) for t in text]
        return {"input_ids": rows, "attention_mask": [[1] * len(r) for r in rows]}

    def tokenize(self, text: str, add_special_tokens: bool = False, **unused: Any) -> list[str]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).tokens

    def decode(self, token_ids: Any, skip_special_tokens: bool = False, **unused: Any) -> Any:
        """Text of a sequence of ids (a list of strings for a batch of sequences)."""
        if hasattr(token_ids, "tolist"):
            token_ids = token_ids.tolist()
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        if token_ids and isinstance(token_ids[0], (list, tuple)):
            return [self.decode(t, skip_special_tokens) for t in token_ids]
        return self._tokenizer.decode([int(t) for t in token_ids], skip_special_tokens=skip_special_tokens)

    def batch_decode(self, sequences: Any, skip_special_tokens: bool = False, **unused: Any) -> list[str]:
        return [self.decode(s, skip_special_tokens) for s in sequences]

    # -- chat
    def apply_chat_template(self, conversation: Sequence[Any], tools: Sequence[Any] | None = None,
                            documents: Sequence[Any] | None = None, chat_template: str | None = None,
                            add_generation_prompt: bool = False, continue_final_message: bool | str = False,
                            tokenize: bool = True, return_dict: bool = True, **kwargs: Any) -> Any:
        """The conversation through the chat template (``tokenize``: its token ids, as
        ``{"input_ids": ...}`` when ``return_dict``); ``kwargs`` are template variables."""
        from max.pipelines.lib.chat_template import render_chat_template

        template = chat_template if chat_template is not None else self.chat_template
        if not template:
            raise ValueError("the tokenizer has no chat template; pass chat_template=")
        text = render_chat_template(template, conversation, tools=tools, documents=documents,
                                    add_generation_prompt=add_generation_prompt,
                                    continue_final_message=continue_final_message,
                                    **{**self.special_tokens_map, **kwargs})
        if not tokenize:
            return text
        ids = self._encode(text, False, None)
        return {"input_ids": ids, "attention_mask": [1] * len(ids)} if return_dict else ids

    def __repr__(self) -> str:
        return (f"GGUFTokenizer(name_or_path={self.name_or_path!r}, vocab_size={len(self)}, "
                f"special_tokens={self.special_tokens_map})")


def hf_tokenizer_from_gguf(path: str | os.PathLike) -> Any:
    """A fast tokenizer for the GGUF file at ``path`` with the interface of a ``transformers`` one.

    Byte-level and SentencePiece BPE vocabularies are built directly as a :class:`GGUFTokenizer` (no
    transformers import); other vocabularies go through
    ``AutoTokenizer.from_pretrained(dir, gguf_file=name)`` (slow: transformers converts the
    vocabulary in Python).
    """
    meta = read_gguf_metadata(path)
    if gguf_has_fast_tokenizer(meta):
        tok, info = tokenizer_from_gguf_metadata(meta)
    elif gguf_has_sentencepiece_tokenizer(meta):
        tok, info = sentencepiece_tokenizer_from_gguf_metadata(meta)
    else:
        from transformers import AutoTokenizer

        p = os.path.abspath(os.fspath(path))
        return AutoTokenizer.from_pretrained(os.path.dirname(p), gguf_file=os.path.basename(p))
    return GGUFTokenizer(tok, **info, name_or_path=os.fspath(path))
