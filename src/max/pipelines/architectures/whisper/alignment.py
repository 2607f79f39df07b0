"""Word-level timestamps: which audio frames each generated token lines up with.

The decoder's cross-attention of a few chosen heads (``generation_config.alignment_heads``) follows the speech:
one extra decoder forward over a window's final tokens (in torch, float32, no KV cache) returns those heads'
attention weights; they are normalised per head over the tokens, median-filtered along time, averaged over the
heads, and a dynamic time warping path through the (negated) matrix gives each token's first frame.  Tokens are
then grouped into words at spaces and punctuation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from max.pipelines.architectures.whisper.config import TIME_PRECISION, WhisperConfig

__all__ = ["Word", "alignment_weights", "dtw_path", "median_filter", "token_times", "group_words"]


def _t(v: Any) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        return v.float()
    if hasattr(v, "_torch"):
        return v._torch().float()
    return torch.from_numpy(np.asarray(v)).float()


def _act(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name == "gelu":
        return torch.nn.functional.gelu
    if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        return lambda x: torch.nn.functional.gelu(x, approximate="tanh")
    if name == "relu":
        return torch.relu
    raise ValueError(f"whisper word timestamps: activation {name!r} is not supported")


def alignment_weights(weights: Mapping[str, Any], c: WhisperConfig, tokens: Sequence[int], cross_k: torch.Tensor,
                      cross_v: torch.Tensor, heads: Sequence[Sequence[int]]) -> torch.Tensor:
    """Cross-attention probabilities ``[len(heads), len(tokens), source_len]`` of the ``(layer, head)`` pairs
    ``heads`` when the decoder reads ``tokens`` (from position 0) over one window whose cross keys/values are
    ``cross_k``/``cross_v`` ``[layers, source_len, heads, head_dim]``.  ``weights``: the decoder's checkpoint
    tensors by name (``decoder.…``)."""
    W = {k: _t(v) for k, v in weights.items() if k.startswith("decoder.")}
    H, D = c.decoder_attention_heads, c.head_dim
    scale = D ** -0.5
    act = _act(c.activation_function)
    ids = torch.as_tensor(list(tokens), dtype=torch.long)
    T = ids.numel()
    x = W["decoder.embed_tokens.weight"][ids]
    if c.scale_embedding:
        x = x * float(c.d_model) ** 0.5
    x = x + W["decoder.embed_positions.weight"][:T]
    want: dict[int, list[int]] = {}
    for layer, head in heads:
        want.setdefault(int(layer), []).append(int(head))
    found: dict[tuple[int, int], torch.Tensor] = {}
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)

    def lin(p: str, h: torch.Tensor) -> torch.Tensor:
        y = h @ W[f"{p}.weight"].T
        b = W.get(f"{p}.bias")
        return y if b is None else y + b

    def ln(p: str, h: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(h, (c.d_model,), W[f"{p}.weight"], W[f"{p}.bias"], 1e-5)

    last = max(want) if want else -1
    for i in range(last + 1):
        p = f"decoder.layers.{i}"
        h = ln(f"{p}.self_attn_layer_norm", x)
        q, k, v = (lin(f"{p}.self_attn.{n}_proj", h).reshape(T, H, D).transpose(0, 1) for n in "qkv")
        s = (q @ k.transpose(1, 2)) * scale
        o = torch.softmax(s.masked_fill(causal, float("-inf")), -1) @ v
        x = x + lin(f"{p}.self_attn.out_proj", o.transpose(0, 1).reshape(T, H * D))
        q = lin(f"{p}.encoder_attn.q_proj", ln(f"{p}.encoder_attn_layer_norm", x)).reshape(T, H, D).transpose(0, 1)
        probs = torch.softmax((q @ cross_k[i].float().permute(1, 2, 0)) * scale, -1)  # [H, T, S]
        for head in want.get(i, []):
            found[(i, head)] = probs[head]
        if i == last:
            break
        o = probs @ cross_v[i].float().transpose(0, 1)
        x = x + lin(f"{p}.encoder_attn.out_proj", o.transpose(0, 1).reshape(T, H * D))
        x = x + lin(f"{p}.fc2", act(lin(f"{p}.fc1", ln(f"{p}.final_layer_norm", x))))
    return torch.stack([found[(int(a), int(b))] for a, b in heads])


def median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """Median over a window of odd ``width`` along the last axis, edges reflected."""
    if width <= 0 or width % 2 != 1:
        raise ValueError(f"median filter width must be a positive odd number, got {width}")
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    return np.median(np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1), axis=-1)


def dtw_path(cost_matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(row indices, column indices)`` of the cheapest monotonic path through ``cost_matrix`` ``[rows, cols]``
    from its top-left to its bottom-right cell (diagonal, down or right moves; ties prefer right, then down).
    The accumulated costs are computed one anti-diagonal at a time."""
    n, m = cost_matrix.shape
    acc = np.full((n + 1, m + 1), np.inf, np.float32)
    move = np.full((n + 1, m + 1), -1, np.int8)
    acc[0, 0] = 0
    for k in range(2, n + m + 1):  # cells (i, j), i + j == k, 1 <= i <= n, 1 <= j <= m
        i = np.arange(max(1, k - m), min(n, k - 1) + 1)
        j = k - i
        diag, up, left = acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1]
        pick = np.where((diag < up) & (diag < left), 0, np.where((up < diag) & (up < left), 1, 2))
        best = np.choose(pick, [diag, up, left])
        acc[i, j] = cost_matrix[i - 1, j - 1] + best
        move[i, j] = pick
    move[0, :] = 2
    move[:, 0] = 1
    rows, cols = [], []
    i, j = n, m
    while i > 0 or j > 0:
        rows.append(i - 1)
        cols.append(j - 1)
        t = move[i, j]
        if t == 0:
            i, j = i - 1, j - 1
        elif t == 1:
            i -= 1
        else:
            j -= 1
    return np.asarray(rows[::-1]), np.asarray(cols[::-1])


