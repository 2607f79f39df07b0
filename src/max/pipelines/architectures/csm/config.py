"""Sesame CSM configuration (``CsmForConditionalGeneration``): a Llama backbone over audio frames (each
frame: one code per codebook; a prompt position is a text token or a frame), whose head gives codebook 0,
and a small Llama "depth decoder" that writes codebooks 1..N-1 of each frame from the backbone's last hidden
state; a Mimi codec turns frames into audio.  Plus the generation settings of ``generation_config.json``
(the backbone's and the ``depth_decoder_`` ones)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from max.pipelines.architectures.common.config import DecoderConfig, hf_common

ARCHITECTURE = "CsmForConditionalGeneration"


@dataclass(frozen=True)
class CsmConfig:
    backbone: DecoderConfig
    depth: DecoderConfig
    num_codebooks: int
    codebook_vocab: int
    """Codes per codebook (the backbone's and the depth decoder's ``vocab_size``)."""
    text_vocab_size: int
    audio_token_id: int
    audio_eos_token_id: int
    codebook_eos_token_id: int
    codebook_pad_token_id: int
    bos_token_id: Optional[int]
    codec: dict = field(default_factory=dict)
    """The Mimi codec's config (``MimiConfig.to_dict()``)."""


def config_from_hf(hf: dict) -> CsmConfig:
    depth = dict(hf.get("depth_decoder_config") or {})
    if not depth:
        raise ValueError(f"{ARCHITECTURE}: config.json has no depth_decoder_config")
    n = int(hf.get("num_codebooks") or 32)
    if int(depth.get("num_codebooks") or n) != n:
        raise ValueError(f"{ARCHITECTURE}: the depth decoder has {depth.get('num_codebooks')} codebooks, the "
                         f"backbone {n}")
    vocab = int(hf["vocab_size"])
    for who, d in (("backbone", hf), ("depth decoder", depth)):
        if d.get("tie_word_embeddings") and who == "depth decoder":
            raise ValueError(f"{ARCHITECTURE}: tied depth decoder embeddings are not supported")
    return CsmConfig(
        backbone=DecoderConfig(**{**hf_common(hf, ARCHITECTURE), "tie_word_embeddings": False}),
        depth=DecoderConfig(**{**hf_common(depth, ARCHITECTURE + ".depth_decoder"), "tie_word_embeddings": False}),
        num_codebooks=n, codebook_vocab=vocab, text_vocab_size=int(hf["text_vocab_size"]),
        audio_token_id=int(hf["audio_token_id"]), audio_eos_token_id=int(hf["audio_eos_token_id"]),
        codebook_eos_token_id=int(hf.get("codebook_eos_token_id") or 0),
        codebook_pad_token_id=int(hf.get("codebook_pad_token_id") if hf.get("codebook_pad_token_id") is not None
                                  else vocab - 1),
        bos_token_id=hf.get("bos_token_id"), codec=dict(hf.get("codec_config") or {}))


@dataclass(frozen=True)
class Sampling:
    """One model's token choice: greedy, or temperature / top-k / top-p sampling (transformers' order)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0

    @classmethod
    def from_dict(cls, d: dict, prefix: str = "") -> "Sampling":
        def get(k: str, default: Any) -> Any:
            v = d.get(prefix + k)
            return default if v is None else v

        return cls(do_sample=bool(get("do_sample", False)), temperature=float(get("temperature", 1.0)),
                   top_k=int(get("top_k", 50)), top_p=float(get("top_p", 1.0)))


@dataclass(frozen=True)
class GenerationSettings:
    backbone: Sampling
    depth: Sampling
    max_new_frames: int


def generation_settings(model_path: str) -> GenerationSettings:
    """The checkpoint's ``generation_config.json``: greedy where it says nothing; at most ``max_new_tokens``
    frames per request (1024, about 80 s of audio, when it is not given)."""
    d: dict = {}
    p = os.path.join(model_path, "generation_config.json")
    if model_path and os.path.isfile(p):
        with open(p) as f:
            d = json.load(f)
    return GenerationSettings(backbone=Sampling.from_dict(d), depth=Sampling.from_dict(d, "depth_decoder_"),
                              max_new_frames=int(d.get("max_new_tokens") or 1024))
