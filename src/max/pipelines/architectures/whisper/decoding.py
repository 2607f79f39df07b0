"""Whisper's token rules during decoding (what transformers' Whisper generation applies, as plain functions
over one request's logits): the prompt of special tokens, suppressed tokens, the timestamp rules, and how a
30 s window's tokens split into timed segments (long audio seeks to the last complete segment)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from max.interfaces.errors import InvalidRequest
from max.pipelines.architectures.whisper.config import HOP_LENGTH, SAMPLING_RATE, TIME_PRECISION, GenerationSettings

__all__ = ["Segment", "TokenRules", "needs_language", "prompt_tokens", "split_segments"]

INPUT_STRIDE = 2  # mel frames per encoder position (= per timestamp step)
HOP_SECONDS = HOP_LENGTH / SAMPLING_RATE  # seconds per mel frame


def needs_language(s: GenerationSettings, language_id: int | None, task: str | None) -> bool:
    """Whether a request's prompt takes a detected language: it gives none, the model has ``lang_to_id``, and the
    prompt's language position is not fixed by ``forced_decoder_ids`` (which apply only when neither a
    language nor a task is given) -- transformers' rule."""
    if language_id is not None or not s.lang_to_id:
        return False
    forced = s.forced_decoder_ids if task is None else []
    return not forced or forced[0][1] is None


def prompt_tokens(s: GenerationSettings, task: str | None, timestamps: bool, language_id: int | None = None,
                  detected_id: int | None = None, previous: list[int] | None = None) -> list[int]:
    """The decoder prompt of a request, built as transformers' Whisper ``generate`` builds it:
    ``[<|startofprev|> previous...] <|startoftranscript|>``, then, when neither a language (``language_id``, the
    given language's token) nor a ``task`` is given, the checkpoint's ``forced_decoder_ids``; the language (the
    given one, else ``detected_id`` when :func:`needs_language`) at position 1; the ``task``'s token, or
    ``<|transcribe|>`` when a language is given and no task token is there yet; ``<|notimestamps|>`` without
    ``timestamps`` (removed from the end with them)."""
    out: list[int] = []
    if previous:
        if s.prev_sot_token_id is None:
            raise InvalidRequest("prompt: this model has no <|startofprev|> token", param="prompt")
        out += [s.prev_sot_token_id, *previous]
    given = language_id is not None
    init: list[int | None] = [s.decoder_start_token_id]
    if task is None and not given:
        init += [t for _, t in s.forced_decoder_ids]
    lang = language_id if given else detected_id
    if lang is not None:
        if len(init) > 1:
            init[1] = lang
        else:
            init.append(lang)
    if task is not None:
        if task not in s.task_to_id:
            raise InvalidRequest(f"task {task!r} is not supported by this model (supported: {sorted(s.task_to_id)})",
                                 param="task")
        init.append(s.task_to_id[task])
    elif given and "transcribe" in s.task_to_id and not any(t in init for t in s.task_to_id.values()):
        init.append(s.task_to_id["transcribe"])
    nts = s.no_timestamps_token_id
    if nts is not None:
        if not timestamps and init[-1] != nts:
            init.append(nts)
        elif timestamps and init[-1] == nts:
            init.pop()
    return out + [t for t in init if t is not None]


