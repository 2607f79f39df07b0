"""``bench/serve.py --peer llama-server[=PATH]`` without llama-server: the peer's lookup, command line and
context size, the skip reasons, and a real run on the tiny model where the peer is missing (the reason is
printed and the ``max serve`` rows still come)."""

from __future__ import annotations

import importlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def peer():
    sys.path.insert(0, str(BENCH_DIR))
    try:
        yield importlib.import_module("_llama_server")
    finally:
        sys.path.remove(str(BENCH_DIR))


def _exe(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_parse_peer(peer):
    assert peer.parse_peer("llama-server") is None
    assert peer.parse_peer("llama-server=/opt/x/llama-server") == "/opt/x/llama-server"
    with pytest.raises(ValueError, match="only 'llama-server'"):
        peer.parse_peer("vllm")
    with pytest.raises(ValueError, match="empty path"):
        peer.parse_peer("llama-server=")


def test_resolve_binary_explicit(peer, tmp_path):
    path, why = peer.resolve_binary(str(tmp_path / "missing"))
    assert path is None and "does not exist" in why and "build_llama_server.sh" in why
    plain = tmp_path / "plain"
    plain.write_text("not executable")
    path, why = peer.resolve_binary(str(plain))
    assert path is None and "not an executable file" in why
    assert peer.resolve_binary(str(tmp_path)) == (None, f"{tmp_path} is not an executable file")
    exe = _exe(tmp_path / "bin" / "llama-server")
    assert peer.resolve_binary(exe) == (exe, "")


def test_resolve_binary_default_prefixes_then_path(peer, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    path, why = peer.resolve_binary(None)
    assert path is None
    assert str(tmp_path / "home" / ".cache" / "libremax" / "llama-server" / "native" / "llama-server") in why
    assert "avx2" in why and "on PATH" in why
    avx2 = _exe(tmp_path / "home" / ".cache" / "libremax" / "llama-server" / "avx2" / "llama-server")
    assert peer.resolve_binary(None) == (avx2, "")
    native = _exe(tmp_path / "home" / ".cache" / "libremax" / "llama-server" / "native" / "llama-server")
    assert peer.resolve_binary(None) == (native, "")  # native first
    os.remove(native)
    os.remove(avx2)
    on_path = _exe(tmp_path / "empty" / "llama-server")
    assert peer.resolve_binary(None) == (on_path, "")


def test_check_model(peer, tmp_path):
    assert "give --model-path" in peer.check_model(None)
    assert "is not one" in peer.check_model(str(tmp_path))  # a Hugging Face directory
    assert "is not one" in peer.check_model(str(tmp_path / "absent.gguf"))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert peer.check_model(str(f)) == ""


def test_context_size_and_command(peer):
    # 8 slots x (2 x 32 + 64 + 64) = 1536, already a multiple of 256
    assert peer.context_size(8, 32, 64) == 1536
    assert peer.context_size(1, 10, 5) == 256  # 89 rounded up
    ctx = peer.context_size(3, 100, 200)
    assert ctx % 256 == 0 and ctx // 3 >= 2 * 100 + 200  # every slot fits its prompt and output
    cmd = peer.command("/b/llama-server", "/m.gguf", parallel=8, threads=2, ctx=1536, port=1234)
    assert cmd[0] == "/b/llama-server"
    pairs = dict(zip(cmd[1::2], cmd[2::2]))
    assert pairs["-m"] == "/m.gguf" and pairs["-np"] == "8" and pairs["-t"] == "2" and pairs["-tb"] == "2"
    assert pairs["-c"] == "1536" and pairs["--host"] == "127.0.0.1" and pairs["--port"] == "1234"


def test_start_reports_a_peer_that_exits(peer, tmp_path):
    bad = tmp_path / "llama-server"
    bad.write_text("#!/bin/sh\necho 'error: model file not found' >&2\nexit 3\n")
    bad.chmod(0o755)
    proc, url, _, why = peer.start([str(bad)], port=1, timeout=30)
    assert proc is None and url == ""
    assert "exited with status 3" in why and "model file not found" in why


def test_bench_skips_a_missing_peer_and_still_runs_max_serve(tiny_model, tmp_path):
    out = tmp_path / "res.json"
    r = subprocess.run(
        [sys.executable, str(BENCH_DIR / "serve.py"), "--model-path", tiny_model, "--concurrency", "1", "2",
         "--requests-per-slot", "1", "--output-len", "4", "--prompt-len", "6", "--max-length", "256",
         "--skip-features", "--peer", "llama-server=/nonexistent/llama-server", "--num-threads", "1",
         "--json", str(out)],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "llama-server rows skipped: /nonexistent/llama-server does not exist" in r.stdout
    for c in (1, 2):
        assert f"\nconcurrency {c}: " in r.stdout
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("max serve (libremax)")]
    assert len(rows) == 2
    assert all(ln.split()[3] == "8/8" for ln in rows)  # every request done
    assert "libremax / llama-server" not in r.stdout and "structured output" not in r.stdout
    res = json.loads(out.read_text())
    assert res["threads"] == 1 and "does not exist" in res["llama_server"]["skipped"]
    assert [x["total_output_tokens"] for x in res["max_serve"]["results"]] == [8 * 4, 8 * 4]  # ignore_eos
    assert res["max_serve"]["peak_rss_mib"] > 50


def test_bench_rejects_an_unknown_peer():
    r = subprocess.run([sys.executable, str(BENCH_DIR / "serve.py"), "--peer", "vllm"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "only 'llama-server'" in r.stderr
