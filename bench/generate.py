"""Text generation side by side: libremax (quantised-resident, bfloat16, float32) beside llama.cpp
(llama-cpp-python, same GGUF file, same thread count) and Hugging Face transformers (same weights
dequantised to float32).

For each engine, in its own process (so peak RSS is its own): load time, TTFT of a 128-token prompt,
TPOT and tokens/s at batch 1 (greedy), aggregate tokens/s at batch 16, peak RSS (overall, and through
the batch-1 part: the work llama.cpp's row does).  Then the accuracy of the quantised path against
the same GGUF dequantised to float32, measured as llama.cpp's perplexity tool does: over 512
teacher-forced positions of a fixed English text, the mean KL divergence of the next-token distributions
and the top-1 agreement.

The native kernels come in one variant per ISA (avx512, avxvnni, avx2, neondot, neon, generic); the
header names this CPU's SIMD features and the variant each libremax row ran (with ``r=``, the largest fraction of
refined activation blocks, and ``t=``, the threshold that picks them; ``--act-refine 1/4,0`` runs the quantised
rows once per value).  ``--isa all``
runs every libremax engine (and the accuracy check) once per variant this CPU can execute, each beside the same
llama.cpp and transformers rows; ``--isa avx2`` forces one (on an AVX-512 host that measures the AVX2
path; compare it with a llama.cpp built without AVX-512:
``CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" pip install llama-cpp-python``;
the features llama.cpp was built with are printed too).

Against the memory-bandwidth limit: every row also gets the bytes of weights it reads per decoded token
(the GGUF file's tensors for the quantised engines and llama.cpp, the same parameters at 2 / 4 bytes for
the bfloat16 / float32 ones; the input embedding table counts one row, or whole when it is also the
output projection), the GB/s its batch-1 decode achieves, and its % of the roofline: the machine's
streaming bandwidth, measured in the same run (``torch.sum`` over 1 GiB with the run's threads, best
of several, before and after the engines).  ``--context N[,N2..]`` measures, per engine, the prefill of an
N-token prompt (tokens/s) and the decode after it (TPOT with the N-token prefix in the cache, reused).

``--devices gpu`` runs the GPU decode benchmark instead (bench/gpu_decode.py: CUDA-graph decode beside
transformers on the same card; ``--devices cpu`` is its dry run).

Run: .venv/bin/python bench/generate.py [--model-path FILE.gguf] [--new-tokens 64] [--threads N]
         [--engines libremax:quantized,libremax:bfloat16,libremax:float32,llama.cpp,transformers]
         [--isa native|all|avx2,avx512,...] [--context 2048]
llama.cpp's column needs `pip install llama-cpp-python` (it compiles from source, a few minutes).
For a fair figure run it on a quiet machine (other processes' threads compete for the same cores;
`chrt -f 20` gives the benchmark priority on a shared Linux box).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _common import peak_rss_mib, time_scheduled  # noqa: E402
TEXT = os.path.join(HERE, "..", "tests", "fixtures", "text", "teacher_forcing.txt")
SHORT_PROMPT = "The capital of France is"
BATCH_PROMPTS = [f"Write one sentence about the number {i}:" for i in range(16)]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def cpu_isa() -> str:
    """This CPU's SIMD features that matter to the kernels (as `grep -o -w 'avx512[a-z_]*|avx2' /proc/cpuinfo`)."""
    from max.engine.native.build import cpu_features

    keep = sorted(f for f in cpu_features() if f.startswith("avx512") or f in ("avx2", "avx_vnni", "fma", "f16c",
                                                                               "asimd", "asimddp", "i8mm"))
    return " ".join(keep) or "no SIMD features reported"


def peak_rss_mb() -> float:
    return peak_rss_mib()


def fixed_text() -> str:
    with open(TEXT) as f:
        return f.read()


