"""GPU decode benchmark: libremax (bfloat16, CUDA-graph decode steps, greedy on the device) beside
Hugging Face transformers' ``generate`` (eager; and with a static cache + ``torch.compile`` when that
works) on the same card and the same weights.

Reached as ``bench/generate.py --devices gpu`` (or run directly).  The checkpoints are random models of
the real shapes, built where the benchmark runs (no model travels to a GPU machine without network):
``smollm2-135m`` (Llama: 576 wide, 30 layers, 9/3 heads, MLP 1536, vocabulary 49152) and
``qwen2.5-coder-1.5b`` (Qwen2: 1536 wide, 28 layers, 12/2 heads, MLP 8960, vocabulary 151936).
Random weights of a shape cost what the real ones cost per token (same bytes, same kernels; greedy
decoding with ``ignore_eos`` runs every token).  ``tiny`` is a 2-layer model for the CPU dry run.

The ``transformers:compile`` row (static cache, which makes ``generate`` compile the forward with
``torch.compile`` on CUDA) runs batch 1 only, for ``--compile-models``.  ``--budget-s`` bounds the whole
run: work that would start after it is reported as skipped.

Per model and engine, in its own process: TTFT of a ``--prompt-tokens`` prompt, TPOT and tokens/s at
batch 1, aggregate tokens/s at each ``--batches`` size, peak GPU memory (``max_memory_allocated``),
and the HBM roofline share at batch 1: bytes read per token (every weight the step reads once, plus
the KV cache at the mean context) / TPOT, against the card's measured device-to-device copy
bandwidth (bytes read + written per second).  ``--devices cpu`` runs the same code on the CPU (a dry
run of the machinery; its figures mean nothing for a GPU).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # lm_support: the byte-level BPE tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SHAPES = {
    "smollm2-135m": dict(arch="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True,
                         max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5),
    "qwen2.5-coder-1.5b": dict(arch="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                               num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                               tie_word_embeddings=True, max_position_embeddings=32768, rope_theta=1000000.0,
                               rms_norm_eps=1e-6),
    "tiny": dict(arch="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1024, tie_word_embeddings=True, max_position_embeddings=1024,
                 rope_theta=10000.0, rms_norm_eps=1e-5),
}


TARGETS = {"b1_vs_transformers_eager": 2.0, "roofline_share_b1": 0.5, "b64_over_b1": 10.0}
"""Issue 40's acceptance figures (for Qwen2.5-Coder-1.5B in bfloat16 on an H200)."""


# ------------------------------------------------------------------------------------------- checkpoints
def build_checkpoint(name: str, out: str, device: str, dtype: str = "bfloat16", seed: int = 0) -> str:
    """A random model of ``SHAPES[name]`` saved as safetensors (in ``dtype``) with a small byte-level BPE
    tokenizer (its ids are a prefix of the model's vocabulary) into ``out``; built on ``device``."""
    import torch
    import transformers
    from lm_support import make_tokenizer

    shape = dict(SHAPES[name])
    arch = shape.pop("arch")
    tok = make_tokenizer(vocab_size=512)
    cfg_cls = transformers.Qwen2Config if arch == "qwen2" else transformers.LlamaConfig
    cfg = cfg_cls(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                  initializer_range=0.02, **shape)
    torch.manual_seed(seed)
    dev = torch.device("cuda" if device == "gpu" else "cpu")
    with dev:
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    del model
    return out


def weight_bytes_per_token(path: str) -> tuple[int, int]:
    """(bytes every decode step reads of the weights, KV-cache bytes per cached token), from the checkpoint:
    all tensors once, less the input embedding when the output head is a separate matrix (a step reads one
    row of it); a tied embedding is read whole by the output head."""
    from safetensors import safe_open

    cfg = json.load(open(os.path.join(path, "config.json")))
    total, embed = 0, 0
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(path, f), "pt") as sf:
                for k in sf.keys():
                    sl = sf.get_slice(k)
                    n = 1
                    for d in sl.get_shape():
                        n *= d
                    b = n * {"BF16": 2, "F16": 2, "F32": 4}.get(sl.get_dtype(), 2)
                    total += b
                    if k.endswith("embed_tokens.weight"):
                        embed = b
    if not cfg.get("tie_word_embeddings"):
        total -= embed
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    kv = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * 2  # K and V, bfloat16
    return total, kv


