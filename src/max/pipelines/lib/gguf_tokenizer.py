"""Build a Hugging Face fast tokenizer straight from GGUF tokenizer metadata.

Only byte-level BPE vocabularies (``tokenizer.ggml.model == "gpt2"``: GPT-2, Llama-3,
Qwen2, SmolLM, ...) take the fast path: the vocabulary, merges and special tokens are
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

Other vocabularies (SentencePiece ``llama``, ``t5``, ...) fall back to transformers.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

from max.pipelines.lib.gguf_utils import GGUFMetadata, read_gguf_metadata

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
    tokens: list[str] = meta.fields["tokenizer.ggml.tokens"]
    types = meta.get("tokenizer.ggml.token_type")
    types = [] if types is None else types.tolist()
    alphabet = byte_level_alphabet()
    alpha_set = frozenset(alphabet.values())

    def spell(tok: str) -> str:
        if alpha_set.issuperset(tok):
            return tok
        return "".join(alphabet[b] for b in tok.encode("utf-8"))

    vocab = {spell(t): i for i, t in enumerate(tokens)}
    raw_merges = meta.get("tokenizer.ggml.merges") or []
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


def hf_tokenizer_from_gguf(path: str | os.PathLike) -> Any:
    """A ``transformers`` fast tokenizer for the GGUF file at ``path``.

    Byte-level BPE vocabularies are built directly (well under a second); other
    vocabularies go through ``AutoTokenizer.from_pretrained(dir, gguf_file=name)``
    (slow: transformers converts the vocabulary in Python).
    """
    meta = read_gguf_metadata(path)
    if not gguf_has_fast_tokenizer(meta):
        from transformers import AutoTokenizer

        p = os.path.abspath(os.fspath(path))
        return AutoTokenizer.from_pretrained(os.path.dirname(p), gguf_file=os.path.basename(p))
    from transformers import PreTrainedTokenizerFast

    tok, info = tokenizer_from_gguf_metadata(meta)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=info["bos_token"],
        eos_token=info["eos_token"],
        unk_token=info["unk_token"],
        pad_token=info["pad_token"],
        chat_template=info["chat_template"],
    )
    # ``add_bos_token`` is honoured by the post-processor set above; record it too.
    hf.init_kwargs["add_bos_token"] = info["add_bos_token"]
    hf.init_kwargs["add_eos_token"] = info["add_eos_token"]
    return hf
