"""``AudioGeneratorPipeline`` (``PipelineTask.AUDIO_GENERATION``, a ``max.interfaces.AudioGenerator``): a
speech-token model (:class:`SpeechTokenGenerationPipeline`) plus an audio decoder (speech tokens -> samples),
streamed: each :meth:`next_chunk` generates up to the next chunk of speech tokens for every request, then
decodes each request's unseen tokens (with ``buffer`` already-decoded tokens before them as left context, whose
samples are dropped) into one :class:`~max.interfaces.AudioGeneratorOutput` with its metadata (sample rate,
duration, chunk id, final chunk).

The audio decoder is an object with ``sample_rate``, ``samples_per_token`` and ``decode(tokens) -> float32
samples`` (``len(tokens) * samples_per_token`` of them).  ``AudioGenerationConfig.audio_decoder`` names one
registered in :data:`AUDIO_DECODERS` (``name -> factory(pipeline_config, audio_config)``), or one is passed in.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

import numpy as np

from max.interfaces import AudioGenerationMetadata, AudioGeneratorOutput, GenerationStatus
from max.pipelines.lib.speech_token_pipeline import SpeechTokenGenerationPipeline

__all__ = ["AUDIO_DECODERS", "AudioGeneratorPipeline"]

AUDIO_DECODERS: dict[str, Callable[[Any, Any], Any]] = {}
"""Registered audio decoders (codecs) by name; an architecture adds its own."""

DEFAULT_CHUNK = 64


class AudioGeneratorPipeline:
    def __init__(self, pipeline_config: Any, pipeline_model: Any, eos_token_id: Any, weight_adapters: Any,
                 tokenizer: Any, audio_decoder: Any = None, audio_config: Any = None) -> None:
        audio_config = audio_config if audio_config is not None else (
            pipeline_config if hasattr(pipeline_config, "audio_decoder") else None)
        self.audio_config = audio_config
        if audio_decoder is None:
            name = getattr(audio_config, "audio_decoder", "") or ""
            if name not in AUDIO_DECODERS:
                raise NotImplementedError(
                    f"audio decoder {name!r} is not available (registered: {sorted(AUDIO_DECODERS) or 'none'}); "
                    "give AudioGenerationConfig.audio_decoder a registered name")
            audio_decoder = AUDIO_DECODERS[name](pipeline_config, audio_config)
        for need in ("sample_rate", "samples_per_token", "decode"):
            if not hasattr(audio_decoder, need):
                raise TypeError(f"AudioGeneratorPipeline: the audio decoder has no {need!r}")
        self.audio_decoder = audio_decoder
        lm_config = getattr(audio_config, "pipeline_config", None) or pipeline_config
        self.speech_lm = SpeechTokenGenerationPipeline(lm_config, pipeline_model, eos_token_id, weight_adapters,
                                                       tokenizer)
        sizes = list(getattr(audio_config, "chunk_size", None) or [DEFAULT_CHUNK])
        if any(int(s) < 1 for s in sizes):
            raise ValueError(f"chunk_size entries must be >= 1, got {sizes}")
        self.chunk_sizes = [int(s) for s in sizes]
        self.buffer = int(getattr(audio_config, "buffer", 0) or 0)

    @property
    def tokenizer(self) -> Any:
        return self.speech_lm.tokenizer

    @property
    def kv_managers(self) -> list[Any]:
        return self.speech_lm.kv_managers

    def chunk_size_for(self, ctx: Any) -> int:
        """Speech tokens per chunk for ``ctx``'s next chunk: ``chunk_size[i]`` for its ``i``-th chunk, the last
        entry from then on (small first chunks start playback sooner)."""
        return self.chunk_sizes[min(getattr(ctx, "_chunk_count", 0), len(self.chunk_sizes) - 1)]

    def next_chunk(self, batch: dict[str, Any]) -> dict[str, AudioGeneratorOutput]:
        t0 = time.perf_counter()
        want = {rid: self.chunk_size_for(c) for rid, c in batch.items()}
        live = {rid: c for rid, c in batch.items() if not c.status.is_done}
        steps = 0
        while live:  # generate until every live request has a whole chunk of unseen tokens or ends
            short = {rid: c for rid, c in live.items()
                     if c.speech_tokens.size - c.decoded_index < want[rid] and not c.status.is_done}
            if not short:
                break
            n = min(want[rid] - (c.speech_tokens.size - c.decoded_index) for rid, c in short.items())
            self.speech_lm.next_speech_tokens(short, max(1, n))
            steps += max(1, n)
            live = short
        outs = {}
        dec = self.audio_decoder
        for rid, c in batch.items():
            lm_done = c.status.is_done
            toks, n_buf = c.next_speech_tokens(want[rid] if not lm_done else None, self.buffer)
            new = toks.size - n_buf
            audio = np.zeros(0, np.float32)
            if new > 0:
                samples = np.asarray(dec.decode(toks), np.float32).reshape(-1)
                audio = samples[n_buf * int(dec.samples_per_token):]
                c.decoded_index += new
            final = lm_done and c.decoded_index >= c.speech_tokens.size
            if final:
                c.audio_generation_status = c.status
            chunk_id = getattr(c, "_chunk_count", 0)
            c._chunk_count = chunk_id + 1
            status = c.audio_generation_status if final else GenerationStatus.ACTIVE
            outs[rid] = AudioGeneratorOutput(
                final_status=status, steps_executed=steps, audio_data=audio,
                buffer_speech_tokens=toks[:n_buf] if n_buf else None,
                metadata=AudioGenerationMetadata(
                    sample_rate=int(dec.sample_rate), duration=audio.size / float(dec.sample_rate),
                    chunk_id=chunk_id, final_chunk=final, model_name=getattr(c, "model_name", None) or None,
                    request_id=rid, tokens_generated=int(c.speech_tokens.size),
                    processing_time=time.perf_counter() - t0))
        return outs

    def release(self, request_id: str) -> None:
        self.speech_lm.release(request_id)
