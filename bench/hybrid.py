"""Hybrid (recurrent-state) families: libremax beside Hugging Face transformers on the same random
checkpoint of each family (8 layers, hidden 512, made with transformers' own config class; float32).

Per family and engine, each in its own process (so peak RSS is its own): decode TPOT at batch 1 and
aggregate decode tokens/s at batch 16 (greedy), and peak RSS.  Each generated token is time-stamped as it
arrives (libremax: the scheduler's output callback; transformers: a stopping criterion, called once per
generated token); a step's time is the gap between consecutive tokens of a request, and the figures use
the median step (robust to a busy host's stalls; prompt processing is left out).  libremax runs through its scheduler
(continuous batching over the hybrid cache); transformers through ``generate`` with its own cache.  The
last column is the ratio libremax / transformers (higher is better for libremax).

Run: .venv/bin/python bench/hybrid.py [--families mamba2,lfm2,...] [--new-tokens 32] [--threads N] [--repeat R]
For a fair figure run it on a quiet machine (other processes' threads compete for the same cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "pipelines"))  # the test suite's tiny BPE tokenizer
sys.path.insert(0, HERE)
from _common import peak_rss_mib  # noqa: E402
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

PROMPT_LEN = 32
BATCH = 16


def _configs(ids: dict) -> dict:
    import transformers as T

    common = dict(hidden_size=512, num_hidden_layers=8, max_position_embeddings=4096, **ids)
    att = dict(num_attention_heads=8, num_key_value_heads=2)
    every4 = ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 2
    return {
        "mamba2": lambda: T.Mamba2Config(**{k: v for k, v in common.items() if k != "max_position_embeddings"},
                                         num_heads=16, head_dim=64, n_groups=1, state_size=64, conv_kernel=4,
                                         expand=2, chunk_size=64),
        "lfm2": lambda: T.Lfm2Config(**common, **att, intermediate_size=1536,
                                     layer_types=["conv", "conv", "full_attention", "conv"] * 2),
        "qwen3_5": lambda: T.Qwen3_5TextConfig(**common, **att, head_dim=64, intermediate_size=1536,
                                               linear_num_key_heads=4, linear_num_value_heads=8,
                                               linear_key_head_dim=64, linear_value_head_dim=64, layer_types=every4),
        "qwen3_next": lambda: T.Qwen3NextConfig(**common, **att, head_dim=64, intermediate_size=1536,
                                                linear_num_key_heads=4, linear_num_value_heads=8,
                                                linear_key_head_dim=64, linear_value_head_dim=64, layer_types=every4,
                                                num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256,
                                                shared_expert_intermediate_size=512),
        "granitemoehybrid": lambda: T.GraniteMoeHybridConfig(
            **common, **att, intermediate_size=256, num_local_experts=8, num_experts_per_tok=2,
            shared_intermediate_size=1024, layer_types=["mamba", "mamba", "mamba", "attention"] * 2,
            mamba_n_heads=16, mamba_n_groups=1, mamba_d_state=64, mamba_d_conv=4, mamba_expand=2,
            mamba_chunk_size=64, position_embedding_type="rope"),
        "falcon_h1": lambda: T.FalconH1Config(**common, **att, intermediate_size=1536, mamba_d_ssm=1024,
                                              mamba_n_heads=16, mamba_n_groups=1, mamba_d_state=64, mamba_d_conv=4,
                                              mamba_chunk_size=64),
    }


def make_checkpoint(family: str, root: str) -> str:
    import torch
    import transformers
    from test_hf_utils import make_bpe_tokenizer

    d = os.path.join(root, family)
    if os.path.exists(os.path.join(d, "config.json")):
        return d
    tok = transformers.AutoTokenizer.from_pretrained(make_bpe_tokenizer())
    ids = dict(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_configs(ids)[family]()).eval().float()
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _prompts(tok, n: int) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(0)
    return [rng.integers(3, len(tok), PROMPT_LEN).tolist() for _ in range(n)]


def run_libremax(path: str, new_tokens: int) -> dict:
    from max.entrypoints.llm import LLM
    from max.interfaces import SamplingParams
    from max.pipelines import PipelineConfig

    import transformers

    llm = LLM(PipelineConfig(model_path=path, max_length=PROMPT_LEN + new_tokens + 64, max_batch_size=BATCH))
    tok = transformers.AutoTokenizer.from_pretrained(path)
    prompts = [tok.decode(p) for p in _prompts(tok, BATCH)]

    def gen(ps: list[str], n: int) -> list[float]:
        params = SamplingParams(top_k=1, max_new_tokens=n, ignore_eos=True)
        ctxs = [llm.make_context(p, params) for p in ps]
        stamps: dict = {c.request_id: [] for c in ctxs}

        def on(o):
            stamps[o.request_id].extend([time.perf_counter()] * len(o.tokens))
        for c in ctxs:
            llm.scheduler.submit(c, on)
        llm.scheduler.run_until_idle()
        assert all(len(v) == n for v in stamps.values()), {k: len(v) for k, v in stamps.items()}
        return stamps[ctxs[0].request_id]

    gen(prompts[:1], 4)  # warm-up
    return _measure(gen, prompts, new_tokens)


def run_transformers(path: str, new_tokens: int) -> dict:
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = _prompts(tok, BATCH)

    class Stamp(transformers.StoppingCriteria):
        def __init__(self) -> None:
            self.t: list[float] = []

        def __call__(self, input_ids, scores, **kw):
            self.t.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    def gen(ps: list, n: int) -> list[float]:
        ids = torch.tensor(ps)
        st = Stamp()
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, pad_token_id=0,
                                 stopping_criteria=transformers.StoppingCriteriaList([st]))
        assert out.shape[1] == ids.shape[1] + n
        return st.t

    gen(prompts[:1], 4)
    return _measure(gen, prompts, new_tokens)


def _measure(gen, prompts: list, n: int) -> dict:
    import statistics

    def step(ts: list[float]) -> float:
        return statistics.median(b - a for a, b in zip(ts, ts[1:]))

    b1 = step(gen(prompts[:1], n + 1))
    b16 = step(gen(prompts, n + 1))
    return {"tpot_ms": 1e3 * b1, "b16_tok_s": BATCH / b16,
            "peak_rss_mb": peak_rss_mib()}


def child(args: argparse.Namespace) -> None:
    import torch

    if args.threads:  # both engines: libremax sizes its pool from LIBREMAX_NUM_THREADS when its session starts
        os.environ["LIBREMAX_NUM_THREADS"] = str(args.threads)
        torch.set_num_threads(args.threads)
    fn = run_libremax if args.engine == "libremax" else run_transformers
    print("RESULT " + json.dumps(fn(args.path, args.new_tokens)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", default="mamba2,lfm2,qwen3_5,qwen3_next,granitemoehybrid,falcon_h1")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per engine, alternating engines; the best of each is kept (a busy host's stalls)")
    ap.add_argument("--root", default=os.path.join(tempfile.gettempdir(), "libremax-bench-hybrid"))
    ap.add_argument("--engine", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.engine:
        return child(args)
    from generate import cpu_isa

    print(f"CPU: {cpu_isa()}; {os.cpu_count()} cores; threads {args.threads or 'default'}; "
          f"{args.new_tokens} decode tokens after a {PROMPT_LEN}-token prompt; float32")
    rows = []
    for fam in args.families.split(","):
        path = make_checkpoint(fam, args.root)
        res: dict = {}
        for _ in range(args.repeat):
            for eng in ("libremax", "transformers"):
                p = subprocess.run([sys.executable, __file__, "--engine", eng, "--path", path, "--new-tokens",
                                    str(args.new_tokens), "--threads", str(args.threads)], capture_output=True,
                                   text=True)
                line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
                if p.returncode or not line:
                    raise SystemExit(f"{fam} {eng} failed:\n{p.stderr[-3000:]}")
                r = json.loads(line[0][7:])
                best = res.setdefault(eng, r)
                best.update(tpot_ms=min(best["tpot_ms"], r["tpot_ms"]), b16_tok_s=max(best["b16_tok_s"], r["b16_tok_s"]),
                            peak_rss_mb=max(best["peak_rss_mb"], r["peak_rss_mb"]))
        lm, hf = res["libremax"], res["transformers"]
        rows.append((fam, f"{lm['tpot_ms']:.2f}", f"{hf['tpot_ms']:.2f}", f"{hf['tpot_ms'] / lm['tpot_ms']:.2f}x",
                     f"{lm['b16_tok_s']:.0f}", f"{hf['b16_tok_s']:.0f}", f"{lm['b16_tok_s'] / hf['b16_tok_s']:.2f}x",
                     f"{lm['peak_rss_mb']:.0f}", f"{hf['peak_rss_mb']:.0f}"))
        print(rows[-1], flush=True)
    from _common import table

    table("decode (8 layers, hidden 512)", rows,
          ("family", "TPOT b1 ms (lmx)", "(hf)", "b1 ratio", "b16 tok/s (lmx)", "(hf)", "b16 ratio", "RSS MB (lmx)",
           "(hf)"))


if __name__ == "__main__":
    main()
