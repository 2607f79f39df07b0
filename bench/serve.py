"""Serving throughput of ``max serve`` at concurrency 1, 4 and 16, as ratios to concurrency 1.

Starts ``max serve`` (a subprocess, 127.0.0.1, free port) on the bundled SmolLM2-135M-Instruct
(or ``--model-path``), waits for /health, runs the ``max benchmark`` client at each concurrency
(synthetic prompts, streaming chat, ``ignore_eos`` so every request generates exactly
``--output-len`` tokens) and prints request throughput, output tokens/s, TTFT and TPOT
percentiles, and the throughput ratio to concurrency 1 (what continuous batching buys).

Then (``--features``, in-process on the same model) the serving features: JSON-schema-constrained vs
free tokens/s at batch 1 and 16, speculative decoding speed-up and acceptance at batch 1, and a batch of
16 over 4 LoRA adapters vs no adapter (see ``bench/_serve_features.py``), with peak RSS.

``--replicas 1,2``: instead, the same load against ``max serve`` alone and against ``max serve
--replicas R`` (Ray Serve, a local cluster) for each R, with the peak RSS of each server's whole
process tree (Ray's daemons and replicas included), as ratios to the plain server.  On a machine with
few cores the replicas share them (each gets ``(cores - 1) / R`` threads, at least 1), so more replicas cannot add
throughput there; the table then shows Ray's routing overhead.

``--peer llama-server[=PATH]``: the same load, one server at a time (never both at once), against
``max serve`` and llama.cpp's ``llama-server`` on the same GGUF file (``-np <max concurrency> -t <threads>``,
threads = what ``max serve`` uses, passed to both as ``--num-threads``), and one table per concurrency with
both rows, the ratio libremax / llama-server, the output tokens each request reported and each server's
peak RSS.  Without ``=PATH`` the binary is looked up where ``scripts/build_llama_server.sh`` puts it, then on
``PATH``; where there is none (or the model is not a GGUF file, or it fails to start) the llama-server rows
are skipped with the reason printed and the ``max serve`` rows still come.

Run: .venv/bin/python bench/serve.py [--model-path PATH] [--devices cpu] [--output-len 32] [--json out.json]
     [--features structured speculative lora] [--skip-features] [--skip-throughput] [--replicas 1,2]
     [--peer llama-server[=PATH]]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _llama_server  # noqa: E402
from _common import start_max_serve, stop_process, table  # noqa: E402


def start_server(args: argparse.Namespace, num_threads: int | None = None) -> tuple[subprocess.Popen, str, float]:
    cmd = ["--devices", args.devices, "--max-batch-size", str(max(args.concurrency)), "--log-level", "warning"]
    if args.model_path:
        cmd += ["--model-path", args.model_path]
    if args.max_length:
        cmd += ["--max-length", str(args.max_length)]
    if num_threads:
        cmd += ["--num-threads", str(num_threads)]
    return start_max_serve(cmd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default=None,
                    help="default: the bundled SmolLM2-135M-Instruct; 'tiny' (with --replicas): a tiny random Llama")
    ap.add_argument("--devices", default="default")
    ap.add_argument("--max-length", type=int, default=1024)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--requests-per-slot", type=int, default=3,
                    help="requests sent = max(8, this x concurrency)")
    ap.add_argument("--prompt-len", type=int, default=32, help="words per synthetic prompt")
    ap.add_argument("--output-len", type=int, default=32, help="tokens generated per request")
    ap.add_argument("--json", default=None, help="write all results as JSON here")
    ap.add_argument("--features", nargs="*", default=["structured", "speculative", "lora"],
                    choices=["structured", "speculative", "lora"], help="serving-feature tables to print")
    ap.add_argument("--skip-features", action="store_true", help="no feature tables (only the serving load)")
    ap.add_argument("--skip-throughput", action="store_true", help="only the feature tables")
    ap.add_argument("--peer", default=None, metavar="llama-server[=PATH]",
                    help="also run the same load against llama.cpp's llama-server on the same GGUF model and print "
                         "the ratio (default: off)")
    ap.add_argument("--rounds", type=int, default=3, help="--replicas: runs per concurrency, the best kept")
    ap.add_argument("--num-threads", type=int, default=None,
                    help="--replicas: torch threads of every server and replica (the same for all, so only the "
                         "serving stack differs; default 1); --peer: threads of both servers (default: what "
                         "max serve uses, the physical cores or LIBREMAX_NUM_THREADS)")
    ap.add_argument("--replicas", default=None,
                    help="comma-separated Ray Serve replica counts (e.g. 1,2) to compare with max serve alone")
    args = ap.parse_args()
    if args.replicas:
        args.num_threads = args.num_threads or 1
        replicas(args)
        return
    if args.peer is not None:
        try:
            _llama_server.parse_peer(args.peer)
        except ValueError as e:
            ap.error(str(e))
    if not args.skip_throughput:
        if args.peer is not None:
            versus_peer(args)
        else:
            throughput(args)
    if not args.skip_features:
        features(args)


def features(args: argparse.Namespace) -> None:
    import resource

    import _serve_features as sf

    from max.entrypoints.default_model import default_model_path

    path = args.model_path or default_model_path()
    name = os.path.basename(path)
    if "structured" in args.features:
        table(f"structured output on {name} (greedy; free: {sf.N_TOKENS} tokens; constrained: 20 digits as a "
              "JSON array, llguidance masks)", sf.structured(path),
              ("batch", "free tok/s", "constrained tok/s", "constrained / free", "extra time per token"))
    if "speculative" in args.features:
        tiny = _tiny_pair()
        table(f"speculative decoding, batch 1, greedy, {sf.N_TOKENS} tokens (output identical to no draft)",
              sf.speculative(path, tiny), ("target / draft", "k", "no draft tok/s", "with draft tok/s", "speed-up",
                                           "acceptance", "tokens per target step"))
    if "lora" in args.features:
        table(f"LoRA on {name}: batch 16, greedy, {sf.N_TOKENS} tokens each", sf.lora(path),
              ("model / requests", "tok/s", "vs no LoRA"))
    print(f"\npeak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


def _tiny_pair() -> tuple[str, str]:
    import tempfile

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from lm_support import make_tiny_llama, make_tokenizer

    tok = make_tokenizer()
    root = tempfile.mkdtemp()
    return (make_tiny_llama(os.path.join(root, "target"), tokenizer=tok),
            make_tiny_llama(os.path.join(root, "draft"), tokenizer=tok, seed=5, num_hidden_layers=1))


def _tree_rss_mib(pid: int) -> float:
    """Resident MiB of ``pid`` and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def replicas(args: argparse.Namespace) -> None:
    """max serve alone vs --replicas R on Ray Serve, same load; peak RSS of each server's process tree."""
    import tempfile
    import threading
    import time

    from max.serve.benchmark import run_benchmark

    counts = [int(x) for x in args.replicas.split(",") if x.strip()]
    if args.model_path == "tiny":  # the tests' tiny random Llama: the serving stack's own costs dominate
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
        from lm_support import make_tiny_llama

        args.model_path = make_tiny_llama(tempfile.mkdtemp(prefix="libremax-tiny-"))
    rows, base = [], None
    for r in [0, *counts]:
        extra = ["--replicas", str(r)] if r else []
        log = tempfile.NamedTemporaryFile(prefix="max-serve-", suffix=".log", delete=False).name
        cmd = ["--devices", args.devices, "--max-batch-size", str(max(args.concurrency)), "--log-level", "warning",
               "--max-length", str(args.max_length), "--num-threads", str(args.num_threads), *extra]
        if args.model_path:
            cmd += ["--model-path", args.model_path]
        proc, url, t_up = start_max_serve(cmd, stderr_file=log)
        peak = [0.0]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], _tree_rss_mib(proc.pid))
                time.sleep(0.5)

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        try:
            run_benchmark(url, num_prompts=4, concurrency=4, prompt_len=args.prompt_len, output_len=4)  # warm-up
            for c in args.concurrency:
                n = max(8, args.requests_per_slot * c)
                # best of --rounds runs: on a shared machine other work only ever lowers throughput
                res = max((run_benchmark(url, num_prompts=n, concurrency=c, prompt_len=args.prompt_len,
                                         output_len=args.output_len) for _ in range(args.rounds)),
                          key=lambda x: x["output_throughput"])
                if res["failed"]:
                    print(f"replicas {r} concurrency {c}: {res['failed']} failed: {res['errors']}", file=sys.stderr)
                key = (c,)
                if r == 0:
                    base = base or {}
                    base[key] = res["output_throughput"]
                what = f"{r} replica(s), Ray Serve" if r else "max serve alone"
                rows.append((what, c, f"{t_up:.1f}", f"{res['request_throughput']:.2f}",
                             f"{res['output_throughput']:.1f}", f"{res['output_throughput'] / base[key]:.2f}x",
                             f"{res['ttft_ms']['p50']:.0f} / {res['ttft_ms']['p90']:.0f}",
                             f"{res['tpot_ms']['p50']:.1f} / {res['tpot_ms']['p90']:.1f}", None))
                print(f"{what}, concurrency {c}: {res['output_throughput']:.1f} tok/s", file=sys.stderr)
        finally:
            stop.set()
            th.join()
            stop_process(proc, timeout=60)
        rows = [row[:-1] + (f"{peak[0]:.0f}",) if row[-1] is None else row for row in rows]
    table(f"max serve alone vs Ray Serve replicas ({args.devices}, {os.cpu_count()} cores; prompt "
          f"{args.prompt_len} words, {args.output_len} output tokens, streaming chat; {args.num_threads} thread(s) "
          f"per server/replica; best of {args.rounds} runs)", rows,
          ("server", "concurrency", "up in s", "req/s", "out tok/s", "vs alone", "TTFT p50/p90 ms",
           "TPOT p50/p90 ms", "peak RSS MiB (tree)"))


