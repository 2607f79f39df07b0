"""Audio files -> mono float32 samples at the rate a model wants: decoded by libsndfile (``soundfile``: WAV,
FLAC, OGG/Vorbis, Opus, MP3 ...), channels averaged, resampled with libsoxr (``soxr``).  Every failure is an
:class:`AudioError` (a ``ValueError``) whose message says what is wrong with the audio, for a 400 at the server
and a one-line error at the command line."""

from __future__ import annotations

import io
from typing import Optional, Union

import numpy as np

__all__ = ["AudioError", "decode_audio"]


class AudioError(ValueError):
    """The audio could not be used: empty, unreadable, unsupported, silent of samples, or too long."""


def decode_audio(data: Union[bytes, str], sampling_rate: int = 16000, max_seconds: Optional[float] = None,
                 filename: Optional[str] = None) -> np.ndarray:
    """Mono float32 samples of the audio file ``data`` (its bytes, or a path) at ``sampling_rate``.

    Raises :class:`AudioError` for an empty file, a file libsndfile cannot read (corrupt or an unsupported
    format), audio without samples, or audio longer than ``max_seconds``."""
    import soundfile

    what = f"'{filename}'" if filename else "the audio file"
    if isinstance(data, (bytes, bytearray)) and len(data) == 0:
        raise AudioError(f"{what} is empty")
    src = io.BytesIO(bytes(data)) if isinstance(data, (bytes, bytearray)) else data
    try:
        info = soundfile.info(src)
        if max_seconds is not None and info.frames / max(info.samplerate, 1) > max_seconds:
            raise AudioError(f"{what} is {info.frames / info.samplerate:.1f} s long; the maximum is "
                             f"{max_seconds:g} s")
        if isinstance(src, io.BytesIO):
            src.seek(0)
        samples, rate = soundfile.read(src, dtype="float32", always_2d=True)
    except AudioError:
        raise
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as e:
        formats = ", ".join(sorted(soundfile.available_formats()))
        why = str(getattr(e, "error_string", "") or "").strip() or type(e).__name__  # libsndfile's own reason
        raise AudioError(f"{what} could not be decoded ({why.rstrip('.')}); supported "
                         f"formats: {formats}") from None
    if samples.size == 0:
        raise AudioError(f"{what} holds no audio samples")
    mono = samples.mean(axis=1, dtype=np.float32)
    if not np.all(np.isfinite(mono)):
        raise AudioError(f"{what} holds NaN or infinite samples")
    if rate != sampling_rate:
        import soxr

        mono = soxr.resample(mono, rate, sampling_rate).astype(np.float32, copy=False)
    return np.ascontiguousarray(mono)