def copy_bandwidth(device: str) -> float:
    """Bytes per second a device-to-device copy moves (read + written), best of 5 after a warm-up."""
    import torch

    if device != "gpu":
        x = torch.empty(64 << 20, dtype=torch.uint8)
        y = torch.empty_like(x)
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            y.copy_(x)
            best = min(best, time.perf_counter() - t)
        return 2 * x.numel() / best
    x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    y.copy_(x)
    best = float("inf")
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        y.copy_(x)
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) / 1e3)
    del x, y
    torch.cuda.empty_cache()
    return 2 * (4 << 30) / best


TEXT = os.path.join(HERE, "..", "tests", "fixtures", "text", "teacher_forcing.txt")


def _prompt_ids(path: str, n: int, start: int = 0) -> list[int]:
    """``n`` tokens of the fixed English text from token ``start`` on (the checkpoint's tokenizer):
    a prefix of natural text spells back to the same tokens, so both engines see the same prompt."""
    return _text_ids(path)[start:start + n]


@functools.lru_cache(maxsize=None)
def _text_ids(path: str) -> list[int]:
    import transformers

    return transformers.AutoTokenizer.from_pretrained(path)(open(TEXT).read())["input_ids"]


# ------------------------------------------------------------------------------------------- workers
def _peak_gpu() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"peak_gpu_mib": None}
    return {"peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20}


def run_libremax(path: str, device: str, n: int, prompt_tokens: int, batches: list[int]) -> dict:
    import torch

    from max.entrypoints.llm import LLM
    from max.interfaces import SamplingParams, TextGenerationRequest  # noqa: F401
    from max.pipelines import PipelineConfig

    t0 = time.perf_counter()
    llm = LLM(PipelineConfig(model_path=path, devices=device, quantization_encoding="bfloat16",
                             max_length=prompt_tokens + n + 64, max_batch_size=max(batches),
                             kv_cache_page_size=128))
    load = time.perf_counter() - t0
    pm = llm.pipeline.pipeline_model

    def run(prompts: list[list[int]], max_new: int) -> dict:
        from _common import time_scheduled

        params = SamplingParams(top_k=1, max_new_tokens=max_new, ignore_eos=True)
        ctxs = [llm.make_context(llm.tokenizer.delegate.decode(p), params) for p in prompts]
        res = time_scheduled(llm, ctxs)
        del res["tokens"]
        return res

    short = [_prompt_ids(path, 8)]
    run(short, 4)  # warm-up: compile caches, first captures
    long_prompt = [_prompt_ids(path, prompt_tokens)]
    ttft = min(run(long_prompt, 1)["ttft"] for _ in range(2))
    out = {"engine": "libremax", "load_s": load, "ttft_s": ttft}
    for b in batches:
        prompts = [_prompt_ids(path, 8, 8 * i) for i in range(b)]
        run(prompts, n)  # warm-up: this batch's graphs captured
        r = run(prompts, n)
        out[f"tok_s_b{b}"] = r["tok_s"]
        if b == 1:
            out["tpot_s"] = r["tpot"]
    g = getattr(pm, "decode_graphs", None)
    out["cuda_graphs"] = None if g is None else {"captures": g.captures, "replays": g.replays,
                                                 "keys": [list(k) for k in g.keys], "disabled": g.disabled}
    out["compute_dtype"] = str(pm.compute_dtype)
    out.update(_peak_gpu())
    out["context_mean"] = 8 + n / 2
    del torch
    return out


def run_transformers(path: str, device: str, n: int, prompt_tokens: int, batches: list[int], compiled: bool) -> dict:
    import torch
    import transformers

    dev = torch.device("cuda" if device == "gpu" else "cpu")
    t0 = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(dev).eval()
    load = time.perf_counter() - t0
    kw: dict = {}
    if compiled:  # a static cache on CUDA: generate() compiles the forward itself (generation_config.compile_config)
        kw = dict(cache_implementation="static")
        batches = [1]  # every batch size would compile again (a minute each)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def gen(prompts: list[list[int]], max_new: int) -> float:
        width = max(len(p) for p in prompts)
        inp = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=dev)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=dev)
        with torch.no_grad():
            sync()
            t = time.perf_counter()
            model.generate(inp, attention_mask=mask, max_new_tokens=max_new, min_new_tokens=max_new,
                           do_sample=False, pad_token_id=0, **kw)
            sync()
            return time.perf_counter() - t

    short = [_prompt_ids(path, 8)]
    gen(short, 4)
    ttft = min(gen([_prompt_ids(path, prompt_tokens)], 1) for _ in range(2))
    out = {"engine": "transformers" + (":compile" if compiled else ""), "load_s": load, "ttft_s": ttft}
    for b in batches:
        prompts = [_prompt_ids(path, 8, 8 * i) for i in range(b)]
        gen(prompts, n)
        if b == 1:
            first = min(gen(prompts, 1) for _ in range(2))
            total = gen(prompts, n)
            out["tpot_s"] = (total - first) / (n - 1)
            out["tok_s_b1"] = n / total
        else:
            out[f"tok_s_b{b}"] = b * n / gen(prompts, n)
    out.update(_peak_gpu())
    return out