class _PeakRSS:
    """Samples the resident MiB of a server's process tree every 0.25 s while in the ``with`` block; ``peak``
    also takes the main process's own high-water mark (``VmHWM``) at the end, so a spike between samples counts."""

    def __init__(self, pid: int) -> None:
        import threading

        self.pid, self.peak = pid, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _tree_rss_mib(self.pid))
            self._stop.wait(0.25)

    def __enter__(self) -> "_PeakRSS":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        try:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        self.peak = max(self.peak, int(line.split()[1]) / 1024)
        except OSError:
            pass


def _drive(url: str, args: argparse.Namespace, who: str) -> dict[int, dict]:
    """The load of every ``--concurrency`` against one server (after a short warm-up): ``{c: result}``."""
    from max.serve.benchmark import run_benchmark

    run_benchmark(url, num_prompts=2, concurrency=2, prompt_len=args.prompt_len, output_len=4)  # warm-up
    out = {}
    for c in args.concurrency:
        n = max(8, args.requests_per_slot * c)
        res = run_benchmark(url, num_prompts=n, concurrency=c, prompt_len=args.prompt_len, output_len=args.output_len)
        if res["failed"]:
            print(f"{who}, concurrency {c}: {res['failed']} failed: {res['errors']}", file=sys.stderr)
        per_req = res["total_output_tokens"] / res["completed"] if res["completed"] else 0.0
        if res["completed"] and per_req != args.output_len:
            print(f"{who}, concurrency {c}: WARNING: the server reported {per_req:g} output tokens per request, "
                  f"asked for {args.output_len} (ignore_eos)", file=sys.stderr)
        out[c] = res
        print(f"{who}, concurrency {c:>3}: {res['output_throughput']:.1f} tok/s", file=sys.stderr)
    return out