def prompt_of(tokenizer_encode, tokenizer_decode, n: int, skip: int = 0) -> str:
    """``n`` tokens of the fixed text (repeated as often as needed) from its token ``skip`` on, as text.  Prompts
    that time a prefill start at different ``skip``: a prompt that extends an earlier one would find its first
    KV pages in libremax's prefix cache (on by default, as in MAX) and skip their prefill."""
    ids = list(tokenizer_encode(fixed_text()))
    ids = ids[skip % max(len(ids), 1):] + ids[:skip % max(len(ids), 1)]
    ids = (ids * (n // max(len(ids), 1) + 1))[:n]
    return tokenizer_decode(ids)


def weight_bytes(path: str) -> dict:
    """What one decoded token reads of the weights of the GGUF file ``path``: ``quant`` bytes as stored
    (every tensor but the input embedding table, of which one row; the whole table when the file has no
    ``output.weight``, i.e. it is also the output projection) and ``params``, the same count of values."""
    import gguf

    from max.graph.weights.gguf_meta import read_gguf_metadata

    meta = read_gguf_metadata(path)
    quant = params = 0
    tied = not any(t.name == "output.weight" for t in meta.tensors)
    for t in meta.tensors:
        n_el = 1
        for d in t.shape:
            n_el *= int(d)
        epb, bs = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(t.ggml_type)]
        nbytes = n_el // epb * bs
        if t.name == "token_embd.weight" and not tied:
            rows = int(t.shape[0]) if len(t.shape) > 1 else 1
            nbytes, n_el = nbytes // rows, n_el // rows
        quant += nbytes
        params += n_el
    return {"quant": quant, "params": params}


def engine_weight_bytes(engine: str, wb: dict) -> int:
    """Weight bytes per decoded token of ``engine`` (see :func:`weight_bytes`)."""
    if engine in ("libremax:quantized", "llama.cpp"):
        return wb["quant"]
    return wb["params"] * (2 if engine in ("libremax:bfloat16", "libremax:float16") else 4)


def stream_bandwidth(threads: int) -> float:
    """The machine's streaming read bandwidth (GB/s): ``torch.sum`` over 1 GiB of float32 with ``threads``
    threads, best of 7 (after a warm-up pass that also faults the pages in)."""
    import torch

    torch.set_num_threads(threads)
    x = torch.ones(1 << 28, dtype=torch.float32)
    x.sum()
    best = float("inf")
    for _ in range(7):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best / 1e9


# ------------------------------------------------------------------------------------------- workers
def run_libremax(path: str, encoding: str, n: int, prompt_tokens: int, threads: int,
                 contexts: tuple[int, ...] = ()) -> dict:
    from max.entrypoints.llm import LLM
    from max.interfaces import SamplingParams
    from max.pipelines import PipelineConfig

    t0 = time.perf_counter()
    llm = LLM(PipelineConfig(model_path=path, quantization_encoding=None if encoding == "quantized" else encoding,
                             max_length=max([1024, *(c + n + 16 for c in contexts)]), max_batch_size=16,
                             num_threads=threads))
    load = time.perf_counter() - t0
    tok = llm.tokenizer
    enc, dec = (lambda s: tok.encode_sync(s).tolist()), (lambda ids: tok.delegate.decode(ids))
    long_prompts = [prompt_of(enc, dec, prompt_tokens, skip=i) for i in range(3)]  # distinct: no prefix reuse

    def run(prompts: list[str], max_new: int) -> dict:
        params = SamplingParams(top_k=1, max_new_tokens=max_new, ignore_eos=True)
        ctxs = [llm.make_context(p, params) for p in prompts]
        res = time_scheduled(llm, ctxs)
        res["prompt_tokens"] = len(ctxs[0].all_tokens) - res.pop("tokens") // len(ctxs)
        return res

    run([SHORT_PROMPT], 8)  # warm-up
    ttft = min(run([p], 1)["ttft"] for p in long_prompts)
    b1 = run([SHORT_PROMPT], n)
    rss_b1 = peak_rss_mb()  # the same work as llama.cpp's row (load, TTFT, batch 1): no batch-16 KV cache yet
    b16 = run(BATCH_PROMPTS, n)
    text = llm.generate([SHORT_PROMPT], max_new_tokens=16)[0]
    ctx = {}
    for j, c in enumerate(contexts):  # one request: its TTFT is the prefill of c tokens, its TPOT the decode after
        r = run([prompt_of(enc, dec, c, skip=3 + j)], n)
        ctx[str(c)] = {"prefill_s": r["ttft"], "tpot_s": r["tpot"], "prompt_tokens": r["prompt_tokens"]}
    from max.engine import native

    return {"load_s": load, "ttft_s": ttft, "tpot_s": b1["tpot"], "tok_s_b1": 1.0 / b1["tpot"],
            "tok_s_b16": b16["tok_s"], "peak_rss_mb": peak_rss_mb(), "peak_rss_b1_mb": rss_b1, "sample": text,
            "isa": f"{native.isa()} r={native.act_refine()} t={native.act_refine_threshold():g}", "context": ctx}


def run_llama_cpp(path: str, n: int, prompt_tokens: int, threads: int, contexts: tuple[int, ...] = ()) -> dict:
    from llama_cpp import Llama

    t0 = time.perf_counter()
    llm = Llama(model_path=path, n_ctx=max([1024, *(c + n + 16 for c in contexts)]), n_threads=threads, n_threads_batch=threads, n_batch=512,
                verbose=False)
    load = time.perf_counter() - t0
    enc = lambda s: llm.tokenize(s.encode(), add_bos=False)  # noqa: E731
    dec = lambda ids: llm.detokenize(ids).decode("utf-8", "replace")  # noqa: E731
    long_prompts = [prompt_of(enc, dec, prompt_tokens, skip=i) for i in range(3)]  # the prompts libremax times

    def complete(prompt: str, max_tokens: int) -> float:
        llm.reset()  # no prefix reuse between calls
        t = time.perf_counter()
        llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0, top_k=1)
        return time.perf_counter() - t

    complete(SHORT_PROMPT, 8)
    ttft = min(complete(p, 1) for p in long_prompts)
    first = min(complete(SHORT_PROMPT, 1) for _ in range(3))
    total = complete(SHORT_PROMPT, n)
    tpot = (total - first) / (n - 1)
    text = llm.create_completion(SHORT_PROMPT, max_tokens=16, temperature=0.0, top_k=1)["choices"][0]["text"]
    ctx = {}
    for j, c in enumerate(contexts):
        p = prompt_of(enc, dec, c, skip=3 + j)
        prefill = complete(p, 1)  # the prefill of c tokens (and the first new one)
        t = time.perf_counter()  # the same prompt again, without reset: its c - 1 first tokens are reused
        llm.create_completion(p, max_tokens=n, temperature=0.0, top_k=1)
        ctx_tpot = (time.perf_counter() - t) / n  # n single-token steps after the c-token prefix
        ctx[str(c)] = {"prefill_s": prefill, "tpot_s": ctx_tpot,
                       "prompt_tokens": len(llm.tokenize(p.encode(), add_bos=False))}
    try:
        import llama_cpp

        info = llama_cpp.llama_print_system_info().decode()
        feats = sorted({f.split("=")[0].strip().lower() for f in info.replace("|", ";").split(";")
                        if "=" in f and f.split("=")[1].strip() == "1"
                        and f.split("=")[0].strip().lower().startswith(("avx", "f16c", "fma", "neon", "dotprod"))})
        isa = "+".join(feats) or "?"
    except Exception:  # noqa: BLE001 - older bindings
        isa = "?"
    return {"load_s": load, "ttft_s": ttft, "tpot_s": tpot, "tok_s_b1": 1.0 / tpot, "tok_s_b16": None,
            "peak_rss_mb": peak_rss_mb(), "sample": text, "isa": isa, "context": ctx}