# ------------------------------------------------------------------------------------------- driver
def worker(args: argparse.Namespace) -> None:
    batches = [int(b) for b in args.batches.split(",")]
    if args.worker == "build":
        res = {"path": build_checkpoint(args.model, args.path, args.devices)}
    elif args.worker == "bandwidth":
        res = {"copy_bytes_per_s": copy_bandwidth(args.devices)}
    elif args.worker == "libremax":
        res = run_libremax(args.path, args.devices, args.new_tokens, args.prompt_tokens, batches)
    else:
        res = run_transformers(args.path, args.devices, args.new_tokens, args.prompt_tokens, batches,
                               compiled=args.worker == "transformers:compile")
    print("RESULT " + json.dumps(res), flush=True)


def spawn(what: str, args: argparse.Namespace, model: str, path: str, timeout: float) -> dict:
    if args.inline:  # the dry run: one process (no per-engine imports), no time limit per engine
        import contextlib
        import io

        buf = io.StringIO()
        t = time.perf_counter()
        sub = argparse.Namespace(**{**vars(args), "worker": what, "model": model, "path": path})
        try:
            with contextlib.redirect_stdout(buf):
                worker(sub)
        except Exception as e:  # noqa: BLE001 - reported in the results like a failed process
            return {"error": f"{type(e).__name__}: {e}"}
        res = json.loads(buf.getvalue().split("RESULT ", 1)[1])
        res["wall_s"] = time.perf_counter() - t
        return res
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", what, "--model", model, "--path", path,
           "--devices", args.devices, "--new-tokens", str(args.new_tokens), "--prompt-tokens",
           str(args.prompt_tokens), "--batches", args.batches]
    print(f"[gpu-bench] {model}: {what} (limit {timeout:.0f} s) ...", file=sys.stderr, flush=True)
    t = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
            res["wall_s"] = time.perf_counter() - t
            return res
    return {"error": (r.stderr or r.stdout)[-2000:]}


