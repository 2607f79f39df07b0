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


TINY = dict(d_model=64, encoder_layers=2, encoder_attention_heads=4, decoder_layers=2, decoder_attention_heads=4,
            encoder_ffn_dim=128, decoder_ffn_dim=128, max_target_positions=96)
WHISPER_TINY = dict(d_model=384, encoder_layers=4, encoder_attention_heads=6, decoder_layers=4,
                    decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536, max_target_positions=448)
"""openai/whisper-tiny's sizes (bench/audio.py; with ``text_vocab=50257`` its vocabulary size too)."""


@functools.lru_cache(maxsize=None)
def tiny_whisper_dir(seed: int = 0, sizes: tuple = tuple(TINY.items()), text_vocab: int = 0) -> str:
    """Folder with config.json, generation_config.json, model.safetensors, vocab.json/merges.txt and the
    tokenizer's added tokens: vocab = 256 bytes + merges (+ filler text tokens up to ``text_vocab``) + 11 specials
    + 1501 timestamps."""
    import torch
    import transformers

    d = tempfile.mkdtemp(prefix="tiny-whisper-")
    vocab = {c: i for i, c in enumerate(_byte_chars())}
    for a, b in _MERGES:
        vocab[a + b] = len(vocab)
    i = 0
    while len(vocab) < text_vocab:  # filler words (never produced by the merges, decodable)
        w, n = "", i
        while True:
            w, n = chr(ord("a") + n % 26) + w, n // 26
            if not n:
                break
        vocab.setdefault("zz" + w, len(vocab))
        i += 1
    with open(os.path.join(d, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(d, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in _MERGES))
    base = len(vocab)
    tok = transformers.WhisperTokenizer(os.path.join(d, "vocab.json"), os.path.join(d, "merges.txt"),
                                        unk_token="<|endoftext|>", bos_token="<|endoftext|>",
                                        eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.add_tokens(_SPECIAL[1:], special_tokens=True)
    tok.add_tokens([f"<|{i * 0.02:.2f}|>" for i in range(1501)])
    ids = {t: tok.convert_tokens_to_ids(t) for t in _SPECIAL}
    assert ids["<|endoftext|>"] == base and ids["<|notimestamps|>"] == base + len(_SPECIAL) - 1, ids
    vocab_size = len(tok)
    tok.save_pretrained(d)
    cfg = transformers.WhisperConfig(
        vocab_size=vocab_size, num_mel_bins=80, **dict(sizes), max_source_positions=1500, init_std=0.2,
        decoder_start_token_id=ids["<|startoftranscript|>"], eos_token_id=ids["<|endoftext|>"],
        bos_token_id=ids["<|endoftext|>"], pad_token_id=ids["<|endoftext|>"], suppress_tokens=None,
        begin_suppress_tokens=None)
    torch.manual_seed(seed)
    model = transformers.WhisperForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # sharper logits than the default init: argmax margins well above rounding
        for name, p in model.named_parameters():
            if name.endswith("bias") or "layer_norm" in name:
                p.normal_(0, 0.3) if name.endswith("bias") else p.uniform_(0.5, 1.5)
        # timestamp rows of the (tied) output small: text wins where no timestamps are asked for, so a short
        # request is one window; with timestamps their summed probability still often wins
        model.model.decoder.embed_tokens.weight[ids["<|notimestamps|>"] + 1:] *= 0.05
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


def synthetic_voice(seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16000)) / 16000
    f0 = 120 + 40 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / 16000
    x = sum(np.sin(k * phase) / k for k in range(1, 8)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t) ** 2)
    x = x + 0.05 * rng.standard_normal(t.size) * (np.sin(2 * np.pi * 1.3 * t) > 0.6)
    return (0.3 * x / np.abs(x).max()).astype(np.float32)