def run_transformers(path: str, n: int, prompt_tokens: int, threads: int) -> dict:
    import torch

    sys.path.insert(0, HERE)
    from _hf_ref import hf_reference_model

    from max.pipelines.lib.tokenizer import TextTokenizer

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    model = hf_reference_model(path)
    tok = TextTokenizer(path)
    load = time.perf_counter() - t0
    long_prompt = prompt_of(lambda s: tok.encode_sync(s).tolist(), lambda ids: tok.delegate.decode(ids),
                            prompt_tokens)

    def gen(prompts: list[str], max_new: int) -> float:
        ids = [tok.encode_sync(p).tolist() for p in prompts]
        width = max(len(i) for i in ids)
        inp = torch.tensor([[0] * (width - len(i)) + i for i in ids])
        mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
        with torch.no_grad():
            t = time.perf_counter()
            model.generate(inp, attention_mask=mask, max_new_tokens=max_new, min_new_tokens=max_new,
                           do_sample=False, pad_token_id=0)
            return time.perf_counter() - t

    gen([SHORT_PROMPT], 4)
    ttft = min(gen([long_prompt], 1) for _ in range(2))
    first = gen([SHORT_PROMPT], 1)
    tpot = (gen([SHORT_PROMPT], n) - first) / (n - 1)
    b16 = 16 * n / gen(BATCH_PROMPTS, n)
    return {"load_s": load, "ttft_s": ttft, "tpot_s": tpot, "tok_s_b1": 1.0 / tpot, "tok_s_b16": b16,
            "peak_rss_mb": peak_rss_mb(), "sample": ""}