def roofline(res: dict, weights: int, kv_per_token: int, bw: float | None) -> None:
    """Adds bytes read per token and the roofline share (at batch 1) to ``res``."""
    tpot = res.get("tpot_s")
    ctx = res.get("context_mean", 8 + 32)
    read = weights + kv_per_token * ctx
    res["bytes_per_token"] = read
    res["roofline_share"] = (read / tpot) / bw if tpot and bw else None


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", default="gpu", choices=["gpu", "cpu"])
    ap.add_argument("--models", default="qwen2.5-coder-1.5b,smollm2-135m", help=f"from {sorted(SHAPES)}")
    ap.add_argument("--engines", default="libremax,transformers,transformers:compile")
    ap.add_argument("--compile-models", default="qwen2.5-coder-1.5b",
                    help="models that get the transformers:compile row (compiling costs a minute or more)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop starting work after this many seconds")
    ap.add_argument("--workdir", default=None, help="where the checkpoints are built (default: a temporary folder)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--inline", action="store_true",
                    help="run every engine in this process (the CPU dry run; peak memory figures then mix)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--path", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return {}
    start = time.perf_counter()
    left = lambda: args.budget_s - (time.perf_counter() - start)  # noqa: E731
    work = args.workdir or tempfile.mkdtemp(prefix="libremax-gpu-bench-")
    report: dict = {"devices": args.devices, "new_tokens": args.new_tokens, "prompt_tokens": args.prompt_tokens,
                    "batches": [int(b) for b in args.batches.split(",")], "weights": "random, real shapes (built "
                    "here in bfloat16)", "models": {}}
    bw = spawn("bandwidth", args, "-", "-", min(60.0, left()))
    report["copy_bytes_per_s"] = bw.get("copy_bytes_per_s")
    if "error" in bw:
        report["copy_bandwidth_error"] = bw["error"]
    engines = [e for e in args.engines.split(",") if e]
    models = [m for m in args.models.split(",") if m]
    for model in models:
        if model not in SHAPES:
            raise SystemExit(f"unknown model {model!r}; choose from {sorted(SHAPES)}")
    paths: dict[str, tuple[str, int, int]] = {}
    # the compiled transformers rows (a minute or more of compiling each) come after every other row
    passes = [[e for e in engines if e != "transformers:compile"], [e for e in engines if e == "transformers:compile"]]
    for todo in passes:
        for model in models:
            entry = report["models"].setdefault(model, {})
            if "error" in entry or not todo:
                continue
            if model not in paths:
                if left() < 20:
                    entry["skipped"] = "time budget spent"
                    continue
                path = os.path.join(work, model)
                built = spawn("build", args, model, path, min(120.0, left()))
                if "error" in built:
                    entry["error"] = built["error"]
                    continue
                weights, kv = weight_bytes_per_token(path)
                entry["weight_bytes"] = weights
                paths[model] = (path, weights, kv)
            path, weights, kv = paths[model]
            for e in todo:
                if e == "transformers:compile" and (args.devices != "gpu"
                                                    or model not in args.compile_models.split(",")):
                    entry[e] = {"skipped": "compiled transformers rows run on the GPU for --compile-models only"}
                    continue
                if left() < 15:
                    entry[e] = {"skipped": "time budget spent"}
                    continue
                res = spawn(e, args, model, path, left())
                if "error" not in res:
                    roofline(res, weights, kv, report["copy_bytes_per_s"])
                entry[e] = res
    for model, entry in report["models"].items():
        lm, hf = entry.get("libremax", {}), entry.get("transformers", {})
        hc = entry.get("transformers:compile", {})
        if lm.get("tpot_s"):
            entry["checks"] = {
                "b1_vs_transformers_eager": hf["tpot_s"] / lm["tpot_s"] if hf.get("tpot_s") else None,
                "b1_vs_transformers_compiled": hc["tpot_s"] / lm["tpot_s"] if hc.get("tpot_s") else None,
                "roofline_share_b1": lm.get("roofline_share"),
                "b64_over_b1": (lm["tok_s_b64"] / lm["tok_s_b1"]) if lm.get("tok_s_b64") and lm.get("tok_s_b1")
                else None,
            }
            c = entry["checks"]
            c["targets_met"] = {k: (c[k] >= t if c[k] is not None else None) for k, t in TARGETS.items()}
    report["elapsed_s"] = time.perf_counter() - start
    if args.workdir is None:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    _print(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    report["failed"] = [m for m, e in report["models"].items()
                        if "error" in e or "error" in e.get("libremax", {})]
    return report


def _print(report: dict) -> None:
    from _common import table

    bw = report.get("copy_bytes_per_s")
    headers = ("engine", "TTFT", "TPOT b1", *[f"tok/s b{b}" for b in report["batches"]], "roofline b1", "peak GPU")
    for model, entry in report["models"].items():
        rows = []
        for e, r in entry.items():
            if not isinstance(r, dict) or e == "checks":
                continue
            if "error" in r or "skipped" in r:
                why = r.get("skipped") or "failed: " + (r["error"].strip().splitlines() or ["?"])[-1][:80]
                rows.append((e, why) + ("",) * (len(headers) - 2))
                continue
            fmt = lambda v, s="{:.1f}": "-" if v is None else s.format(v)  # noqa: E731
            rows.append((e, f"{r['ttft_s'] * 1e3:.1f} ms", f"{r['tpot_s'] * 1e3:.2f} ms",
                         *[fmt(r.get(f"tok_s_b{b}")) for b in report["batches"]],
                         fmt(r.get("roofline_share"), "{:.0%}"), fmt(r.get("peak_gpu_mib"), "{:.0f} MiB")))
        table(f"{model} on {report['devices']} ({report['new_tokens']} new tokens; copy bandwidth "
              f"{(bw or 0) / 1e12:.2f} TB/s)", rows, headers)
        if entry.get("checks"):
            print(f"  checks: {json.dumps(entry['checks'])}")


if __name__ == "__main__":
    sys.exit(1 if main().get("failed") else 0)
