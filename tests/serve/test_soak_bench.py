"""``bench/soak.py`` in CI: a small soak of the tiny model's ``max serve`` (mixed valid, invalid,
streaming, cancelled and oversized requests) must end with no unexpected status, no KV page in use,
flat RSS after the warm-up, and a clean exit on SIGTERM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from serve_support import make_tiny_llama

BENCH = Path(__file__).resolve().parents[2] / "bench" / "soak.py"


def test_soak_bench_on_the_tiny_model(tmp_path):
    model = make_tiny_llama(str(tmp_path / "tiny"), max_position_embeddings=2048)
    from max.serve.server import free_port

    out = tmp_path / "soak.json"
    port = free_port()
    r = subprocess.run(
        [sys.executable, str(BENCH), "--model-path", model, "--requests", "120", "--warmup", "30",
         "--concurrency", "8", "--max-length", "1024", "--max-tokens", "12", "--duration", "240",
         "--max-request-bytes", str(64 << 10), "--json", str(out), "--port", str(port), "--progress-every", "0.5"],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    res = json.loads(out.read_text())
    assert res["failures"] == [] and res["requests"] == 120
    st = res["statuses"]
    assert st.get("200", 0) > 0 and st.get("413", 0) > 0 and st.get("400", 0) > 0  # every family was exercised
    assert set(st) <= {"200", "400", "404", "413", "415", "cancelled"}
    assert res["kv_cache"]["pages_in_use_end"] == 0 and res["server_exit_status"] == 0
    assert res["rss_mib"]["growth_after_warmup"] < 50
    assert "requests by status" in r.stdout and "server RSS: start" in r.stdout
    assert f"max serve is up on http://127.0.0.1:{port}" in r.stderr  # --port is used
    assert "[soak run] " in r.stderr and " unexpected so far" in r.stderr  # progress while it runs