def token_times(attn: torch.Tensor, n_frames: int, filter_width: int) -> np.ndarray:
    """Seconds (from the window's start) at which each of the ``attn.shape[1]`` tokens begins, from alignment
    heads' probabilities ``attn`` ``[heads, tokens, source_len]`` over a window holding ``n_frames`` mel frames of
    audio."""
    w = attn.double().numpy()[..., : max(int(n_frames) // 2, 1)]
    if w.shape[1] == 0:
        return np.zeros(0)
    w = (w - w.mean(axis=-2, keepdims=True)) / w.std(axis=-2, keepdims=True)
    matrix = median_filter(w, filter_width).mean(axis=0)
    rows, cols = dtw_path(-matrix)
    jumps = np.concatenate([[True], np.diff(rows) != 0])
    return cols[jumps] * TIME_PRECISION


@dataclass
class Word:
    word: str
    start: float
    end: float


_OPENING = "\"'“¿([{-"
_CLOSING = "\"'.。,，!！?？:：”)]}、"


def group_words(tokens: Sequence[int], times: Sequence[float], decode: Callable[[list[int]], str],
                text_limit: int) -> list[Word]:
    """Words of ``tokens`` (text tokens are those below ``text_limit``; others are skipped) with their start
    (their first token's time) and end (the next token's time; the last word ends at its last token's time).
    A word starts at a token beginning with a space; punctuation attaches to its neighbour (opening marks to the
    next word, closing ones to the previous)."""
    groups: list[list[int]] = []  # token positions per word
    for i, t in enumerate(tokens):
        if t >= text_limit:
            continue
        piece = decode([t])
        if not groups or piece.startswith(" ") or (piece.strip() and all(ch in _OPENING for ch in piece.strip())):
            groups.append([i])
        else:
            groups[-1].append(i)
    # closing punctuation standing alone sticks to the previous word; opening punctuation to the next
    merged: list[list[int]] = []
    carry: list[int] = []
    for g in groups:
        text = decode([tokens[k] for k in g]).strip()
        if merged and text and all(ch in _CLOSING for ch in text) and not carry:
            merged[-1] += g
        elif text and all(ch in _OPENING for ch in text):
            carry += g
        else:
            merged.append(carry + g)
            carry = []
    if carry:
        merged.append(carry)
    out = []
    for g in merged:
        nxt = g[-1] + 1
        end = times[nxt] if nxt < len(times) else times[g[-1]]
        out.append(Word(decode([tokens[k] for k in g]), float(times[g[0]]), float(end)))
    return out