class TokenRules:
    """The token rules of one model's settings over a batch of logits, in numpy: the suppressed tokens' indices
    are built once (for a vocabulary of ``vocab`` tokens).  These are a few small operations per step, run on
    the calling thread: as torch operations over a large vocabulary each would be a parallel region, whose
    synchronisation costs more than the work itself on a busy machine."""

    def __init__(self, s: GenerationSettings, vocab: int) -> None:
        self.s, self.vocab = s, vocab
        self.suppress = np.asarray(sorted({t for t in s.suppress_tokens if 0 <= t < vocab}), np.int64)
        self.first = np.asarray(sorted({t for t in [*s.suppress_tokens, *s.begin_suppress_tokens]
                                        if 0 <= t < vocab}), np.int64)

    def apply(self, logits: np.ndarray, generated: list[list[int]], timestamps: list[bool]) -> np.ndarray:
        """``logits`` ``[batch, vocab]`` (float32; changed in place) with the forbidden tokens at -inf, row ``i``
        for a request that has generated ``generated[i]`` after its prompt: ``begin_suppress_tokens`` at the
        first step, ``suppress_tokens`` always, and with ``timestamps[i]`` the pairing / monotonic /
        initial-timestamp rules, and a timestamp forced when the timestamps' total probability (of the
        log-softmax) beats every text token's."""
        s, x = self.s, logits
        firsts = [not g for g in generated]
        if all(firsts) or not any(firsts):  # the usual case: one fill for the whole batch
            x[:, self.first if firsts[0] else self.suppress] = -np.inf
        else:
            for i, f in enumerate(firsts):
                x[i, self.first if f else self.suppress] = -np.inf
        tb = s.timestamp_begin
        if tb is None:
            return x
        for i, t in enumerate(timestamps):
            if t:
                _timestamp_rules(s, x[i], generated[i])
                lp = _log_softmax(x[i])
                if _logsumexp(lp[tb:]) > lp[:tb].max():
                    x[i, :tb] = -np.inf
        return x


def _logsumexp(x: np.ndarray) -> float:
    m = x.max()
    if not np.isfinite(m):
        return float(m)
    return float(m + np.log(np.exp(x - m).sum(dtype=np.float32)))


def _log_softmax(x: np.ndarray) -> np.ndarray:
    return x - np.float32(_logsumexp(x))


def _timestamp_rules(s: GenerationSettings, x: np.ndarray, generated: list[int]) -> None:
    """The pairing / monotonic / initial-timestamp rules on one row ``x`` ``[vocab]`` (in place)."""
    ninf = -np.inf
    tb = s.timestamp_begin
    x[s.no_timestamps_token_id] = ninf
    last_ts = len(generated) >= 1 and generated[-1] >= tb
    prev_ts = len(generated) < 2 or generated[-2] >= tb
    if last_ts:
        if prev_ts:
            x[tb:] = ninf  # a pair just closed: text (or end) next
        else:
            x[:s.eos_token_id] = ninf  # an open pair: its closing timestamp (or end) next
    seen = [t for t in generated if t >= tb]
    floor = tb
    if seen:
        floor = seen[-1] if (last_ts and not prev_ts) else seen[-1] + 1
    x[tb:floor] = ninf  # timestamps never go back
    if not generated:
        x[:tb] = ninf
        if s.max_initial_timestamp_index is not None:
            x[tb + s.max_initial_timestamp_index + 1:] = ninf


@dataclass
class Segment:
    start: float
    end: float
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    seek: int = 0
    """The mel frame its window started at."""


def split_segments(tokens: list[int], tb: int, time_offset: float, window_frames: int) -> tuple[list[Segment], int]:
    """``(segments, frames to advance)`` of one window's generated ``tokens`` (end token removed):
    complete timestamp pairs close segments; after a single final timestamp the whole window is done,
    otherwise decoding resumes at the last closed segment's end."""
    is_ts = [t >= tb for t in tokens]
    single_end = is_ts[-2:] == [False, True]
    cuts = [i + 1 for i in range(len(is_ts) - 1) if is_ts[i] and is_ts[i + 1]]
    if cuts:
        if single_end:
            cuts.append(len(tokens))
        else:
            cuts[-1] += 1
        segs, last = [], 0
        for i, cut in enumerate(cuts):
            part = tokens[last:cut]
            end_at = -1 if (i < len(cuts) - 1 or single_end) else -2
            segs.append(Segment(time_offset + (part[0] - tb) * TIME_PRECISION,
                                time_offset + (part[end_at] - tb) * TIME_PRECISION, part))
            last = cut
        advance = window_frames if single_end else (tokens[last - 2] - tb) * INPUT_STRIDE
        return segs, advance
    stamps = [t for t in tokens if t >= tb]
    end_pos = float(int(window_frames * HOP_SECONDS / TIME_PRECISION))  # the whole window
    if stamps and stamps[-1] != tb:
        end_pos = float(stamps[-1] - tb)
    return [Segment(time_offset, time_offset + end_pos * TIME_PRECISION, list(tokens))], window_frames
