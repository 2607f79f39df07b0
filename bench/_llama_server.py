"""llama.cpp's ``llama-server`` as the peer of ``max serve`` in ``bench/serve.py --peer llama-server[=PATH]``.

The binary is not part of this repository: ``scripts/build_llama_server.sh`` builds it from the
llama-cpp-python sdist's vendored llama.cpp into ``~/.cache/libremax/llama-server/<variant>/``.
Here: where to find it (or why it cannot be used), its command line, and starting it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

PEER_NAME = "llama-server"
VARIANTS = ("native", "avx2")  # the build script's variants, searched in this order


def default_prefix(variant: str) -> str:
    return os.path.join(os.path.expanduser("~"), ".cache", "libremax", "llama-server", variant)


def parse_peer(spec: str) -> str | None:
    """``--peer`` value -> the explicit binary path (``llama-server=PATH``) or None (``llama-server``: search).
    Any other peer name is an error."""
    name, sep, path = spec.partition("=")
    if name != PEER_NAME:
        raise ValueError(f"--peer: only '{PEER_NAME}' or '{PEER_NAME}=PATH' is supported, got {spec!r}")
    if sep and not path:
        raise ValueError(f"--peer {spec!r}: empty path after '='")
    return path or None


def resolve_binary(explicit: str | None) -> tuple[str | None, str]:
    """``(path, "")`` of a runnable llama-server, or ``(None, reason)`` when there is none.  Without an
    explicit path: the build script's default prefixes (native, then avx2), then ``PATH``."""
    if explicit is not None:
        if not os.path.exists(explicit):
            return None, f"{explicit} does not exist (build it with scripts/build_llama_server.sh)"
        if os.path.isdir(explicit) or not os.access(explicit, os.X_OK):
            return None, f"{explicit} is not an executable file"
        return explicit, ""
    tried = []
    for v in VARIANTS:
        cand = os.path.join(default_prefix(v), "llama-server")
        tried.append(cand)
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand, ""
    on_path = shutil.which("llama-server")
    if on_path:
        return on_path, ""
    return None, (f"no llama-server binary (looked in {', '.join(tried)} and on PATH; "
                  "build it with scripts/build_llama_server.sh)")


def check_model(model_path: str | None) -> str:
    """Why llama-server cannot serve ``model_path`` ('' when it can): it needs one GGUF file."""
    if not model_path:
        return "llama-server needs a GGUF file; give --model-path FILE.gguf"
    if not (os.path.isfile(model_path) and model_path.lower().endswith(".gguf")):
        return f"llama-server needs a GGUF file; {model_path} is not one"
    return ""


def context_size(parallel: int, prompt_len: int, output_len: int) -> int:
    """``-c`` for ``parallel`` slots: llama-server splits the context evenly over its slots, and each
    needs the prompt (``prompt_len`` words: up to 2 tokens each, plus the chat template's ~64) plus
    ``output_len`` generated tokens.  Rounded up to a multiple of 256."""
    per_slot = 2 * prompt_len + 64 + output_len
    total = parallel * per_slot
    return -(-total // 256) * 256


def command(binary: str, model_path: str, *, parallel: int, threads: int, ctx: int, port: int) -> list[str]:
    """The llama-server command line: ``parallel`` slots (continuous batching), ``threads`` threads for
    generation and prompt processing alike, loopback only, no web UI."""
    return [binary, "-m", model_path, "-np", str(parallel), "-t", str(threads), "-tb", str(threads),
            "-c", str(ctx), "--host", "127.0.0.1", "--port", str(port), "--no-webui"]


def start(cmd: list[str], port: int, timeout: float = 300.0, log_path: str | None = None
          ) -> tuple[subprocess.Popen | None, str, float, str]:
    """Start ``cmd`` and wait for ``/health`` == 200 (llama-server answers 503 while loading).  Returns
    ``(process, base_url, seconds_to_ready, "")``, or ``(None, "", 0, reason)`` when it exits or does not
    come up in ``timeout`` s (the reason carries the tail of its log)."""
    import tempfile

    import httpx

    log_path = log_path or tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False).name
    log = open(log_path, "w")
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
    except OSError as e:
        log.close()
        return None, "", 0.0, f"could not start {cmd[0]}: {e}"
    url = f"http://127.0.0.1:{port}"

    def tail() -> str:
        with open(log_path, errors="replace") as f:
            return f.read()[-1500:]

    while True:
        if proc.poll() is not None:
            log.close()
            return None, "", 0.0, f"llama-server exited with status {proc.returncode}:\n{tail()}"
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                log.close()
                return proc, url, time.perf_counter() - t0, ""
        except httpx.HTTPError:
            pass
        if time.perf_counter() - t0 > timeout:
            proc.kill()
            proc.wait()
            log.close()
            return None, "", 0.0, f"llama-server did not come up in {timeout:.0f} s:\n{tail()}"
        time.sleep(0.25)
