"""Speculative decoding with the n-gram (prompt lookup) draft against plain decoding, on prompts whose
answer repeats the prompt (editing code given in it, quoting a given text) and on one that does not.

Per prompt and engine: decode tokens/s at batch 1 (greedy; time after the first token), the speed-up of
the n-gram draft over plain decoding, its acceptance rate and tokens per target step; the outputs of
both are checked token-identical.  Default model: the bundled SmolLM2-135M-Instruct (Q4_1 GGUF,
quantised-resident kernels); the header names this CPU's SIMD features and the kernel variant.

Run: .venv/bin/python bench/ngram_draft.py [--model-path FILE] [--new-tokens 128] [--k 4]
         [--lookup-min 2] [--lookup-max 4] [--threads N] [--repeat 3]
For a fair figure run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _common import table  # noqa: E402

CODE = '''def moving_average(values, window):
    total = 0.0
    out = []
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            out.append(total / window)
    return out
'''
TEXT = ("The river rises in the northern hills, where rain falls on most days of the year. It runs south "
        "through three towns, each built at a ford, and turns east before it reaches the sea. Its water "
        "drove the mills of the valley for two centuries, and its floods shaped the fields on both banks.")
PROMPTS = {
    "code edit": f"{CODE}\n# The same function, with the variable `total` renamed to `acc`:\n",
    "quote text": f"Text: {TEXT}\n\nRepeat the text exactly.\nText: ",
    "free text": "Write a short story about a lighthouse keeper.\n",
}


def run(llm, prompt: str, new_tokens: int) -> tuple[list[int], float]:
    """(tokens, decode seconds after the first token) of one greedy request."""
    from max.interfaces import SamplingParams

    params = SamplingParams(top_k=1, max_new_tokens=new_tokens, ignore_eos=True)
    ctx = llm.make_context(prompt, params)
    toks: list[int] = []
    times: list[float] = []

    def on(o):
        times.extend([time.perf_counter()] * len(o.tokens))
        toks.extend(o.tokens)

    llm.scheduler.submit(ctx, on)
    llm.scheduler.run_until_idle()
    return toks, times[-1] - times[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--lookup-min", type=int, default=2)
    ap.add_argument("--lookup-max", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    from max.engine.native.build import cpu_features
    from max.entrypoints.default_model import default_model_path
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    path = a.model_path or default_model_path()
    base = dict(model_path=path, max_length=1024, max_batch_size=1, device_specs="cpu",
                **({"num_threads": a.threads} if a.threads else {}))
    plain = LLM(PipelineConfig(**base))
    ngram = LLM(PipelineConfig(**base, speculative_method="ngram", num_speculative_tokens=a.k,
                               prompt_lookup_min=a.lookup_min, prompt_lookup_max=a.lookup_max))
    from max.engine import native

    variant = native.isa()
    isa = " ".join(sorted(f for f in cpu_features() if f.startswith("avx512") or f in ("avx2", "avx_vnni")))
    print(f"model: {os.path.basename(str(path))}; CPU: {isa}; kernel variant: {variant}; "
          f"k={a.k}, prompt_lookup {a.lookup_min}..{a.lookup_max}; {a.new_tokens} new tokens, greedy, batch 1")
    rows = []
    for name, prompt in PROMPTS.items():
        run(plain, prompt, 8), run(ngram, prompt, 8)  # warm-up
        want, _ = run(plain, prompt, a.new_tokens)
        m = ngram.pipeline.metrics
        m.draft_tokens_proposed = m.draft_tokens_accepted = m.rounds = m.tokens_generated = 0
        t_plain, t_ngram = [], []
        for _ in range(a.repeat):
            toks, s = run(plain, prompt, a.new_tokens)
            t_plain.append(s)
            got, s = run(ngram, prompt, a.new_tokens)
            t_ngram.append(s)
            if got != want:
                raise SystemExit(f"{name}: the n-gram draft changed the greedy output")
        n = a.new_tokens - 1
        tp, tn = n / statistics.median(t_plain), n / statistics.median(t_ngram)
        rows.append((name, f"{tp:.1f}", f"{tn:.1f}", f"{tn / tp:.2f}x", f"{m.acceptance_rate:.0%}",
                     f"{m.tokens_per_round:.2f}", "yes"))
    table("decode tokens/s (median of repeats)", rows,
          ("prompt", "plain", "ngram draft", "speed-up", "acceptance", "tokens/target step", "identical"))


if __name__ == "__main__":
    main()
