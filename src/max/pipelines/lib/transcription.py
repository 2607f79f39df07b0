"""The speech-recognition task's records, shared by the server, the CLI and the families that transcribe
(Whisper): :class:`TranscriptionRequest` (one audio and its options) and :data:`LANGUAGE_CODES` (English
language names -> ISO-639-1 codes).  A family's transcription pipeline (``transcribe(requests)``) is built
by :meth:`~max.pipelines.lib.registry.PipelineRegistry.retrieve_transcriber`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np

__all__ = ["LANGUAGE_CODES", "TranscriptionRequest", "language_name"]

LANGUAGE_CODES = {  # English names users pass (``language="german"``) -> the code
    "english": "en", "chinese": "zh", "german": "de", "spanish": "es", "russian": "ru", "korean": "ko",
    "french": "fr", "japanese": "ja", "portuguese": "pt", "turkish": "tr", "polish": "pl", "catalan": "ca",
    "dutch": "nl", "arabic": "ar", "swedish": "sv", "italian": "it", "indonesian": "id", "hindi": "hi",
    "finnish": "fi", "vietnamese": "vi", "hebrew": "he", "ukrainian": "uk", "greek": "el", "malay": "ms",
    "czech": "cs", "romanian": "ro", "danish": "da", "hungarian": "hu", "tamil": "ta", "norwegian": "no",
    "thai": "th", "urdu": "ur", "croatian": "hr", "bulgarian": "bg", "lithuanian": "lt", "latin": "la",
    "welsh": "cy", "slovak": "sk", "persian": "fa", "latvian": "lv", "bengali": "bn", "serbian": "sr",
    "slovenian": "sl", "estonian": "et", "icelandic": "is", "swahili": "sw", "cantonese": "yue",
}


_NAMES = {code: name for name, code in LANGUAGE_CODES.items()}


def language_name(code: Optional[str]) -> Optional[str]:
    """The English name of a language code (``"de"`` -> ``"german"``); an unknown code as given."""
    return _NAMES.get(code or "", code)


@dataclass
class TranscriptionRequest:
    """One audio to transcribe (mono float samples at 16 kHz) and its options."""

    audio: np.ndarray
    language: Optional[str] = None
    task: Optional[str] = None
    """``transcribe`` or ``translate`` (to English); None: what the checkpoint's generation config says (its
    ``forced_decoder_ids`` when no language is given either: transcribe on the released checkpoints; with a
    language, transcribe), as transformers does."""
    timestamps: bool = False
    temperature: Union[float, Sequence[float]] = 0.0
    """A temperature, or for long audio the temperatures tried in turn on a window whose result fails the
    thresholds below (transformers' temperature fallback; short audio uses the first only, as transformers)."""
    prompt: Optional[str] = None
    max_new_tokens: Optional[int] = None
    seed: Optional[int] = None
    word_timestamps: bool = False
    """Also time each token and word (needs the model's ``alignment_heads``)."""
    compression_ratio_threshold: Optional[float] = None
    """Long audio: a window whose tokens' zlib compression ratio exceeds this is decoded again at the next
    temperature (repetitive output)."""
    logprob_threshold: Optional[float] = None
    """Long audio: a window whose average token log-probability is below this is decoded again at the next
    temperature."""
    no_speech_threshold: Optional[float] = None
    """Long audio, with ``logprob_threshold``: a window whose no-speech probability exceeds this and whose average
    log-probability is below ``logprob_threshold`` is skipped as silence."""

    @property
    def temperatures(self) -> tuple[float, ...]:
        t = self.temperature
        return (float(t),) if isinstance(t, (int, float)) else tuple(float(x) for x in t)
