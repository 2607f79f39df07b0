"""A tiny random Whisper checkpoint with a locally written tokenizer (no downloads), and test audio:
real speech from Debian's ``espeak-ng`` (installed with apt-get when missing and running as root), or a
synthetic voiced signal (harmonics with a moving pitch, bursts of noise) when it cannot be had."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
import wave

import numpy as np
import pytest

from support import apt_install

os.environ.setdefault("HF_HUB_OFFLINE", "1")

LANGS = ["en", "de", "fr"]
_SPECIAL = ["<|endoftext|>", "<|startoftranscript|>", *[f"<|{c}|>" for c in LANGS], "<|translate|>",
            "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]
_MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "a"), ("i", "n"), ("e", "r"), ("Ġ", "s"), ("o", "n"),
           ("Ġ", "w"), ("r", "e"), ("a", "t"), ("Ġ", "o"), ("e", "n"), ("Ġ", "i"), ("o", "r"), ("Ġ", "c")]


def _byte_chars() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes (the byte-level BPE alphabet)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return [out[b] for b in range(256)]


def _fill(vocab: dict, size: int) -> None:
    """Filler words (never produced by the merges, decodable) until ``vocab`` has ``size`` entries."""
    i = 0
    while len(vocab) < size:
        w, n = "", i
        while True:
            w, n = chr(ord("a") + n % 26) + w, n // 26
            if not n:
                break
        vocab.setdefault("zz" + w, len(vocab))
        i += 1


TINY = dict(d_model=64, encoder_layers=2, encoder_attention_heads=4, decoder_layers=2, decoder_attention_heads=4,
            encoder_ffn_dim=128, decoder_ffn_dim=128, max_target_positions=96)
WHISPER_TINY = dict(d_model=384, encoder_layers=4, encoder_attention_heads=6, decoder_layers=4,
                    decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536, max_target_positions=448)
"""openai/whisper-tiny's sizes (bench/audio.py; with ``text_vocab=50257`` its vocabulary size too)."""