def run_accuracy(path: str, positions: int, threads: int) -> dict:
    """KL(float32 || quantised) and top-1 agreement over ``positions`` teacher-forced tokens."""
    from max.pipelines.lib.teacher_forcing import teacher_forced_logits, compare_distributions

    from max.pipelines.lib.tokenizer import TextTokenizer

    tok = TextTokenizer(path)
    ids = tok.encode_sync(fixed_text()).tolist()[: positions + 1]
    ref = teacher_forced_logits(path, ids, "float32", num_threads=threads)
    got = teacher_forced_logits(path, ids, None, num_threads=threads)
    return compare_distributions(ref[:positions], got[:positions])  # the last row predicts past the text


# ------------------------------------------------------------------------------------------- driver
def worker(args: argparse.Namespace) -> None:
    engine = args.worker
    contexts = parse_contexts(args.context)
    if engine.startswith("libremax:"):
        res = run_libremax(args.model_path, engine.split(":", 1)[1], args.new_tokens, args.prompt_tokens,
                           args.threads, contexts)
    elif engine == "llama.cpp":
        res = run_llama_cpp(args.model_path, args.new_tokens, args.prompt_tokens, args.threads, contexts)
    elif engine == "bandwidth":
        res = {"gb_s": stream_bandwidth(args.threads)}
    elif engine == "transformers":
        res = run_transformers(args.model_path, args.new_tokens, args.prompt_tokens, args.threads)
    elif engine == "accuracy":
        res = run_accuracy(args.model_path, args.kl_positions, args.threads)
    else:
        raise SystemExit(f"unknown engine {engine!r}")
    print("RESULT " + json.dumps(res))


def parse_contexts(value: str | None) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in (value or "").split(",") if v.strip())
    except ValueError:
        out = (-1,)
    if any(c < 1 for c in out):
        raise SystemExit(f"--context {value!r}: give context lengths in tokens, e.g. 2048 or 512,4096")
    return out


