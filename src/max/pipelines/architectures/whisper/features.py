"""Whisper's audio front end: 16 kHz mono samples -> log-mel spectrogram ``[n_mels, frames]`` (float32),
the same numbers as transformers' ``WhisperFeatureExtractor``: a 400-point Hann STFT every 160 samples
(centred, reflect-padded), power spectrum without the last frame, Slaney-normalised mel filters over
0-8 kHz, ``log10`` clamped at 1e-10, floored at 8 below the maximum, then ``(x + 4) / 4``.

Audio shorter than one window is zero-padded to 30 s (480000 samples, 3000 frames); longer audio keeps its
length and is cut into 3000-frame windows by the decoder loop.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from max.pipelines.architectures.whisper.config import HOP_LENGTH, N_FFT, N_SAMPLES, SAMPLING_RATE

__all__ = ["log_mel_spectrogram", "mel_filters"]


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz (3 mels / 200 Hz), logarithmic above."""
    f = np.asarray(f, np.float64)
    lin = 3.0 * f / 200.0
    log = 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) * (27.0 / np.log(6.4))
    return np.where(f >= 1000.0, log, lin)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, np.float64)
    lin = 200.0 * m / 3.0
    log = 1000.0 * np.exp(np.log(6.4) * (m - 15.0) / 27.0)
    return np.where(m >= 15.0, log, lin)


@functools.lru_cache(maxsize=4)
def mel_filters(n_mels: int, n_fft: int = N_FFT, sampling_rate: int = SAMPLING_RATE) -> np.ndarray:
    """Triangular mel filters ``[n_fft // 2 + 1, n_mels]`` (float64), area-normalised (Slaney)."""
    fft_freqs = np.linspace(0, sampling_rate // 2, n_fft // 2 + 1)
    mels = np.linspace(_hz_to_mel(0.0), _hz_to_mel(8000.0), n_mels + 2)
    edges = _mel_to_hz(mels)
    width = np.diff(edges)
    slopes = edges[None, :] - fft_freqs[:, None]
    down = -slopes[:, :-2] / width[:-1]
    up = slopes[:, 2:] / width[1:]
    fb = np.maximum(0.0, np.minimum(down, up))
    return fb * (2.0 / (edges[2:n_mels + 2] - edges[:n_mels]))[None, :]


def log_mel_spectrogram(audio: np.ndarray, n_mels: int = 80, pad_to_window: bool = True) -> np.ndarray:
    """``[n_mels, frames]`` float32 log-mel features of mono 16 kHz ``audio``.

    ``pad_to_window``: pad (or cut) to exactly one 30 s window, as the feature extractor does by default;
    False keeps longer audio whole (at least one window), for long-form transcription.
    """
    a = np.asarray(audio, np.float32).reshape(-1)
    n = N_SAMPLES if pad_to_window else max(N_SAMPLES, a.size)
    buf = np.zeros(n, np.float32)
    buf[:min(a.size, n)] = a[:n]
    wav = torch.from_numpy(buf)
    spec = torch.stft(wav, N_FFT, HOP_LENGTH, window=torch.hann_window(N_FFT), return_complex=True)
    power = spec[..., :-1].abs() ** 2
    mel = torch.from_numpy(mel_filters(n_mels).T.astype(np.float32)) @ power
    log = torch.clamp(mel, min=1e-10).log10()
    log = torch.maximum(log, log.max() - 8.0)
    return ((log + 4.0) / 4.0).numpy()