def _row(name: str, res: dict, peak: float, t_up: float) -> tuple:
    per_req = res["total_output_tokens"] / res["completed"] if res["completed"] else 0.0
    return (name, f"{res['completed']}/{res['num_prompts']}", f"{res['request_throughput']:.2f}",
            f"{res['output_throughput']:.1f}", f"{res['ttft_ms']['p50']:.0f} / {res['ttft_ms']['p90']:.0f}",
            f"{res['tpot_ms']['p50']:.1f} / {res['tpot_ms']['p90']:.1f}", f"{per_req:g}", f"{peak:.0f}",
            f"{t_up:.1f}")


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b and a == a and b == b else "n/a"


def peer_plan(args: argparse.Namespace, threads: int) -> tuple[list[str] | None, str]:
    """The llama-server command for this run, or ``(None, why it is skipped)``."""
    from max.serve.server import free_port

    binary, reason = _llama_server.resolve_binary(_llama_server.parse_peer(args.peer))
    if binary is None:
        return None, reason
    reason = _llama_server.check_model(args.model_path)
    if reason:
        return None, reason
    np_ = max(args.concurrency)
    ctx = _llama_server.context_size(np_, args.prompt_len, args.output_len)
    return _llama_server.command(binary, args.model_path, parallel=np_, threads=threads, ctx=ctx,
                                 port=free_port()), ""


