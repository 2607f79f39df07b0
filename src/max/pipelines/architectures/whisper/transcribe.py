"""``WhisperPipeline``: speech recognition over the compiled Whisper model.

A batch of requests runs in rounds: each round encodes the current 30 s window of every unfinished request
(one encoder call, its keys/values stored in the cross cache for the round), then decodes those windows
together (one decoder step per token for the whole batch, each request's self-attention on its own pages of
the paged KV cache, its cross-attention over its own window's pages).  Short audio is one window; longer
audio advances window by window to the end of the last complete timestamped segment (timestamps are
predicted for long audio even when the caller does not ask for them).  The decoder prompt follows the
checkpoint's generation config as transformers' ``generate`` does (:func:`~.decoding.prompt_tokens`): with
neither a language nor a task given, its ``forced_decoder_ids`` (a detected language, then ``<|transcribe|>``
on the released checkpoints); a language not given and not fixed there is detected from the first window.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np
import torch

from max.interfaces.errors import InvalidRequest
from max.pipelines.architectures.whisper.alignment import Word, alignment_weights, group_words, token_times
from max.pipelines.architectures.whisper.cache_seq import CacheSeq as _Seq  # a request's decoder sequence
from max.pipelines.architectures.whisper.config import N_FRAMES, SAMPLING_RATE, TIME_PRECISION
from max.pipelines.architectures.whisper.decoding import (
    Segment,
    TokenRules,
    _logsumexp,
    needs_language,
    prompt_tokens,
    split_segments,
)
from max.pipelines.architectures.whisper.features import log_mel_spectrogram
from max.pipelines.lib.transcription import TranscriptionRequest

if TYPE_CHECKING:
    from max.pipelines.architectures.whisper.pipeline_model import CrossCache

__all__ = ["Transcription", "TranscriptionRequest", "WhisperPipeline", "compression_ratio"]

_ids = itertools.count()


@dataclass
class Transcription:
    text: str
    language: Optional[str]
    duration: float
    tokens: list[int]
    """Every generated token of every window (timestamps included, end tokens removed), in order."""
    segments: list[Segment] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    """With ``word_timestamps``: each of ``tokens``' start in seconds."""
    words: list[Word] = field(default_factory=list)
    """With ``word_timestamps``: the text's words with their start and end in seconds."""
    fallbacks: int = 0
    """Windows decoded again at a higher temperature (long audio, thresholds failed)."""
    skipped_windows: int = 0
    """Windows skipped as silence (``no_speech_threshold``)."""
    prompt: list[int] = field(default_factory=list)
    """The first window's decoder prompt (the special tokens the transcription was conditioned on)."""


@dataclass
class _Job:
    req: TranscriptionRequest
    features: np.ndarray  # [n_mels, frames]
    frames: int  # frames the windows advance over
    audio_frames: int = 0  # frames holding audio
    language_id: Optional[int] = None  # the given language's token
    detected_id: Optional[int] = None  # the detected language's token (no language given)
    prompt_language: Optional[int] = None  # the language token of the prompt (given, detected or forced)
    prompt: list[int] = field(default_factory=list)  # the first window's decoder prompt
    seek: int = 0
    tokens: list[int] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    generator: Optional[torch.Generator] = None
    times: list[float] = field(default_factory=list)
    temp_idx: int = 0  # which of the request's temperatures the current window decodes at
    fallbacks: int = 0  # windows decoded again at a higher temperature
    skipped: int = 0  # windows skipped as silence

    @property
    def temperature(self) -> float:
        return self.req.temperatures[self.temp_idx]

    @property
    def done(self) -> bool:
        return self.seek >= self.frames


def compression_ratio(tokens: Sequence[int], vocab_size: int) -> float:
    """Bytes of ``tokens`` (each as little-endian ``int(log2(vocab_size) / 8) + 1`` bytes) over their zlib-compressed
    size: high for repetitive output (transformers' measure)."""
    width = int(math.log2(vocab_size) / 8) + 1
    raw = b"".join(int(t).to_bytes(width, "little") for t in tokens)
    return len(raw) / len(zlib.compress(raw))


