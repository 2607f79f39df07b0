"""Text generation on SmolLM2-135M-Instruct (CPU, float32), side by side with Hugging Face transformers
on the same dequantised weights (and llama.cpp on the same GGUF when llama-cpp-python is installed).

Reports load+compile time, TTFT, TPOT and tokens/s at batch 1 and batch 16, and the bytes of weights
read per decode step against this machine's measured memory bandwidth.

Run: .venv/bin/python bench/generate.py [--new-tokens 64] [--skip-hf]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from _common import table  # noqa: E402

PROMPT = "The capital of France is"
BATCH_PROMPTS = [f"Write one sentence about the number {i}:" for i in range(16)]


def bandwidth_gbs() -> float:
    a = torch.empty(64 * 1024 * 1024)
    a.fill_(1.0)
    for _ in range(2):
        a.sum()
    t = time.perf_counter()
    for _ in range(5):
        a.sum()
    return a.numel() * 4 * 5 / (time.perf_counter() - t) / 1e9


def ours(path: str, n: int) -> dict:
    from max.entrypoints.cli import build_config
    from max.entrypoints.llm import LLM
    from max.interfaces import SamplingParams

    t0 = time.perf_counter()
    llm = LLM(build_config(path, None, "default", 512, 16, None, False))
    load = time.perf_counter() - t0
    params = SamplingParams(top_k=1, max_new_tokens=n, ignore_eos=True)

    def run(prompts: list[str]) -> tuple[float, float, int, float]:
        ctxs = [llm.make_context(p, params) for p in prompts]
        stamps: dict[str, list[float]] = {c.request_id: [] for c in ctxs}

        def cb(out):  # noqa: ANN001
            stamps[out.request_id].extend([time.perf_counter()] * len(out.tokens))

        t = time.perf_counter()
        for c in ctxs:
            llm.scheduler.submit(c, cb)
        llm.scheduler.run_until_idle()
        end = time.perf_counter()
        firsts = [s[0] - t for s in stamps.values()]
        tpots = [(s[-1] - s[0]) / (len(s) - 1) for s in stamps.values()]
        total = sum(len(s) for s in stamps.values())
        return float(np.mean(firsts)), float(np.mean(tpots)), total, total / (end - t)

    run([PROMPT])  # warm-up
    b1 = run([PROMPT])
    b16 = run(BATCH_PROMPTS)
    return {"load": load, "b1": b1, "b16": b16}


def hf(path: str, n: int) -> dict:
    from _hf_ref import hf_model_from_gguf

    from max.pipelines.lib.tokenizer import TextTokenizer

    t0 = time.perf_counter()
    model = hf_model_from_gguf(path)
    tok = TextTokenizer(path)
    load = time.perf_counter() - t0

    def run(prompts: list[str]) -> tuple[float, float, int, float]:
        ids = [tok.encode_sync(p).tolist() for p in prompts]
        width = max(len(i) for i in ids)
        inp = torch.tensor([[0] * (width - len(i)) + i for i in ids])
        mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
        with torch.no_grad():
            t = time.perf_counter()
            model.generate(inp, attention_mask=mask, max_new_tokens=1, min_new_tokens=1, do_sample=False,
                           pad_token_id=0)
            ttft = time.perf_counter() - t
            t = time.perf_counter()
            model.generate(inp, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           pad_token_id=0)
            total_t = time.perf_counter() - t
        tpot = (total_t - ttft) / (n - 1)
        return ttft, tpot, n * len(prompts), n * len(prompts) / total_t

    run([PROMPT])
    return {"load": load, "b1": run([PROMPT]), "b16": run(BATCH_PROMPTS)}


def llama_cpp(path: str, n: int) -> dict | None:
    if importlib.util.find_spec("llama_cpp") is None:
        return None
    from llama_cpp import Llama

    t0 = time.perf_counter()
    llm = Llama(model_path=path, n_ctx=512, n_threads=torch.get_num_threads(), verbose=False)
    load = time.perf_counter() - t0
    t = time.perf_counter()
    llm.create_completion(PROMPT, max_tokens=1, temperature=0.0, top_k=1)
    ttft = time.perf_counter() - t
    t = time.perf_counter()
    llm.create_completion(PROMPT, max_tokens=n, temperature=0.0, top_k=1)
    total = time.perf_counter() - t
    return {"load": load, "b1": (ttft, (total - ttft) / (n - 1), n, n / total), "b16": None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--skip-hf", action="store_true")
    a = ap.parse_args()
    from max.entrypoints.default_model import default_model_path

    path = default_model_path()
    n = a.new_tokens
    results = {"libremax": ours(path, n)}
    if not a.skip_hf:
        results["transformers"] = hf(path, n)
    lc = llama_cpp(path, n)
    if lc is not None:
        results["llama.cpp (Q4_1)"] = lc
    rows = []
    for name, r in results.items():
        b1, b16 = r["b1"], r["b16"]
        rows.append((name, f"{r['load']:.2f} s", f"{b1[0] * 1e3:.0f} ms", f"{b1[1] * 1e3:.1f} ms", f"{b1[3]:.1f}",
                     f"{b16[3]:.1f}" if b16 else "-", f"{b16[3] / b1[3]:.1f}x" if b16 else "-"))
    table(f"SmolLM2-135M-Instruct, {n} new tokens, CPU float32, {torch.get_num_threads()} threads", rows,
          ("engine", "load+compile", "TTFT b1", "TPOT b1", "tok/s b1", "tok/s b16", "b16/b1"))
    if "transformers" in results:
        o, h = results["libremax"]["b1"], results["transformers"]["b1"]
        print(f"\nbatch-1 decode: libremax {h[1] / o[1]:.2f}x transformers (TPOT {o[1] * 1e3:.1f} vs {h[1] * 1e3:.1f} ms)")
        o16, h16 = results["libremax"]["b16"], results["transformers"]["b16"]
        print(f"batch-16 throughput: libremax {o16[3] / h16[3]:.2f}x transformers")
    weights_bytes = 134_515_008 * 4
    bw = bandwidth_gbs()
    tpot = results["libremax"]["b1"][1]
    print(f"weights read per decode step: {weights_bytes / 1e6:.0f} MB (float32); at the TPOT above that is "
          f"{weights_bytes / tpot / 1e9:.1f} GB/s, against {bw:.1f} GB/s measured memory read bandwidth")


if __name__ == "__main__":
    main()