def _write_bpe(d: str, byte_chars: list[str], text_vocab: int) -> dict:
    """vocab.json and merges.txt in ``d``: the byte characters in ``byte_chars``' order, the merges, filler
    text tokens up to ``text_vocab``; the vocabulary written."""
    vocab = {c: i for i, c in enumerate(byte_chars)}
    for a, b in _MERGES:
        vocab[a + b] = len(vocab)
    _fill(vocab, text_vocab)
    with open(os.path.join(d, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(d, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in _MERGES))
    return vocab


def whisper_pair(d: str, **hf_kwargs) -> tuple:
    """``(WhisperPipeline, transformers model, feature extractor)`` of the checkpoint folder ``d``, as the
    Whisper tests compare them (batch 4, 16-token pages)."""
    import transformers

    from max.pipelines.architectures.whisper.transcribe import WhisperPipeline
    from max.pipelines.lib import PipelineConfig

    pipe = WhisperPipeline(PipelineConfig(model_path=d, max_batch_size=4, kv_cache_page_size=16))
    hf = transformers.WhisperForConditionalGeneration.from_pretrained(d, **hf_kwargs).eval()
    return pipe, hf, transformers.WhisperFeatureExtractor(feature_size=80)


def _whisper_tokenizer(d: str, special: list) -> "object":
    """The WhisperTokenizer of the vocab.json / merges.txt in ``d`` with ``special`` (``<|endoftext|>`` first) and
    the 1501 timestamp tokens added after the text vocabulary, as the released tokenizers order them."""
    import transformers

    tok = transformers.WhisperTokenizer(os.path.join(d, "vocab.json"), os.path.join(d, "merges.txt"),
                                        unk_token="<|endoftext|>", bos_token="<|endoftext|>",
                                        eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.add_tokens(special[1:], special_tokens=True)
    tok.add_tokens([f"<|{i * 0.02:.2f}|>" for i in range(1501)])
    return tok


@functools.lru_cache(maxsize=None)
def tiny_whisper_dir(seed: int = 0, sizes: tuple = tuple(TINY.items()), text_vocab: int = 0) -> str:
    """Folder with config.json, generation_config.json, model.safetensors, vocab.json/merges.txt and the
    tokenizer's added tokens: vocab = 256 bytes + merges (+ filler text tokens up to ``text_vocab``) + 11 specials
    + 1501 timestamps."""
    import transformers

    d = tempfile.mkdtemp(prefix="tiny-whisper-")
    vocab = _write_bpe(d, _byte_chars(), text_vocab)
    base = len(vocab)
    tok = _whisper_tokenizer(d, _SPECIAL)
    ids = {t: tok.convert_tokens_to_ids(t) for t in _SPECIAL}
    assert ids["<|endoftext|>"] == base and ids["<|notimestamps|>"] == base + len(_SPECIAL) - 1, ids
    vocab_size = len(tok)
    tok.save_pretrained(d)
    cfg = transformers.WhisperConfig(
        vocab_size=vocab_size, num_mel_bins=80, **dict(sizes), max_source_positions=1500, init_std=0.2,
        decoder_start_token_id=ids["<|startoftranscript|>"], eos_token_id=ids["<|endoftext|>"],
        bos_token_id=ids["<|endoftext|>"], pad_token_id=ids["<|endoftext|>"], suppress_tokens=None,
        begin_suppress_tokens=None)
    model = _random_model(cfg, seed, ids["<|notimestamps|>"] + 1)
    gc = model.generation_config
    gc.decoder_start_token_id = ids["<|startoftranscript|>"]
    gc.eos_token_id = ids["<|endoftext|>"]
    gc.pad_token_id = ids["<|endoftext|>"]
    gc.no_timestamps_token_id = ids["<|notimestamps|>"]
    gc.prev_sot_token_id = ids["<|startofprev|>"]
    gc.lang_to_id = {f"<|{c}|>": ids[f"<|{c}|>"] for c in LANGS}
    gc.task_to_id = {"translate": ids["<|translate|>"], "transcribe": ids["<|transcribe|>"]}
    gc.is_multilingual = True
    gc.max_initial_timestamp_index = 50
    gc.suppress_tokens = [vocab["!"], vocab["#"], ids["<|startoflm|>"]]
    gc.begin_suppress_tokens = [vocab["Ġ"], ids["<|endoftext|>"]]
    gc.max_length = dict(sizes)["max_target_positions"]
    gc.alignment_heads = [[1, 0], [1, 2], [0, 3]]  # word timestamps (any heads serve on random weights)
    gc._from_model_config = False
    model.save_pretrained(d)
    return d


def _random_model(cfg, seed: int, timestamp_begin: int):
    """A random ``WhisperForConditionalGeneration`` of ``cfg`` with sharper logits than the default init (argmax
    margins well above rounding)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.WhisperForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "layer_norm" in name:
                p.normal_(0, 0.3) if name.endswith("bias") else p.uniform_(0.5, 1.5)
        # timestamp rows of the (tied) output small: text wins where no timestamps are asked for, so a short
        # request is one window; with timestamps their summed probability still often wins
        model.model.decoder.embed_tokens.weight[timestamp_begin:] *= 0.05
    return model


# The released multilingual checkpoints' generation settings (openai/whisper-tiny ... -large-v2,
# generation_config.json): the 88 suppressed tokens (punctuation and symbol tokens of the GPT-2 byte-level
# vocabulary, then <|startoftranscript|>, <|translate|>, <|transcribe|>, <|startoflm|>, <|startofprev|>,
# <|nocaptions|>), the first step's suppressed " " and <|endoftext|>, and the prompt left to the request:
# a detected language at position 1, <|transcribe|> at position 2.
RELEASED_SUPPRESS_TOKENS = [
    1, 2, 7, 8, 9, 10, 14, 25, 26, 27, 28, 29, 31, 58, 59, 60, 61, 62, 63, 90, 91, 92, 93, 359, 503, 522, 542, 873,
    893, 902, 918, 922, 931, 1350, 1853, 1982, 2460, 2627, 3246, 3253, 3268, 3536, 3846, 3961, 4183, 4667, 6585,
    6647, 7273, 9061, 9383, 10428, 10929, 11938, 12033, 12331, 12562, 13793, 14157, 14635, 15265, 15618, 16553,
    16604, 18362, 18956, 20075, 21675, 22520, 26130, 26161, 26435, 28279, 29464, 31650, 32302, 32470, 36865, 42863,
    47425, 49870, 50254, 50258, 50358, 50359, 50360, 50361, 50362]
RELEASED_BEGIN_SUPPRESS_TOKENS = [220, 50257]
RELEASED_FORCED_DECODER_IDS = [[1, None], [2, 50359]]
RELEASED_TEXT_VOCAB = 50257  # byte-level BPE tokens 0..50256; <|endoftext|> is 50257


def _gpt2_byte_order() -> list[str]:
    """The 256 byte symbols in GPT-2's vocabulary order: the printable bytes first (``!`` is 0), then the
    remapped ones in byte order (``Ġ``, the space, is 220)."""
    chars = _byte_chars()
    keep = [b for b in range(256) if chars[b] == chr(b)]
    return [chars[b] for b in keep] + [chars[b] for b in range(256) if chars[b] != chr(b)]


@functools.lru_cache(maxsize=None)
def released_whisper_dir(seed: int = 0, max_target_positions: int = 96) -> str:
    """A tiny random Whisper (``TINY`` sizes) with the released multilingual checkpoints' token layout and
    generation config: vocabulary 51865 (50257 byte-level BPE tokens in GPT-2's byte order, filler words
    after the merges; <|endoftext|> 50257, <|startoftranscript|> 50258, the 99 languages 50259..50357,
    <|translate|> 50358, <|transcribe|> 50359, <|startoflm|> 50360, <|startofprev|> 50361, <|nocaptions|> 50362,
    <|notimestamps|> 50363, timestamps 50364..51864), and generation_config.json with ``forced_decoder_ids``
    ``[[1, null], [2, 50359]]``, the released ``suppress_tokens`` / ``begin_suppress_tokens``, ``lang_to_id``,
    ``task_to_id``, ``no_timestamps_token_id``, ``max_initial_timestamp_index`` 50, ``is_multilingual``.  The
    config.json carries the released config's own (older) ``forced_decoder_ids`` ``[[1, <|en|>], [2,
    <|transcribe|>], [3, <|notimestamps|>]]``, which the generation config overrides."""
    import transformers
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    langs = list(LANGUAGES)[:99]  # the released checkpoints' 99 (large-v3 adds yue)
    d = tempfile.mkdtemp(prefix="released-whisper-")
    vocab = _write_bpe(d, _gpt2_byte_order(), RELEASED_TEXT_VOCAB)
    special = ["<|endoftext|>", "<|startoftranscript|>", *[f"<|{c}|>" for c in langs], "<|translate|>",
               "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>", "<|notimestamps|>"]
    tok = _whisper_tokenizer(d, special)
    ids = {t: tok.convert_tokens_to_ids(t) for t in special}
    want = {"<|endoftext|>": 50257, "<|startoftranscript|>": 50258, "<|en|>": 50259, "<|su|>": 50357,
            "<|translate|>": 50358, "<|transcribe|>": 50359, "<|startoflm|>": 50360, "<|startofprev|>": 50361,
            "<|nocaptions|>": 50362, "<|notimestamps|>": 50363}
    assert {k: ids[k] for k in want} == want and len(tok) == 51865, ({k: ids[k] for k in want}, len(tok))
    assert tok.convert_tokens_to_ids("<|0.00|>") == 50364 and vocab["Ġ"] == 220 and vocab["!"] == 0
    tok.save_pretrained(d)
    cfg = transformers.WhisperConfig(
        vocab_size=51865, num_mel_bins=80, **{**TINY, "max_target_positions": max_target_positions},
        max_source_positions=1500, init_std=0.2, decoder_start_token_id=50258, eos_token_id=50257,
        bos_token_id=50257, pad_token_id=50257, suppress_tokens=RELEASED_SUPPRESS_TOKENS,
        begin_suppress_tokens=RELEASED_BEGIN_SUPPRESS_TOKENS)
    model = _random_model(cfg, seed, 50364)
    model.config.forced_decoder_ids = [[1, 50259], [2, 50359], [3, 50363]]
    gc = model.generation_config
    gc.decoder_start_token_id, gc.eos_token_id, gc.pad_token_id, gc.bos_token_id = 50258, 50257, 50257, 50257
    gc.no_timestamps_token_id = 50363
    gc.prev_sot_token_id = 50361
    gc.lang_to_id = {f"<|{c}|>": ids[f"<|{c}|>"] for c in langs}
    gc.task_to_id = {"translate": 50358, "transcribe": 50359}
    gc.is_multilingual = True
    gc.max_initial_timestamp_index = 50
    gc.forced_decoder_ids = RELEASED_FORCED_DECODER_IDS
    gc.suppress_tokens = list(RELEASED_SUPPRESS_TOKENS)
    gc.begin_suppress_tokens = list(RELEASED_BEGIN_SUPPRESS_TOKENS)
    gc.max_length = 448
    gc.alignment_heads = [[1, 0], [1, 2], [0, 3]]
    gc._from_model_config = False
    model.save_pretrained(d)
    return d


def _install_espeak() -> str | None:
    if shutil.which("espeak-ng"):
        return None
    why = apt_install("espeak-ng")
    return why if why is not None or shutil.which("espeak-ng") else "apt-get installed espeak-ng but it is not on PATH"


def _resample(x: np.ndarray, sr: int, to: int = 16000) -> np.ndarray:
    if sr == to:
        return x
    t = np.arange(int(len(x) * to / sr)) * (sr / to)
    return np.interp(t, np.arange(len(x)), x).astype(np.float32)


@functools.lru_cache(maxsize=None)
def speech(text: str = "The quick brown fox jumps over the lazy dog.") -> tuple[np.ndarray, str]:
    """``(16 kHz mono float32 samples, how they were made)``: espeak-ng speech, else a synthetic voice."""
    why = _install_espeak()
    if why is None:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "s.wav")
            r = subprocess.run(["espeak-ng", "-w", path, text], capture_output=True, timeout=60)
            if r.returncode == 0 and os.path.getsize(path) > 44:
                with wave.open(path) as w:
                    sr, n = w.getframerate(), w.getnframes()
                    pcm = np.frombuffer(w.readframes(n), np.int16).astype(np.float32) / 32768.0
                    if w.getnchannels() > 1:
                        pcm = pcm.reshape(-1, w.getnchannels()).mean(axis=1)
                return _resample(pcm, sr), "espeak-ng"
            why = f"espeak-ng failed: {r.stderr[-200:]!r}"
    return synthetic_voice(3.0), f"synthetic ({why})"


@pytest.fixture(scope="module")
def audio() -> np.ndarray:
    """The test speech (:func:`speech`), its origin printed; test modules import this fixture."""
    a, how = speech()
    print("test audio:", how)
    return a


def synthetic_voice(seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16000)) / 16000
    f0 = 120 + 40 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / 16000
    x = sum(np.sin(k * phase) / k for k in range(1, 8)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t) ** 2)
    x = x + 0.05 * rng.standard_normal(t.size) * (np.sin(2 * np.pi * 1.3 * t) > 0.6)
    return (0.3 * x / np.abs(x).max()).astype(np.float32)