class WhisperPipeline:
    """Transcribes (or translates to English) batches of audio with one :class:`WhisperPipelineModel`."""

    def __init__(self, pipeline_config: Any, tokenizer: Any = None) -> None:
        from max.pipelines.architectures.whisper.pipeline_model import WhisperPipelineModel
        from max.pipelines.lib.pipeline import build_pipeline_model

        t0 = time.perf_counter()
        self.pipeline_config = pipeline_config
        self.devices, self.model = build_pipeline_model(pipeline_config, WhisperPipelineModel, None, None)
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(pipeline_config.model_config.model_path))
        self.tokenizer = tokenizer
        self.settings = self.model.settings
        self._lock = threading.Lock()
        self._token_rules: Optional[TokenRules] = None
        self.load_seconds = time.perf_counter() - t0

    # ------------------------------------------------------------------ API
    def transcribe(self, requests: Sequence[TranscriptionRequest]) -> list[Transcription]:
        """Each request's transcription (requests decode together, ``max_batch_size`` windows per round; one call
        at a time per pipeline)."""
        jobs = [self._job(r) for r in requests]
        cap = self.model.max_batch
        with self._lock:
            while True:
                todo = [j for j in jobs if not j.done]
                if not todo:
                    break
                for k in range(0, len(todo), cap):  # at most max_batch windows (cache slots) per round
                    self._round(todo[k:k + cap])
        return [self._result(j) for j in jobs]

    def check(self, r: TranscriptionRequest) -> None:
        """ValueError naming what is wrong with ``r`` (empty or non-finite audio, an unknown task or language, a
        temperature outside [0, 2], a prompt too long for the decoder)."""
        a = np.asarray(r.audio, np.float32).reshape(-1)
        if a.size == 0:
            raise InvalidRequest("audio is empty", param="file")
        if not np.all(np.isfinite(a)):
            raise InvalidRequest("audio holds NaN or infinite samples", param="file")
        if r.task is not None and r.task not in ("transcribe", "translate"):
            raise InvalidRequest(f"task must be 'transcribe' or 'translate', got {r.task!r}", param="task")
        if not self.settings.is_multilingual:  # an English-only model: no language or task tokens
            from max.pipelines.lib.transcription import LANGUAGE_CODES

            if r.task == "translate":
                raise InvalidRequest("this model is English-only: it does not translate", param="task")
            if r.language is not None and LANGUAGE_CODES.get(r.language.strip().lower(), r.language.strip().lower()
                                                             ).strip("<|>") != "en":
                raise InvalidRequest(f"this model is English-only: language {r.language!r} is not supported",
                                     param="language")
        if r.task == "translate" and "translate" not in self.settings.task_to_id:
            raise InvalidRequest(f"task {r.task!r} is not supported by this model", param="task")
        temps = r.temperatures
        if not temps or not all(0.0 <= t <= 2.0 for t in temps):
            raise InvalidRequest(f"temperature must be between 0 and 2 (or a non-empty sequence of such), got "
                                 f"{r.temperature}", param="temperature")
        if r.language is not None and self.settings.is_multilingual:
            self.settings.language_id(r.language)
        if r.word_timestamps and not self.settings.alignment_heads:
            raise InvalidRequest("word timestamps need the model's alignment_heads (generation_config.json), which "
                                 "this model does not have", param="timestamp_granularities")
        if r.prompt:
            n = len(self.tokenizer.encode(" " + r.prompt.strip(), add_special_tokens=False))
            if n + 5 >= self.model.max_seq_len:
                raise InvalidRequest(f"prompt is {n} tokens; at most {self.model.max_seq_len - 6} fit the decoder",
                                     param="prompt")

    def _job(self, r: TranscriptionRequest) -> _Job:
        self.check(r)
        a = np.asarray(r.audio, np.float32).reshape(-1)
        feats = log_mel_spectrogram(a, self.model.config.num_mel_bins, pad_to_window=a.size <= N_FRAMES * 160)
        frames = N_FRAMES if a.size <= N_FRAMES * 160 else a.size // 160
        j = _Job(r, feats, frames, audio_frames=-(-a.size // 160))
        if r.language is not None and self.settings.is_multilingual:
            j.language_id = self.settings.language_id(r.language)
        if any(t > 0 for t in r.temperatures):
            j.generator = torch.Generator().manual_seed(int(r.seed) if r.seed is not None else
                                                         int(torch.seed() % (2 ** 31)))
        return j

    # ------------------------------------------------------------------ one round: one window per job
    def _round(self, jobs: list[_Job]) -> None:
        windows = []
        for j in jobs:
            w = j.features[:, j.seek:j.seek + N_FRAMES]
            if w.shape[1] < N_FRAMES:
                w = np.pad(w, ((0, 0), (0, N_FRAMES - w.shape[1])))
            windows.append(w)
        cross = self.model.encode_cross(np.stack(windows), [f"whisper-window-{next(_ids)}" for _ in jobs])
        try:
            self._decode_round(jobs, cross)
        finally:
            self.model.release_cross(cross)

    def _decode_round(self, jobs: list[_Job], cross: "CrossCache") -> None:
        self._detect_languages(jobs, cross)
        ts = [j.req.timestamps or j.frames > N_FRAMES for j in jobs]
        prompts = []
        for j, t in zip(jobs, ts):
            prev = None
            if j.req.prompt:
                prev = self.tokenizer.encode(" " + j.req.prompt.strip(), add_special_tokens=False)
            p = prompt_tokens(self.settings, self._task(j), t, j.language_id, j.detected_id, prev)
            if not j.prompt:
                j.prompt = list(p)
            langs = set(self.settings.lang_to_id.values())
            j.prompt_language = next((x for x in p[p.index(self.settings.decoder_start_token_id) + 1:][:1]
                                      if x in langs), None)
            prompts.append(p)
        for j in jobs:
            j.temp_idx = 0
        outs, ended, lps = self._decode(jobs, cross, prompts, ts)
        no_speech = self._no_speech(jobs, cross, prompts)
        skip = [False] * len(jobs)
        pending = list(range(len(jobs)))
        while pending:  # transformers' temperature fallback: windows failing the thresholds decode again, hotter
            redo = []
            for i in pending:
                need, skip[i] = self._verdict(jobs[i], outs[i], ended[i], lps[i], no_speech[i])
                if need and jobs[i].temp_idx + 1 < len(jobs[i].req.temperatures):
                    redo.append(i)
            for i in redo:
                jobs[i].temp_idx += 1
                jobs[i].fallbacks += 1
            if redo:
                o, e, lp = self._decode([jobs[i] for i in redo], cross.rows(redo), [prompts[i] for i in redo],
                                        [ts[i] for i in redo])
                for k, i in enumerate(redo):
                    outs[i], ended[i], lps[i] = o[k], e[k], lp[k]
            pending = redo
        tb = self.settings.timestamp_begin
        for row, (j, toks) in enumerate(zip(jobs, outs)):
            n = min(N_FRAMES, j.frames - j.seek)
            if skip[row]:  # silence: no segment, on to the next window
                j.skipped += 1
                j.seek += n
                continue
            offset = j.seek * TIME_PRECISION / 2
            if tb is not None and toks:
                # timestamp tokens split the window even when none were asked for (a model may still emit them);
                # the window is re-entered after the last complete segment
                segs, advance = split_segments(toks, tb, offset, n)
            else:
                segs, advance = [Segment(offset, offset + n * TIME_PRECISION / 2, toks)], n
            for seg in segs:
                seg.seek = j.seek
            j.segments += segs
            kept = [t for seg in segs for t in seg.tokens]
            if j.req.word_timestamps:
                times = self._token_times(j, cross, row, prompts[row], toks, ended[row])
                j.times += [offset + float(t) for t in times[:len(kept)]]
            j.tokens += kept
            j.seek += max(int(advance), 1)

    def _task(self, j: _Job) -> Optional[str]:
        """The request's task token name (None on an English-only model, which has none)."""
        return j.req.task if self.settings.is_multilingual else None

    @staticmethod
    def _long(j: _Job) -> bool:
        return j.frames > N_FRAMES

    def _verdict(self, j: _Job, toks: list[int], ended: bool, logprob_sum: float,
                 no_speech: Optional[float]) -> tuple[bool, bool]:
        """``(decode again at the next temperature, skip the window as silence)`` for one window's result (the
        thresholds apply to long audio only, as in transformers)."""
        r = j.req
        if not self._long(j):
            return False, False
        seq = [*toks, self.settings.eos_token_id] if ended else list(toks)
        need = False
        if r.compression_ratio_threshold is not None and seq:
            need = compression_ratio(seq, self.model.config.vocab_size) > r.compression_ratio_threshold
        if r.logprob_threshold is not None and seq:
            low = logprob_sum / len(seq) < r.logprob_threshold
            need = need or low
            if low and no_speech is not None and no_speech > float(r.no_speech_threshold):
                return False, True
        return need, False

    def _no_speech(self, jobs: list[_Job], cross: "CrossCache", prompts: list[list[int]]) -> list[Optional[float]]:
        """Each long-audio job's probability of ``<|nospeech|>`` (the token before ``<|notimestamps|>``) after its
        window's start-of-transcript token, where it asks for ``no_speech_threshold`` (with
        ``logprob_threshold``); None elsewhere."""
        s = self.settings
        out: list[Optional[float]] = [None] * len(jobs)
        need = [i for i, j in enumerate(jobs) if self._long(j) and j.req.no_speech_threshold is not None
                and j.req.logprob_threshold is not None and s.no_timestamps_token_id is not None]
        if not need:
            return out
        heads = [prompts[i][:prompts[i].index(s.decoder_start_token_id) + 1] for i in need]
        seqs = [_Seq(f"whisper-nospeech-{next(_ids)}", h, 0, len(h)) for h in heads]
        logits = self._with_cache(seqs, lambda: self.model.decode_step(seqs, cross.rows(need)))
        probs = torch.softmax(logits.float(), dim=-1)[:, s.no_timestamps_token_id - 1]
        for i, p in zip(need, probs.tolist()):
            out[i] = p
        return out

    def _token_times(self, j: _Job, cross: "CrossCache", row: int, prompt: list[int], toks: list[int],
                     ended: bool) -> np.ndarray:
        """Each of one window's generated ``toks``' start (seconds from the window's start): the alignment heads'
        cross-attention when each token is read (the last one's is its predecessor's time when the window did
        not end with the end token, which would have read it)."""
        if not toks:
            return np.zeros(0)
        n = len(toks) if ended else len(toks) - 1
        if n == 0:
            return np.zeros(1)
        s = self.settings
        attn = alignment_weights(self.model.decoder_weights, self.model.config, [*prompt, *toks[:n]],
                                 cross.keys[row], cross.values[row], s.alignment_heads)[:, len(prompt):]
        t = token_times(attn, j.audio_frames - j.seek, s.median_filter_width)
        return t if ended else np.concatenate([t, t[-1:]])

    def _detect_languages(self, jobs: list[_Job], cross: "CrossCache") -> None:
        s = self.settings
        need = [i for i, j in enumerate(jobs)
                if j.detected_id is None and needs_language(s, j.language_id, self._task(j))]
        if not need:
            return
        seqs = [_Seq(f"whisper-lang-{next(_ids)}", [s.decoder_start_token_id], 0, 1) for _ in need]
        logits = self._with_cache(seqs, lambda: self.model.decode_step(seqs, cross.rows(need)))
        lang_ids = torch.as_tensor(sorted(s.lang_to_id.values()))
        for i, row in zip(need, logits):
            jobs[i].detected_id = int(lang_ids[int(torch.argmax(row[lang_ids]))])

    def _with_cache(self, seqs: list[_Seq], fn: Any) -> Any:
        mgr = self.model.kv_manager
        for q in seqs:
            mgr.external_claim(q.request_id)
        try:
            return fn()
        finally:
            for q in seqs:
                mgr.release(q.request_id)

    def _decode(self, jobs: list[_Job], cross: "CrossCache", prompts: list[list[int]], ts: list[bool]
                ) -> tuple[list[list[int]], list[bool], list[float]]:
        """Each job's generated tokens for its window (end token removed), whether the end token ended it, and the
        sum of the picked tokens' log-probabilities (end token included) under the token rules."""
        s = self.settings
        limit = self.model.max_seq_len
        seqs = [_Seq(f"whisper-{next(_ids)}", list(p), 0, len(p), limit) for p in prompts]
        gen: list[list[int]] = [[] for _ in jobs]
        ended = [False] * len(jobs)
        logprobs = [0.0] * len(jobs)
        for p in prompts:
            if len(p) >= limit:
                raise InvalidRequest(f"the prompt takes {len(p)} of the decoder's {limit} positions", param="prompt")
        # without max_new_tokens a window ends at the generation config's max_length past the prompt's first
        # tokens (at most half the decoder's positions), within the decoder's positions (transformers' rule)
        half = self.model.config.max_target_positions // 2 - 1
        ends = [limit if j.req.max_new_tokens is not None else min(s.max_length + min(half, len(p)), limit)
                for j, p in zip(jobs, prompts)]

        def run() -> None:
            active = list(range(len(jobs)))
            sub = cross
            while active:
                logits = self.model.decode_step([seqs[i] for i in active], sub)
                x = self._rules(logits.shape[-1]).apply(logits.numpy(), [gen[i] for i in active],
                                                        [ts[i] for i in active])
                still = []
                for row, (i, tok) in enumerate(zip(active, self._pick(x, [jobs[i] for i in active]))):
                    logprobs[i] += float(x[row, tok]) - _logsumexp(x[row])
                    cap = jobs[i].req.max_new_tokens
                    if tok == s.eos_token_id:
                        ended[i] = True
                        continue
                    gen[i].append(tok)
                    q = seqs[i]
                    q.tokens.append(tok)
                    q.active_idx += 1
                    if (cap is not None and len(gen[i]) >= cap) or q.active_idx >= ends[i]:
                        continue
                    still.append(i)
                if len(still) != len(active):  # requests finished: the others' windows
                    sub = sub.rows([active.index(i) for i in still])
                active = still

        self._with_cache(seqs, run)
        return gen, ended, logprobs

    def _rules(self, vocab: int) -> TokenRules:
        if self._token_rules is None or self._token_rules.vocab != vocab:
            self._token_rules = TokenRules(self.settings, vocab)
        return self._token_rules

    @staticmethod
    def _pick(x: np.ndarray, jobs: list[_Job]) -> list[int]:
        """Row ``i``'s next token for ``jobs[i]``: the argmax, or a sample at the job's temperature from its own
        generator."""
        out = np.argmax(x, axis=-1).tolist()
        for i, job in enumerate(jobs):
            t = job.temperature
            if t > 0:
                p = torch.softmax(torch.from_numpy(x[i]) / t, dim=-1)
                out[i] = int(torch.multinomial(p, 1, generator=job.generator))
        return out

    # ------------------------------------------------------------------ results
    def _text(self, toks: list[int]) -> str:
        tb = self.settings.timestamp_begin
        keep = [t for t in toks if (tb is None or t < tb) and t != self.settings.eos_token_id]
        return self.tokenizer.decode(keep, skip_special_tokens=True)

    def _result(self, j: _Job) -> Transcription:
        lang = None if self.settings.is_multilingual else "en"  # an English-only model's output is English
        if j.prompt_language is not None:
            lang = next((k.strip("<|>") for k, v in self.settings.lang_to_id.items() if v == j.prompt_language), None)
        for seg in j.segments:
            seg.text = self._text(seg.tokens)
        words: list[Word] = []
        if j.req.word_timestamps:
            limit = self.settings.eos_token_id
            words = group_words(j.tokens, j.times, lambda t: self.tokenizer.decode(t, skip_special_tokens=True),
                                limit)
        return Transcription(text=self._text(j.tokens), language=lang, duration=j.req.audio.size / SAMPLING_RATE,
                             tokens=j.tokens, segments=j.segments, token_times=j.times, words=words,
                             fallbacks=j.fallbacks, skipped_windows=j.skipped, prompt=j.prompt)
