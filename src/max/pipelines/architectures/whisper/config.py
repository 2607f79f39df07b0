"""Whisper configuration (``WhisperForConditionalGeneration``): an audio encoder (two convolutions over the
log-mel spectrogram, sinusoidal position table, pre-LayerNorm layers) and a text decoder (learned
positions, self-attention, cross-attention over the encoder output, GELU MLP), the output projection tied to
the token embedding; plus the generation settings transcription needs (special tokens, languages, tasks,
suppressed tokens) from ``generation_config.json`` when the checkpoint has one."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from max.interfaces.errors import InvalidRequest

ARCHITECTURE = "WhisperForConditionalGeneration"

SAMPLING_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_SECONDS = 30
N_SAMPLES = SAMPLING_RATE * CHUNK_SECONDS  # one window of audio: 480000 samples
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 mel frames per window
TIME_PRECISION = 0.02  # seconds per timestamp token step (one encoder position)


@dataclass(frozen=True)
class WhisperConfig:
    d_model: int
    encoder_layers: int
    encoder_attention_heads: int
    encoder_ffn_dim: int
    decoder_layers: int
    decoder_attention_heads: int
    decoder_ffn_dim: int
    num_mel_bins: int
    max_source_positions: int
    max_target_positions: int
    vocab_size: int
    activation_function: str = "gelu"
    scale_embedding: bool = False
    decoder_start_token_id: int = 50258
    eos_token_id: int = 50257
    architecture: str = ARCHITECTURE

    @property
    def head_dim(self) -> int:
        return self.d_model // self.decoder_attention_heads

    @property
    def encoder_head_dim(self) -> int:
        return self.d_model // self.encoder_attention_heads


def config_from_hf(hf: dict) -> WhisperConfig:
    def need(k: str) -> Any:
        if k not in hf:
            raise ValueError(f"{ARCHITECTURE}: the config has no {k!r}")
        return hf[k]

    c = WhisperConfig(
        d_model=int(need("d_model")), encoder_layers=int(need("encoder_layers")),
        encoder_attention_heads=int(need("encoder_attention_heads")), encoder_ffn_dim=int(need("encoder_ffn_dim")),
        decoder_layers=int(need("decoder_layers")), decoder_attention_heads=int(need("decoder_attention_heads")),
        decoder_ffn_dim=int(need("decoder_ffn_dim")), num_mel_bins=int(hf.get("num_mel_bins", 80)),
        max_source_positions=int(hf.get("max_source_positions", 1500)),
        max_target_positions=int(hf.get("max_target_positions", 448)), vocab_size=int(need("vocab_size")),
        activation_function=str(hf.get("activation_function", "gelu")),
        scale_embedding=bool(hf.get("scale_embedding", False)),
        decoder_start_token_id=int(hf.get("decoder_start_token_id", 50258)),
        eos_token_id=int(hf.get("eos_token_id", 50257)))
    for what, heads in (("encoder", c.encoder_attention_heads), ("decoder", c.decoder_attention_heads)):
        if c.d_model % heads:
            raise ValueError(f"{ARCHITECTURE}: d_model {c.d_model} is not divisible by {what}_attention_heads {heads}")
    if c.max_source_positions * 2 != N_FRAMES:
        raise ValueError(f"{ARCHITECTURE}: max_source_positions must be {N_FRAMES // 2} (30 s windows of "
                         f"{N_FRAMES} mel frames, halved by the second convolution), got {c.max_source_positions}")
    return c


@dataclass
class GenerationSettings:
    """What decoding needs beside the weights (Hugging Face ``generation_config.json`` names)."""

    decoder_start_token_id: int
    eos_token_id: int
    no_timestamps_token_id: int | None = None
    lang_to_id: dict[str, int] = field(default_factory=dict)
    task_to_id: dict[str, int] = field(default_factory=dict)
    suppress_tokens: list[int] = field(default_factory=list)
    begin_suppress_tokens: list[int] = field(default_factory=list)
    max_initial_timestamp_index: int | None = None
    is_multilingual: bool = True
    forced_decoder_ids: list[tuple[int, int | None]] = field(default_factory=list)
    """``(position, token)`` pairs the decoder prompt starts with when a request gives neither a language nor a
    task (``[(1, None), (2, <|transcribe|>)]`` on the released multilingual checkpoints: a detected language,
    then transcribe); ignored when either is given, as transformers does."""
    prev_sot_token_id: int | None = None
    max_length: int = 448
    alignment_heads: list[tuple[int, int]] = field(default_factory=list)
    """``(decoder layer, head)`` pairs whose cross-attention follows the speech (word timestamps)."""
    median_filter_width: int = 7

    @property
    def timestamp_begin(self) -> int | None:
        return None if self.no_timestamps_token_id is None else self.no_timestamps_token_id + 1

    def language_id(self, language: str) -> int:
        """The token of ``language`` (``en``, ``<|en|>`` or ``english``); ValueError naming the choices."""
        from max.pipelines.lib.transcription import LANGUAGE_CODES

        key = language.strip().lower()
        if key in LANGUAGE_CODES:
            key = LANGUAGE_CODES[key]
        tok = key if key.startswith("<|") else f"<|{key}|>"
        if tok not in self.lang_to_id:
            raise InvalidRequest(f"language {language!r} is not supported by this model (supported: "
                                 f"{', '.join(sorted(t.strip('<|>') for t in self.lang_to_id)) or 'none'})",
                                 param="language")
        return self.lang_to_id[tok]


def generation_settings(model_dir: str | None, cfg: WhisperConfig, hf: dict) -> GenerationSettings:
    g: dict = {}
    path = os.path.join(model_dir, "generation_config.json") if model_dir else None
    if path and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            g = json.load(f)
    eos = g.get("eos_token_id", cfg.eos_token_id)
    forced = g.get("forced_decoder_ids")
    if forced is None:  # transformers falls back to the model config's
        forced = hf.get("forced_decoder_ids")
    s = GenerationSettings(
        decoder_start_token_id=int(g.get("decoder_start_token_id", cfg.decoder_start_token_id)),
        eos_token_id=int(eos[0] if isinstance(eos, list) else eos),
        no_timestamps_token_id=g.get("no_timestamps_token_id"),
        lang_to_id=dict(g.get("lang_to_id") or {}), task_to_id=dict(g.get("task_to_id") or {}),
        suppress_tokens=list(g.get("suppress_tokens") or hf.get("suppress_tokens") or []),
        begin_suppress_tokens=list(g.get("begin_suppress_tokens") or hf.get("begin_suppress_tokens") or []),
        max_initial_timestamp_index=g.get("max_initial_timestamp_index"),
        is_multilingual=bool(g.get("is_multilingual", bool(g.get("lang_to_id")))),
        forced_decoder_ids=_forced_ids(forced),
        prev_sot_token_id=g.get("prev_sot_token_id"),
        max_length=int(g.get("max_length") or cfg.max_target_positions),
        alignment_heads=[(int(a), int(b)) for a, b in (g.get("alignment_heads") or [])],
        median_filter_width=int(hf.get("median_filter_width") or 7))
    return s


def _forced_ids(forced: Any) -> list[tuple[int, int | None]]:
    """``forced_decoder_ids`` checked: ``[[position, token or null], ...]`` for positions 1, 2, ... in order (the
    prompt pattern transformers accepts; a list not starting at position 1 is ignored, as transformers does)."""
    if not forced:
        return []
    try:
        pairs = [(int(i), None if t is None else int(t)) for i, t in forced]
    except (TypeError, ValueError):
        raise ValueError(f"{ARCHITECTURE}: forced_decoder_ids must be a list of [position, token id or null] pairs, "
                         f"got {forced!r}") from None
    if pairs[0][0] != 1:
        return []
    if [i for i, _ in pairs] != list(range(1, len(pairs) + 1)):
        raise ValueError(f"{ARCHITECTURE}: forced_decoder_ids {forced!r} must give positions 1, 2, ... in order "
                         "(Whisper's prompt pattern)")
    return pairs
