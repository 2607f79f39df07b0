"""Gemma 4 multimodal configuration (``Gemma4ForConditionalGeneration``): the text decoder's config is
the gemma4 family's translation of ``text_config``, named after the multimodal architecture."""

from __future__ import annotations

from max.pipelines.architectures.common import DecoderConfig
from max.pipelines.architectures.gemma4.config import config_from_hf as gemma4_text_config

ARCHITECTURE = "Gemma4ForConditionalGeneration"

REFUSAL = "this libremax build runs Gemma 4's text; images/audio are not supported yet"
"""The start of the error for a request with an image, video or audio input."""


def text_config(hf: dict) -> dict:
    """``text_config`` as the text family reads it.  ``use_bidirectional_attention="vision"`` (the 26B/31B
    checkpoints) makes only image tokens attend both ways; with images refused every prompt is text, for
    which it is plain causal attention, so it is dropped here ("all" is kept and stays unsupported)."""
    text = hf.get("text_config")
    if not isinstance(text, dict):
        raise ValueError(f"{ARCHITECTURE}: the config has no text_config")
    text = dict(text)
    if text.get("use_bidirectional_attention") == "vision":
        text["use_bidirectional_attention"] = None
    return text


def config_from_hf(hf: dict) -> DecoderConfig:
    cfg = gemma4_text_config(text_config(hf))
    cfg.architecture = ARCHITECTURE
    return cfg