def versus_peer(args: argparse.Namespace) -> None:
    """max serve, then llama-server (never both at once), same client, prompts and threads; a table per
    concurrency with both rows and the ratio."""
    from max.engine.threads import default_num_threads

    threads = args.num_threads or default_num_threads()
    proc, url, t_up = start_server(args, num_threads=threads)
    try:
        with _PeakRSS(proc.pid) as rss:
            mine = _drive(url, args, "max serve")
    finally:
        stop_process(proc)
    mine_peak, mine_up = rss.peak, t_up

    theirs, skip = None, ""
    cmd, skip = peer_plan(args, threads)
    if cmd is not None:
        port = int(cmd[cmd.index("--port") + 1])
        print(f"starting: {' '.join(cmd)}", file=sys.stderr)
        peer, purl, p_up, skip = _llama_server.start(cmd, port)
        if peer is not None:
            try:
                with _PeakRSS(peer.pid) as prss:
                    theirs = _drive(purl, args, "llama-server")
            finally:
                stop_process(peer)
    if theirs is None:
        print(f"\nllama-server rows skipped: {skip}")
    model = os.path.basename(args.model_path) if args.model_path else next(iter(mine.values()))["model"]
    headers = ("server", "done/sent", "req/s", "out tok/s", "TTFT p50/p90 ms", "TPOT p50/p90 ms", "out tokens/req",
               "peak RSS MiB", "up in s")
    for c in args.concurrency:
        a = mine[c]
        rows = [_row("max serve (libremax)", a, mine_peak, mine_up)]
        if theirs is not None:
            b = theirs[c]
            rows.append(_row("llama-server", b, prss.peak, p_up))
            rows.append(("libremax / llama-server", "", _ratio(a["request_throughput"], b["request_throughput"]),
                         _ratio(a["output_throughput"], b["output_throughput"]),
                         _ratio(a["ttft_ms"]["p50"], b["ttft_ms"]["p50"]),
                         _ratio(a["tpot_ms"]["p50"], b["tpot_ms"]["p50"]), "", _ratio(mine_peak, prss.peak), ""))
        table(f"concurrency {c}: {model} ({threads} thread(s) per server, {os.cpu_count()} cores; prompt "
              f"{args.prompt_len} words, {args.output_len} output tokens with ignore_eos, streaming chat; ratios "
              "of p50s; out tok/s: higher is better, TTFT/TPOT/RSS: lower is better)", rows, headers)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": threads, "max_serve": {"peak_rss_mib": mine_peak, "results": list(mine.values())},
                       "llama_server": ({"peak_rss_mib": prss.peak, "command": cmd, "results": list(theirs.values())}
                                        if theirs is not None else {"skipped": skip})}, f, indent=2)


def throughput(args: argparse.Namespace) -> None:

    from max.serve.benchmark import run_benchmark

    proc, url, t_up = start_server(args)
    try:
        model = None
        run_benchmark(url, num_prompts=2, concurrency=2, prompt_len=args.prompt_len, output_len=4)  # warm-up
        results = []
        for c in args.concurrency:
            n = max(8, args.requests_per_slot * c)
            res = run_benchmark(url, num_prompts=n, concurrency=c, prompt_len=args.prompt_len,
                                output_len=args.output_len)
            model = res["model"]
            if res["failed"]:
                print(f"concurrency {c}: {res['failed']} failed: {res['errors']}", file=sys.stderr)
            results.append(res)
            print(f"concurrency {c:>3}: {res['output_throughput']:.1f} tok/s", file=sys.stderr)
    finally:
        stop_process(proc)
    base = results[0]
    rows = []
    for r in results:
        rows.append((r["concurrency"], r["num_prompts"], f"{r['request_throughput']:.2f}",
                     f"{r['output_throughput']:.1f}", f"{r['output_throughput'] / base['output_throughput']:.2f}x",
                     f"{r['ttft_ms']['p50']:.0f} / {r['ttft_ms']['p90']:.0f} / {r['ttft_ms']['p99']:.0f}",
                     f"{r['tpot_ms']['p50']:.1f} / {r['tpot_ms']['p90']:.1f} / {r['tpot_ms']['p99']:.1f}"))
    table(f"max serve on {model} ({args.devices}; prompt {args.prompt_len} words, {args.output_len} output "
          f"tokens, streaming chat; server up in {t_up:.1f} s)", rows,
          ("concurrency", "requests", "req/s", "out tok/s", f"vs c={base['concurrency']}", "TTFT p50/p90/p99 ms",
           "TPOT p50/p90/p99 ms"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
