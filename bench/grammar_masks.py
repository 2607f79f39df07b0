"""Per-token cost of grammar token masks: llguidance vs xgrammar, on SmolLM2's tokenizer (49,152 tokens).

Both libraries are driven the way the batched sampler drives them: per decode step, fill one bitmask row per
constrained request (batch 1 and 16, each request with its own matcher), apply the masks to float32 logits
(one shared torch apply, so only the libraries' work differs), then advance every matcher by one token.
The token stream is the tokenisation of a valid JSON document for the schema, plus EOS.  Also reported:
tokenizer set-up (once per model) and schema compilation (once per request), both medians.

Run: .venv/bin/python bench/grammar_masks.py [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from _common import fmt_s, table  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.(com|org)$"},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["admin", "user", "guest"]}, "maxItems": 3},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                    "required": ["city", "zip"], "additionalProperties": False},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "email", "tags", "address", "active"],
    "additionalProperties": False,
}
DOC = {"name": "Ada Lovelace", "age": 36, "email": "ada@analytical.org", "tags": ["admin", "user"],
       "address": {"city": "London", "zip": "W1"}, "active": True}


def apply_masks(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    from max.pipelines.lib.structured_output import apply_token_bitmask

    apply_token_bitmask(logits, bitmask)


def bench_llguidance(tok, tokens: list[int], batch: int, steps: int) -> dict:
    import llguidance
    import llguidance.hf
    import llguidance.torch as lgt

    t0 = time.perf_counter()
    lltok = llguidance.hf.from_tokenizer(tok, n_vocab=len(tok))
    setup = time.perf_counter() - t0
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)
    compiles = []
    for _ in range(5):
        t = time.perf_counter()
        m = llguidance.LLMatcher(lltok, grammar)
        compiles.append(time.perf_counter() - t)
    assert not m.is_error(), m.get_error()
    matchers = [llguidance.LLMatcher(lltok, grammar) for _ in range(batch)]
    executor = llguidance.LLExecutor()
    bitmask = torch.full(lgt.get_bitmask_shape(batch, len(tok)), -1, dtype=torch.int32)
    logits = torch.randn(batch, len(tok))
    per_fill, per_step = [], []
    for k in range(min(steps, len(tokens))):
        t = time.perf_counter()
        if batch == 1:
            lgt.fill_next_token_bitmask(matchers[0], bitmask, 0)
        else:
            lgt.fill_next_token_bitmask_par(executor, [(m, i) for i, m in enumerate(matchers)], bitmask)
        t1 = time.perf_counter()
        lg = logits.clone()
        apply_masks(lg, bitmask)
        for m in matchers:
            ok = m.consume_token(tokens[k])
            assert ok, (k, m.get_error())
        per_fill.append(t1 - t)
        per_step.append(time.perf_counter() - t)
    return dict(setup=setup, compile=statistics.median(compiles), fill=statistics.median(per_fill),
                step=statistics.median(per_step), mean_step=statistics.mean(per_step))


def bench_xgrammar(tok, tokens: list[int], batch: int, steps: int) -> dict:
    import xgrammar as xgr

    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok), stop_token_ids=[tok.eos_token_id])
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    setup = time.perf_counter() - t0
    compiles = []
    for _ in range(5):
        t = time.perf_counter()
        cg = compiler.compile_json_schema(json.dumps(SCHEMA))
        compiles.append(time.perf_counter() - t)
    matchers = [xgr.GrammarMatcher(cg) for _ in range(batch)]
    bm = xgr.BatchGrammarMatcher() if batch > 1 else None
    bitmask = xgr.allocate_token_bitmask(batch, len(tok))
    logits = torch.randn(batch, len(tok))
    per_fill, per_step = [], []
    for k in range(min(steps, len(tokens))):
        t = time.perf_counter()
        if bm is None:
            matchers[0].fill_next_token_bitmask(bitmask, 0)
        else:
            bm.batch_fill_next_token_bitmask(matchers, bitmask)
        t1 = time.perf_counter()
        lg = logits.clone()
        apply_masks(lg, bitmask)
        for m in matchers:
            ok = m.accept_token(tokens[k])
            assert ok, k
        per_fill.append(t1 - t)
        per_step.append(time.perf_counter() - t)
    return dict(setup=setup, compile=statistics.median(compiles), fill=statistics.median(per_fill),
                step=statistics.median(per_step), mean_step=statistics.mean(per_step))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    torch.set_num_threads(2)
    from max.entrypoints.default_model import default_model_path
    from max.pipelines.lib.tokenizer import load_hf_tokenizer

    tok = load_hf_tokenizer(default_model_path())
    tokens = tok.encode(json.dumps(DOC), add_special_tokens=False) + [tok.eos_token_id]
    print(f"SmolLM2 tokenizer: {len(tok)} tokens; JSON document: {len(tokens)} tokens incl. EOS; "
          f"torch threads {torch.get_num_threads()}")
    rows = []
    for batch in (1, 16):
        res = {}
        for name, fn in (("llguidance", bench_llguidance), ("xgrammar", bench_xgrammar)):
            try:
                res[name] = fn(tok, tokens, batch, args.steps)
            except ImportError as e:
                print(f"{name}: not installed ({e})")
        for name, r in res.items():
            ratio = r["step"] / res["llguidance"]["step"] if "llguidance" in res else float("nan")
            rows.append((batch, name, fmt_s(r["setup"]), fmt_s(r["compile"]), fmt_s(r["fill"]), fmt_s(r["step"]),
                         fmt_s(r["mean_step"]), f"{ratio:.2f}x"))
    table("grammar masks per decode step (fill = library mask computation; step = fill + apply + advance)", rows,
          ("batch", "library", "tokenizer setup", "schema compile", "fill p50", "step p50", "step mean",
           "step vs llguidance"))
    print(f"\npeak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB (both libraries)")


if __name__ == "__main__":
    main()
