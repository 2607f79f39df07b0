"""OpenAI's log-probability shapes (chat ``logprobs.content`` and completions ``logprobs``) from the
pipeline's ``LogProbabilities`` records."""

from __future__ import annotations

from typing import Any, Optional


class TokenText:
    """Token id -> its text, cached per response."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, t: int) -> str:
        s = self.cache.get(t)
        if s is None:
            s = self.tok.decode_sync([t])
            self.cache[t] = s
        return s


def _top_sorted(top: dict, n: int) -> list[tuple[int, float]]:
    return sorted(top.items(), key=lambda kv: -kv[1])[:n]


def chat_logprobs(entries: list[Any], tokens: list[int], n_top: int, text: TokenText) -> dict[str, Any]:
    content = []
    for lp in entries:
        for j, chosen in enumerate(lp.token_log_probabilities):
            idx = len(content)
            tid = tokens[idx] if idx < len(tokens) else None
            top = lp.top_log_probabilities[j]
            if tid is None:
                tid = max(top, key=top.get) if top else 0
            s = text(tid)
            content.append({"token": s, "logprob": float(chosen), "bytes": list(s.encode("utf-8")),
                            "top_logprobs": [{"token": text(t), "logprob": float(v),
                                              "bytes": list(text(t).encode("utf-8"))}
                                             for t, v in _top_sorted(top, n_top)]})
    return {"content": content, "refusal": None}


def completion_logprobs(entries: list[Any], tokens: list[int], n_top: int, text: TokenText, offset0: int,
                        prompt_tokens: Optional[list[int]] = None, prompt_entries: Optional[Any] = None
                        ) -> dict[str, Any]:
    """``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``; with ``prompt_tokens`` (echo) the
    prompt's tokens come first: the first has no log probability (nothing precedes it), the others
    take theirs from ``prompt_entries`` when given (one ``LogProbabilities`` over the prompt)."""
    toks: list[str] = []
    lps: list[Optional[float]] = []
    tops: list[Optional[dict[str, float]]] = []
    offs: list[int] = []
    pos = offset0
    if prompt_tokens is not None:
        pos = 0
        for i, t in enumerate(prompt_tokens):
            s = text(t)
            toks.append(s)
            offs.append(pos)
            pos += len(s)
            if i == 0 or prompt_entries is None or i - 1 >= len(prompt_entries.token_log_probabilities):
                lps.append(None)
                tops.append(None)
            else:
                lps.append(float(prompt_entries.token_log_probabilities[i - 1]))
                tops.append({text(k): float(v)
                             for k, v in _top_sorted(prompt_entries.top_log_probabilities[i - 1], n_top)})
    k = 0
    for lp in entries:
        for j, chosen in enumerate(lp.token_log_probabilities):
            tid = tokens[k] if k < len(tokens) else 0
            k += 1
            s = text(tid)
            toks.append(s)
            lps.append(float(chosen))
            tops.append({text(t): float(v) for t, v in _top_sorted(lp.top_log_probabilities[j], n_top)})
            offs.append(pos)
            pos += len(s)
    return {"tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs}


def split_prompt_entries(entries: list[Any], n_prompt: int) -> tuple[Optional[Any], list[Any]]:
    """Echo: the first entry covers prompt tokens 1..n_prompt-1 and then the first sampled token;
    returns ``(the prompt's entry, the entries of the sampled tokens)``."""
    if not entries or n_prompt <= 1:
        return None, list(entries)
    from max.interfaces import LogProbabilities

    first, k = entries[0], n_prompt - 1
    if len(first.token_log_probabilities) <= k:
        return None, list(entries)
    prompt = LogProbabilities(first.token_log_probabilities[:k], first.top_log_probabilities[:k])
    rest = LogProbabilities(first.token_log_probabilities[k:], first.top_log_probabilities[k:])
    return prompt, [rest, *entries[1:]]


def vllm_prompt_logprobs(prompt_tokens: list[int], entry: Any, n_top: int, text: TokenText) -> list[Any]:
    """vLLM's ``prompt_logprobs``: None for the first token, then per token ``{token_id: {"logprob",
    "rank", "decoded_token"}}`` for the token itself and the ``n_top`` most likely ones."""
    out: list[Any] = [None]
    for i, t in enumerate(prompt_tokens[1:]):
        if entry is None or i >= len(entry.token_log_probabilities):
            out.append(None)
            continue
        top = entry.top_log_probabilities[i]
        ranked = sorted(top.items(), key=lambda kv: -kv[1])
        d = {str(k): {"logprob": float(v), "rank": r + 1, "decoded_token": text(k)}
             for r, (k, v) in enumerate(ranked[:n_top])}
        chosen = float(entry.token_log_probabilities[i])
        if str(t) not in d:  # outside the top n: its exact rank is not known
            d[str(t)] = {"logprob": chosen, "rank": None, "decoded_token": text(t)}
        out.append(d)
    return out