def best_of(a: dict, b: dict | None) -> dict:
    """The better figure of two runs of one engine for each timing (peak RSS: the larger)."""
    if b is None:
        return a
    out = dict(a)
    for k in ("load_s", "ttft_s", "tpot_s"):
        if a.get(k) is not None and b.get(k) is not None:
            out[k] = min(a[k], b[k])
    for k in ("tok_s_b1", "tok_s_b16"):
        if a.get(k) is not None and b.get(k) is not None:
            out[k] = max(a[k], b[k])
    for k in ("peak_rss_mb", "peak_rss_b1_mb"):
        if a.get(k) is not None and b.get(k) is not None:
            out[k] = max(a[k], b[k])
    ctx = {c: dict(v) for c, v in (a.get("context") or {}).items()}
    for c, v in (b.get("context") or {}).items():
        for k in ("prefill_s", "tpot_s"):
            if c in ctx and ctx[c].get(k) is not None and v.get(k) is not None:
                ctx[c][k] = min(ctx[c][k], v[k])
    out["context"] = ctx
    return out


def spawn(engine: str, args: argparse.Namespace, isa: str | None = None, refine: str | None = None) -> dict | None:
    """Run one engine in its own process; ``isa`` forces the native kernel variant there, ``refine`` the
    fraction of refined activation blocks (LIBREMAX_ACT_REFINE)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", engine, "--model-path", args.model_path,
           "--new-tokens", str(args.new_tokens), "--prompt-tokens", str(args.prompt_tokens),
           "--threads", str(args.threads), "--kl-positions", str(args.kl_positions), "--context", args.context or ""]
    env = dict(os.environ)
    if isa:
        env["LIBREMAX_NATIVE_ISA"] = isa
    if refine is not None:
        env["LIBREMAX_ACT_REFINE"] = refine
    print(f"[bench] {engine}{' @ ' + isa if isa else ''}{' r=' + refine if refine is not None else ''} ...",
          file=sys.stderr, flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    print(f"[bench] {engine} failed:\n{r.stderr[-3000:]}", file=sys.stderr)
    return None


def main() -> None:
    if any(a == "--devices" or a.startswith("--devices=") for a in sys.argv[1:]):  # GPU decode: bench/gpu_decode.py
        import gpu_decode

        sys.exit(1 if gpu_decode.main().get("failed") else 0)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default=None, help="a GGUF file (default: the bundled SmolLM2-135M Q4_1)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=128, help="prompt length for TTFT")
    ap.add_argument("--threads", type=int, default=None, help="threads for every engine (default: physical cores)")
    ap.add_argument("--engines", default="libremax:quantized,libremax:bfloat16,libremax:float32,llama.cpp,transformers")
    ap.add_argument("--kl-positions", type=int, default=512)
    ap.add_argument("--context", default=None,
                    help="context length(s) in tokens, e.g. 2048 or 512,4096: per engine, the prefill of a prompt of "
                         "that many tokens and the decode after it (the prefix reused)")
    ap.add_argument("--no-accuracy", action="store_true")
    ap.add_argument("--isa", default="native",
                    help="native kernel variant(s) for the libremax rows: 'native' (the best this CPU runs), "
                         "'all' (every variant it can run), or a comma list (avx512,avxvnni,avx2,neondot,neon,generic)")
    ap.add_argument("--act-refine", default=None,
                    help="comma list of LIBREMAX_ACT_REFINE values for the quantised rows and the accuracy check "
                         "(e.g. '1/4,0': the default refinement beside 8-bit activation codes alone, as llama.cpp); "
                         "default: the environment's or the library's default")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds over every engine (interleaved); each timing is the best of them")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.model_path is None:
        from max.entrypoints.default_model import default_model_path

        args.model_path = default_model_path()
    if args.threads is None:
        from max.engine.threads import physical_cores

        args.threads = physical_cores()
    if args.worker:
        worker(args)
        return
    from max.engine.native import build

    runnable = build.runnable()
    if args.isa == "all":
        isas = runnable
    elif args.isa in ("native", "auto"):
        isas = [build.choose("native")]
    else:
        isas = [v.strip() for v in args.isa.split(",") if v.strip()]
        for v in isas:
            build.choose(v)  # a clear error for a variant this CPU cannot run
    engines = [e for e in args.engines.split(",") if e]
    if "llama.cpp" in engines and importlib.util.find_spec("llama_cpp") is None:
        print("[bench] llama-cpp-python is not installed: no llama.cpp column (pip install llama-cpp-python)",
              file=sys.stderr)
        engines.remove("llama.cpp")
    refines: list[str | None] = [None] if args.act_refine is None else [r.strip() for r in args.act_refine.split(",")]
    if args.act_refine is not None:
        from max.engine.native import _parse_act_refine

        for r in refines:
            _parse_act_refine(r)  # a clear error before anything runs
    contexts = parse_contexts(args.context)
    wb = weight_bytes(args.model_path)
    bw0 = spawn("bandwidth", args)  # the machine's streaming bandwidth, before and after the engines
    runs: list[tuple[str, str, str | None, str | None]] = []  # (row, engine, isa, refine)
    for e in engines:
        if e == "libremax:quantized":
            runs += [(f"{e} @{v}" + (f" r={r}" if r is not None else ""), e, v, r) for v in isas for r in refines]
        elif e.startswith("libremax:"):
            runs += [(f"{e} @{v}", e, v, None) for v in isas]
        else:
            runs.append((e, e, None, None))
    results: dict[str, dict | None] = {}
    for rnd in range(args.repeat):  # rounds interleave the engines, so a slow spell of a shared host hits them all
        for row, e, v, r in runs:
            res = spawn(e, args, v, r)
            results[row] = res if rnd == 0 or results.get(row) is None else best_of(results[row], res)
    bw1 = spawn("bandwidth", args)
    bws = [b["gb_s"] for b in (bw0, bw1) if b]
    bw = max(bws) if bws else None
    accs = {} if args.no_accuracy else {(v, r): spawn("accuracy", args, v, r) for v in isas for r in refines}
    sys.path.insert(0, HERE)
    from _common import table

    rows = []
    for name, r in results.items():
        if r is None:
            rows.append((name, "failed", "", "", "", "", "", "", ""))
            continue
        rows.append((name, r.get("isa", "-"), f"{r['load_s']:.2f} s", f"{r['ttft_s'] * 1e3:.0f} ms",
                     f"{r['tpot_s'] * 1e3:.2f} ms", f"{r['tok_s_b1']:.1f}",
                     f"{r['tok_s_b16']:.1f}" if r["tok_s_b16"] else "-", f"{r['peak_rss_mb']:.0f} MB",
                     f"{r.get('peak_rss_b1_mb', r['peak_rss_mb']):.0f} MB"))
    table(f"{os.path.basename(args.model_path)}: {args.new_tokens} new tokens, TTFT of a {args.prompt_tokens}-token "
          f"prompt, {args.threads} threads; CPU: {cpu_isa()}", rows,
          ("engine", "kernels", "load", "TTFT", "TPOT b1", "tok/s b1", "tok/s b16", "peak RSS",
           "RSS to b1"))
    lc = results.get("llama.cpp")
    hf = results.get("transformers")
    engine_of = {row: e for row, e, _, _ in runs}
    rows = []
    for name, r in results.items():
        if r is None or not r.get("tpot_s"):
            continue
        nb = engine_weight_bytes(engine_of[name], wb)
        gbs = nb / r["tpot_s"] / 1e9
        rows.append((name, r.get("isa", "-"), f"{nb / 1e6:.0f} MB", f"{r['tpot_s'] * 1e3:.2f} ms", f"{gbs:.1f}",
                     f"{gbs / bw * 100:.0f} %" if bw else "-",
                     f"{lc['tpot_s'] / r['tpot_s']:.2f}x" if lc and name != "llama.cpp" else "-"))
        r["weight_bytes_per_token"], r["decode_gb_s"] = nb, gbs
        r["roofline_pct"] = gbs / bw * 100 if bw else None
    table(f"against the memory-bandwidth limit: streaming bandwidth {bw:.1f} GB/s "
          f"(torch.sum over 1 GiB, {args.threads} threads; {', '.join(f'{b:.1f}' for b in bws)} before / after)"
          if bw else "against the memory-bandwidth limit (streaming bandwidth not measured)", rows,
          ("engine", "kernels", "weights / token", "TPOT b1", "GB/s", "% of roofline", "decode vs llama.cpp"))
    for c in contexts:
        rows = []
        lcc = (lc or {}).get("context", {}).get(str(c))
        for name, r in results.items():
            v = (r or {}).get("context", {}).get(str(c))
            if not v or not v.get("tpot_s"):
                continue
            nb = engine_weight_bytes(engine_of[name], wb)
            rows.append((name, r.get("isa", "-"), v["prompt_tokens"], f"{v['prefill_s']:.2f} s",
                         f"{v['prompt_tokens'] / v['prefill_s']:.1f}",
                         f"{lcc['prefill_s'] / v['prefill_s']:.2f}x" if lcc and name != "llama.cpp" else "-",
                         f"{v['tpot_s'] * 1e3:.2f} ms", f"{nb / v['tpot_s'] / 1e9:.1f}",
                         f"{nb / v['tpot_s'] / 1e9 / bw * 100:.0f} %" if bw else "-",
                         f"{lcc['tpot_s'] / v['tpot_s']:.2f}x" if lcc and name != "llama.cpp" else "-"))
        table(f"after a {c}-token context: prefill of the prompt, then {args.new_tokens} decoded tokens with it "
              "in the cache (ratios: llama.cpp's time / this row's)", rows,
              ("engine", "kernels", "prompt tokens", "prefill", "prefill tok/s", "prefill vs llama.cpp",
               "TPOT", "GB/s (weights)", "% of roofline", "decode vs llama.cpp"))
    for v, r in [(v, r) for v in isas for r in refines]:
        q = results.get(f"libremax:quantized @{v}" + (f" r={r}" if r is not None else ""))
        f32 = results.get(f"libremax:float32 @{v}") if r == refines[0] else None
        tag = v + (f" r={r}" if r is not None else "")
        if q and lc:
            print(f"\n[{tag}] quantised vs llama.cpp ({lc.get('isa', '?')}): decode {q['tok_s_b1'] / lc['tok_s_b1']:.2f}x "
                  f"tok/s (target >= 1.0), TTFT {q['ttft_s'] / lc['ttft_s']:.2f}x (target <= 1.0), peak RSS "
                  f"{q['peak_rss_mb'] / lc['peak_rss_mb']:.2f}x, through the same work (load, TTFT, batch 1) "
                  f"{q['peak_rss_b1_mb'] / lc['peak_rss_mb']:.2f}x (target <= 1.5); batch-16 aggregate "
                  f"{q['tok_s_b16'] / lc['tok_s_b1']:.1f}x llama.cpp's batch 1 (target >= 4)")
        if f32 and hf:
            print(f"[{tag}] float32 vs transformers: batch 1 {f32['tok_s_b1'] / hf['tok_s_b1']:.2f}x (target >= 1.6), "
                  f"batch 16 {f32['tok_s_b16'] / hf['tok_s_b16']:.2f}x (target >= 1.2)")
        acc = accs.get((v, r))
        if acc:
            print(f"[{tag}] accuracy (quantised vs float32, {acc['positions']} teacher-forced positions): mean KL "
                  f"{acc['mean_kl']:.5f} (target <= 0.001 refined; llama.cpp's codes: 0.0028), top-1 agreement "
                  f"{acc['top1'] * 100:.2f}% (target >= 97)")
    for name, r in results.items():
        if r and r.get("sample"):
            print(f"  {name}: {SHORT_PROMPT!r} -> {r['sample'][:70]!r}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "accuracy": {f"{v} r={r}": a for (v, r), a in accs.items()}, "model": args.model_path, "threads": args.threads,
                       "cpu": cpu_isa(), "bandwidth_gb_s": bw, "bandwidth_samples_gb_s": bws,
                       "weight_bytes": wb}, f, indent=1)


if __name__ == "__main__":
    main()
