"""Whisper (``WhisperForConditionalGeneration``): speech recognition and translation to English — log-mel
front end, audio encoder once per 30 s window, text decoder on the paged KV cache with cross-attention over
the encoder states, language/task tokens, timestamps, long audio window by window."""

from max.pipelines.architectures.whisper.arch import whisper_arch

ARCHITECTURES = [whisper_arch]
