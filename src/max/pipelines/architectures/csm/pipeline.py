"""``CsmPipeline`` (a ``max.interfaces.AudioGenerator``): text to speech with Sesame CSM.

Requests are :class:`~max.pipelines.core.TTSContext` s whose ``tokens`` are the rendered chat-template
prompt (speaker turns ``[speaker]text``; a turn with reference audio adds one ``<|AUDIO|>`` position per
codec frame and ``<|audio_eos|>``) and whose ``audio_prompt_tokens`` are those reference frames' codes
(frame-major, ``num_codebooks`` per frame).  Each backbone step runs every live request together on the
paged KV cache (new prompts and single new frames in one ragged batch: continuous batching); the depth
decoder then completes each request's frame codebook by codebook (all requests together).  A frame's codes
are appended to the context's speech tokens (one block per frame) and its codebook-0 code to its tokens.
A frame whose codes (but the last) all equal ``codebook_eos_token_id`` ends the request (it is not audio).

:meth:`next_chunk` generates until every live request has a chunk of new frames (``chunk_frames``: small first
chunks start playback sooner) or has ended, then decodes each request's new frames with the codec's streaming
decoder: the chunks' audio concatenated equals the codec's decoding of all frames.

Voices: a speaker id (CSM's ``[N]`` prefix) and optional context turns (earlier utterances with their audio,
which the model continues in that voice).
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch

from max.interfaces import AudioGenerationMetadata, AudioGeneratorOutput, GenerationStatus, SamplingParams
from max.interfaces.errors import InvalidRequest
from max.pipelines.architectures.csm.config import ARCHITECTURE
from max.pipelines.architectures.csm.sampling import choose, sampling_of
from max.pipelines.core import TTSContext

__all__ = ["CsmPipeline", "Turn"]

DEFAULT_CHAT_TEMPLATE = (
    "{% for m in messages %}{% for c in m['content'] %}{% if c['type'] == 'text' %}"
    "{{ bos_token + '[' + m['role'] + ']' + c['text'] + eos_token }}{% elif c['type'] == 'audio' %}"
    "{{ '<|AUDIO|><|audio_eos|>' }}{% endif %}{% endfor %}{% endfor %}")
"""Used when the checkpoint has no chat template: each turn ``<bos>[speaker]text<eos>``, then its audio."""

_ids = itertools.count()

OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse")
"""OpenAI's voice names, taken as CSM speaker ids 0, 1, ... in this order (so clients that only know those
names can pick a speaker)."""
MAX_SPEAKER = 31


@dataclass
class Turn:
    """One utterance of the conversation: who spoke (speaker id), what, and (context turns) the audio of it
    (mono float32 at the codec's sample rate) or its codec codes ``[num_codebooks, frames]``."""

    speaker: int
    text: str
    audio: Optional[np.ndarray] = None
    codes: Optional[np.ndarray] = None


def _chat_template(folder: str, tokenizer: Any) -> str:
    import json
    import os

    p = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(p):
        with open(p) as f:
            return f.read()
    p = os.path.join(folder, "chat_template.json")
    if os.path.isfile(p):
        with open(p) as f:
            return json.load(f)["chat_template"]
    return getattr(tokenizer, "chat_template", None) or DEFAULT_CHAT_TEMPLATE


class CsmPipeline:
    """Generates speech for batches of :class:`TTSContext` with one
    :class:`~max.pipelines.architectures.csm.pipeline_model.CsmPipelineModel`."""

    def __init__(self, pipeline_config: Any, pipeline_model: Any = None, eos_token_id: Any = None,
                 weight_adapters: Any = None, tokenizer: Any = None, chunk_frames: Sequence[int] = (5, 25)) -> None:
        from max.pipelines.architectures.csm.pipeline_model import CsmPipelineModel
        from max.pipelines.lib.pipeline import build_pipeline_model

        t0 = time.perf_counter()
        self.pipeline_config = pipeline_config
        self.devices, self.model = build_pipeline_model(pipeline_config, CsmPipelineModel, weight_adapters, None)
        folder = str(pipeline_config.model_config.model_path)
        from transformers import AutoTokenizer

        self.hf_tokenizer = AutoTokenizer.from_pretrained(folder)
        self.tokenizer = tokenizer
        self.chat_template = _chat_template(folder, self.hf_tokenizer)
        self.config = self.model.config
        self.settings = self.model.settings
        self.codec = self.model.codec
        self.sample_rate = int(self.codec.sample_rate)
        if not chunk_frames or any(int(n) < 1 for n in chunk_frames):
            raise ValueError(f"chunk_frames must be positive, got {list(chunk_frames)}")
        self.chunk_frames = [int(n) for n in chunk_frames]
        self._generators: dict[str, torch.Generator] = {}
        self._decode_states: dict[str, Any] = {}
        self._chunks: dict[str, int] = {}
        self._lock = threading.Lock()
        self.load_seconds = time.perf_counter() - t0

    # ------------------------------------------------------------------ requests
    @property
    def max_new_frames(self) -> int:
        return self.settings.max_new_frames

    @staticmethod
    def voices() -> list[str]:
        """The ``voice`` values :meth:`speaker_for_voice` accepts."""
        return [f"0..{MAX_SPEAKER} (speaker ids)", *OPENAI_VOICES]

    @staticmethod
    def speaker_for_voice(voice: str) -> int:
        """The speaker id of an API ``voice``: a speaker id (``"0"``, ``"1"`` ...) or an OpenAI voice name."""
        v = str(voice).strip().lower()
        if v.isdigit() and int(v) <= MAX_SPEAKER:
            return int(v)
        if v in OPENAI_VOICES:
            return OPENAI_VOICES.index(v)
        raise InvalidRequest(f"unknown voice {voice!r}: use a speaker id 0..{MAX_SPEAKER} or one of "
                             f"{', '.join(OPENAI_VOICES)}", param="voice")

    def default_sampling(self, seed: Optional[int] = None) -> SamplingParams:
        """The checkpoint's own backbone sampling as ``SamplingParams`` (``temperature`` 0: greedy)."""
        s = self.settings.backbone
        kw: dict[str, Any] = dict(temperature=s.temperature if s.do_sample else 0.0, top_k=s.top_k if s.do_sample
                                  else 1, top_p=s.top_p)
        if seed is not None:
            kw["seed"] = int(seed)
        return SamplingParams(**kw)

    def prompt(self, text: str, speaker: int = 0, context: Sequence[Turn] = ()) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens, audio_prompt_tokens)`` of ``text`` said by ``speaker`` after the ``context`` turns."""
        if not isinstance(text, str) or not text.strip():
            raise InvalidRequest("the text to speak is empty", param="input")
        if isinstance(speaker, bool) or not isinstance(speaker, (int, np.integer)) or speaker < 0:
            raise InvalidRequest(f"the speaker must be a non-negative integer, got {speaker!r}", param="voice")
        N = self.config.num_codebooks
        frames = []
        messages = []
        for t in context:
            codes = t.codes
            if codes is None and t.audio is not None:
                audio = np.asarray(t.audio, np.float32).reshape(-1)
                if audio.size == 0:
                    raise InvalidRequest("a context turn's audio is empty", param="voice")
                codes = self.codec.encode(audio)
            content = [{"type": "text", "text": t.text}]
            if codes is not None:
                codes = np.asarray(codes, np.int64)
                if codes.ndim != 2 or codes.shape[0] < N or codes.shape[1] == 0:
                    raise InvalidRequest(f"a context turn's codes must be [>= {N}, frames], got {list(codes.shape)}",
                                         param="voice")
                if codes.min() < 0 or codes.max() >= self.config.codebook_vocab:
                    raise InvalidRequest("a context turn's codes are outside the codebooks", param="voice")
                frames.append(codes[:N].T)
                content.append({"type": "audio"})
            messages.append({"role": str(int(t.speaker)), "content": content})
        messages.append({"role": str(int(speaker)), "content": [{"type": "text", "text": text}]})
        rendered = self.hf_tokenizer.apply_chat_template(messages, chat_template=self.chat_template, tokenize=False)
        audio_tok = self.hf_tokenizer.convert_ids_to_tokens(self.config.audio_token_id)
        parts = rendered.split(audio_tok)
        if len(parts) - 1 != len(frames):
            raise ValueError(f"{ARCHITECTURE}: the chat template placed {len(parts) - 1} audio segments for "
                             f"{len(frames)} context audios")
        # one <|AUDIO|> per frame of each context audio, as the processor expands them
        rendered = parts[0] + "".join(audio_tok * len(f) + p for f, p in zip(frames, parts[1:]))
        tokens = np.asarray(self.hf_tokenizer(rendered, add_special_tokens=False)["input_ids"], np.int64)
        prompt_frames = np.concatenate(frames).reshape(-1) if frames else np.zeros(0, np.int64)
        return tokens, prompt_frames

    def new_context(self, text: str, speaker: int = 0, context: Sequence[Turn] = (),
                    sampling_params: Optional[SamplingParams] = None, max_new_frames: Optional[int] = None,
                    request_id: Optional[str] = None, streaming: bool = True) -> TTSContext:
        """A request's context (validated: clear :class:`InvalidRequest` s naming the field)."""
        tokens, prompt_frames = self.prompt(text, speaker, context)
        limit = self.model.max_seq_len
        if tokens.size >= limit:
            raise InvalidRequest(f"the input takes {tokens.size} positions; the model has {limit}", param="input")
        n = self.max_new_frames if max_new_frames is None else int(max_new_frames)
        if n < 1:
            raise InvalidRequest(f"max_new_frames must be >= 1, got {n}", param="max_new_frames")
        params = sampling_params if sampling_params is not None else self.default_sampling()
        return TTSContext(request_id=request_id or f"csm-{next(_ids)}", max_length=min(limit, tokens.size + n),
                          tokens=tokens, audio_prompt_tokens=prompt_frames, sampling_params=params,
                          streaming=streaming, model_name=self.pipeline_config.model_config.model_path or "")

    def context_from_request(self, request: Any, speaker: int = 0) -> TTSContext:
        """A context for an ``AudioGenerationRequest``: ``input`` said by ``speaker``; its
        ``audio_prompt_tokens`` (frame-major codes) with ``audio_prompt_transcription`` are an earlier turn of
        the same speaker (the voice to continue)."""
        context: list[Turn] = []
        if len(request.audio_prompt_tokens):
            N = self.config.num_codebooks
            a = np.asarray(request.audio_prompt_tokens, np.int64).reshape(-1)
            if a.size % N:
                raise InvalidRequest(f"audio_prompt_tokens must hold whole frames of {N} codes",
                                     param="audio_prompt_tokens")
            context.append(Turn(speaker, request.audio_prompt_transcription or "", codes=a.reshape(-1, N).T))
        text = request.input if request.input is not None else request.prompt
        return self.new_context(str(text or ""), speaker, context, request.sampling_params,
                                request.sampling_params.max_new_tokens, request_id=str(request.request_id),
                                streaming=request.streaming)

    # ------------------------------------------------------------------ generation
    def _rows(self, c: TTSContext) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The backbone inputs of positions ``start_idx`` .. ``active_idx`` of ``c``."""
        cfg = self.config
        N = cfg.num_codebooks
        start, end, plen = c.start_idx, c.active_idx, c.prompt_len
        toks = np.asarray(c.tokens[start:end], np.int64)
        codes = np.zeros((end - start, N), np.int64)
        audio = np.zeros(end - start, np.float32)
        pos = np.arange(start, end)
        prompt = pos < plen
        is_frame = prompt & (toks == cfg.audio_token_id)
        if is_frame.any():
            frames = c.audio_prompt_tokens.reshape(-1, N)
            before = int(np.count_nonzero(c.tokens[:start] == cfg.audio_token_id))
            idx = before + np.cumsum(is_frame) - 1
            codes[is_frame] = frames[idx[is_frame]]
        is_eos = prompt & (toks == cfg.audio_eos_token_id)
        codes[is_eos] = cfg.codebook_eos_token_id
        gen = ~prompt
        if gen.any():
            frames = c.speech_tokens.reshape(-1, N)
            codes[gen] = frames[pos[gen] - plen]
        audio[is_frame | is_eos | gen] = 1.0
        toks = np.where(audio > 0, 0, toks)
        return toks, codes, audio

    def _generator(self, c: TTSContext) -> torch.Generator:
        g = self._generators.get(c.request_id)
        if g is None:
            g = torch.Generator().manual_seed(int(c.sampling_params.seed))
            self._generators[c.request_id] = g
        return g

    def _step(self, ctxs: list[TTSContext]) -> None:
        """One frame for each of ``ctxs``."""
        cfg, model = self.config, self.model
        mgr = model.kv_manager
        for c in ctxs:
            if not mgr.contains(c.request_id):
                mgr.external_claim(c.request_id)
        hidden, logits = model.backbone_step(ctxs, [self._rows(c) for c in ctxs])
        back = [sampling_of(c.sampling_params, self.settings.backbone) for c in ctxs]
        depth = [self.settings.depth if b.do_sample else b for b in back]
        gens = [self._generator(c) for c in ctxs]
        c0 = np.array([choose(logits[i], back[i], gens[i]) for i in range(len(ctxs))], np.int64)
        codes = model.depth_frame(hidden, c0, lambda k, lg: np.array(
            [choose(lg[i], depth[i], gens[i]) for i in range(len(ctxs))], np.int64))
        for c, frame in zip(ctxs, codes):
            if (frame[:-1] == cfg.codebook_eos_token_id).all():
                c.status = GenerationStatus.END_OF_SEQUENCE
            else:
                c.update_speech_tokens(frame)
                c.update(int(frame[0]))
        mgr.step(ctxs)
        for c in ctxs:
            if c.status.is_done:
                self._free_cache(c.request_id)

    def _free_cache(self, request_id: str) -> None:
        mgr = self.model.kv_manager
        if mgr.contains(request_id):
            mgr.release(request_id)

    def frames(self, c: TTSContext) -> np.ndarray:
        """The frames generated so far for ``c``: int64 ``[frames, num_codebooks]``."""
        return c.speech_tokens.reshape(-1, self.config.num_codebooks)

    def next_chunk(self, batch: dict[str, TTSContext]) -> dict[str, AudioGeneratorOutput]:
        """The next audio chunk of every request of ``batch`` (see the module docstring)."""
        with self._lock:
            return self._next_chunk(batch)

    def _next_chunk(self, batch: dict[str, TTSContext]) -> dict[str, AudioGeneratorOutput]:
        t0 = time.perf_counter()
        N = self.config.num_codebooks
        want = {rid: self.chunk_frames[min(self._chunks.get(rid, 0), len(self.chunk_frames) - 1)]
                for rid in batch}
        steps = 0
        while True:
            short = [c for rid, c in batch.items() if not c.status.is_done
                     and (c.speech_tokens.size - c.decoded_index) // N < want[rid]]
            if not short:
                break
            self._step(short)
            steps += 1
        outs = {}
        for rid, c in batch.items():
            new, _ = c.next_speech_tokens()
            audio = np.zeros(0, np.float32)
            if new.size:
                state = self._decode_states.setdefault(rid, self.codec.new_decode_state())
                audio = np.asarray(self.codec.decode_chunk(new.reshape(-1, N).T, state), np.float32).reshape(-1)
                c.decoded_index += new.size
            final = c.status.is_done
            if final:
                c.audio_generation_status = c.status
            chunk_id = self._chunks.get(rid, 0)
            self._chunks[rid] = chunk_id + 1
            outs[rid] = AudioGeneratorOutput(
                final_status=c.status if final else GenerationStatus.ACTIVE, steps_executed=steps, audio_data=audio,
                metadata=AudioGenerationMetadata(
                    sample_rate=self.sample_rate, duration=audio.size / float(self.sample_rate), chunk_id=chunk_id,
                    final_chunk=final, model_name=str(c.model_name) or None, request_id=rid,
                    tokens_generated=int(c.speech_tokens.size // N), processing_time=time.perf_counter() - t0))
            if final:
                self.release(rid)
        return outs

    def release(self, request_id: str) -> None:
        """Free ``request_id``'s KV pages, generator and decoder state (idempotent)."""
        self._free_cache(request_id)
        for d in (self._generators, self._decode_states, self._chunks):
            d.pop(request_id, None)

    def generate(self, contexts: Sequence[TTSContext]) -> list[np.ndarray]:
        """Every context's whole audio (float32 samples), generated together."""
        batch = {c.request_id: c for c in contexts}
        audio: dict[str, list[np.ndarray]] = {rid: [] for rid in batch}
        try:
            while batch:
                for rid, out in self.next_chunk(batch).items():
                    audio[rid].append(out.audio_data)
                    if out.is_done:
                        del batch[rid]
        finally:
            for rid in list(batch):
                self.release(rid)
        return [np.concatenate(audio[c.request_id]) if audio[c.request_id] else np.zeros(0, np.float32)
                for c in contexts]
