"""Speech audio as response bytes for ``/v1/audio/speech``: ``pcm`` (raw 16-bit signed little-endian mono, as
OpenAI sends it) and ``wav`` (a 16-bit PCM header, then the same samples) stream chunk by chunk as the audio is
generated; ``flac`` and ``mp3`` (encoded by libsndfile through ``soundfile``) are written once the audio is
complete.  A streamed ``wav``'s header cannot know the length: its RIFF and data sizes are 0xFFFFFFFF (readers
take the data to the end of the stream); a ``wav`` returned whole (``whole=True``) carries the real sizes.
``speed`` resamples (soxr, streaming): ``2.0`` plays twice as fast (and higher)."""

from __future__ import annotations

import io
import struct
from typing import Optional

import numpy as np

__all__ = ["FORMATS", "MEDIA_TYPES", "SpeechEncoder", "streams"]

FORMATS = ("mp3", "wav", "pcm", "flac")
UNSUPPORTED = ("opus", "aac")
MEDIA_TYPES = {"mp3": "audio/mpeg", "wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac"}


def streams(fmt: str) -> bool:
    """Whether ``fmt``'s bytes are sent as the audio is generated (else once it is complete)."""
    return fmt in ("pcm", "wav")


def _pcm16(x: np.ndarray) -> bytes:
    return (np.clip(np.asarray(x, np.float32), -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def _wav_header(sample_rate: int, data_bytes: Optional[int] = None) -> bytes:
    """The 44-byte header of a 16-bit mono PCM WAV holding ``data_bytes`` of samples; None: the length is unknown
    (streaming): both sizes 0xFFFFFFFF."""
    riff = data = 0xFFFFFFFF
    if data_bytes is not None:
        riff, data = 36 + data_bytes, data_bytes
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVE" + b"fmt " +
            struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16) + b"data" +
            struct.pack("<I", data))


class SpeechEncoder:
    """Feeds float32 chunks at ``sample_rate`` in, bytes of ``fmt`` out (:meth:`add` per chunk, :meth:`finish`
    once).  ``whole``: the bytes are sent in one piece once complete (every format then comes from
    :meth:`finish`; a ``wav`` with its real sizes)."""

    def __init__(self, fmt: str, sample_rate: int, speed: float = 1.0, whole: bool = False) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unsupported audio format {fmt!r}")
        self.fmt = fmt
        self.whole = whole
        self.sample_rate = int(sample_rate)
        self._resampler: Optional[object] = None
        if speed != 1.0:
            import soxr

            self._resampler = soxr.ResampleStream(self.sample_rate * float(speed), self.sample_rate, 1,
                                                  dtype="float32")
        self._held: list[np.ndarray] = []
        self._started = False
        self.samples = 0

    def _speed(self, x: np.ndarray, last: bool) -> np.ndarray:
        if self._resampler is None:
            return x
        out = self._resampler.resample_chunk(x, last=last)  # type: ignore[attr-defined]
        return np.asarray(out, np.float32).reshape(-1)

    def _out(self, x: np.ndarray) -> bytes:
        self.samples += x.size
        if self.whole or not streams(self.fmt):
            self._held.append(x)
            return b""
        head = b""
        if not self._started and self.fmt == "wav":
            head = _wav_header(self.sample_rate)
        self._started = True
        return head + _pcm16(x)

    def add(self, audio: np.ndarray) -> bytes:
        return self._out(self._speed(np.asarray(audio, np.float32).reshape(-1), last=False))

    def finish(self) -> bytes:
        tail = self._out(self._speed(np.zeros(0, np.float32), last=True))
        audio = np.concatenate(self._held) if self._held else np.zeros(0, np.float32)
        if self.whole and streams(self.fmt):  # the streamed form's bytes in one piece; a wav with its sizes
            pcm = _pcm16(audio)
            return (_wav_header(self.sample_rate, len(pcm)) if self.fmt == "wav" else b"") + pcm
        if streams(self.fmt):
            if not self._started and self.fmt == "wav":
                return _wav_header(self.sample_rate)
            return tail
        import soundfile as sf

        buf = io.BytesIO()
        sf.write(buf, np.clip(audio, -1.0, 1.0), self.sample_rate, format=self.fmt.upper())
        return buf.getvalue()
