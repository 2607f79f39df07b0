"""The one place CSM meets its audio codec (Mimi): loading it from the checkpoint's ``codec_model.`` tensors.

The codec is ``max.pipelines.architectures.mimi.MimiCodec`` (``from_state_dict(config, tensors, prefix)``,
``sample_rate``, ``frame_rate``, ``num_codebooks``, ``encode(waveform) -> codes [num_codebooks, frames]``,
``decode(codes) -> samples``, streaming ``new_decode_state()`` / ``decode_chunk(codes, state)``).
``CODEC_CLASS`` replaces it (a class with the same interface), e.g. in tests."""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["CODEC_CLASS", "load_codec"]

CODEC_CLASS: Any = None
"""None: the native ``MimiCodec``; else a class with its interface."""

PREFIX = "codec_model."


def load_codec(config: dict, tensors: Mapping[str, Any]) -> Any:
    cls = CODEC_CLASS
    if cls is None:
        try:
            from max.pipelines.architectures.mimi import MimiCodec  # type: ignore[import-not-found]
        except ImportError as e:
            raise NotImplementedError(
                "CsmForConditionalGeneration needs the Mimi codec (max.pipelines.architectures.mimi), which is not "
                f"available in this build: {e}") from None
        cls = MimiCodec
    codec = cls.from_state_dict(config, tensors, PREFIX)
    for need in ("sample_rate", "num_codebooks", "encode", "decode", "new_decode_state", "decode_chunk"):
        if not hasattr(codec, need):
            raise TypeError(f"the CSM audio codec {type(codec).__name__} has no {need!r}")
    return codec
