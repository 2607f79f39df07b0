"""The ``max`` CLI: every argument checked before a model loads (one-line errors), help texts that
say what the options do, ``max list`` showing the bundled models, and no library warnings."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
from click.testing import CliRunner

from lm_support import make_tiny_bert, make_tiny_llama

pytest.importorskip("transformers")


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if anything tries to load a model (LLM or a pipeline)."""
    import max.entrypoints.llm as llm_mod
    from max.pipelines.lib.registry import PIPELINE_REGISTRY

    def boom(*a, **k):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(llm_mod, "LLM", boom)
    monkeypatch.setattr(PIPELINE_REGISTRY, "retrieve", boom)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return make_tiny_llama(str(tmp_path_factory.mktemp("cli_llama")))


def _run(args):
    from max.entrypoints.cli import main

    return CliRunner().invoke(main, args)


def _one_line_error(r, *needles):
    assert r.exit_code != 0, r.output
    assert "Traceback" not in r.output and r.exception is None or isinstance(r.exception, SystemExit), r.output
    err = [line for line in r.output.splitlines() if line.startswith("Error:")]
    assert len(err) == 1, r.output
    for n in needles:
        assert n in err[0], r.output
    return err[0]


@pytest.mark.parametrize("args,needles", [
    (["--max-new-tokens", "0"], ["--max-new-tokens", "x>=1"]),
    (["--max-new-tokens", "-5"], ["--max-new-tokens"]),
    (["--prompt="], ["--prompt", "must not be empty"]),
    (["--prompt", "   "], ["--prompt", "must not be empty"]),
    (["--max-length", "0"], ["--max-length"]),
    (["--max-batch-size", "0"], ["--max-batch-size"]),
    (["--prefill-chunk-size", "-1"], ["--prefill-chunk-size"]),
    (["--temperature", "-1"], ["--temperature"]),
    (["--top-p", "0"], ["--top-p"]),
    (["--top-k", "-3"], ["--top-k"]),
    (["--min-p", "2"], ["--min-p"]),
    (["--frequency-penalty", "5"], ["--frequency-penalty"]),
    (["--repetition-penalty", "0"], ["--repetition-penalty"]),
    (["--seed", "-1"], ["--seed", "2**63 - 1"]),
    (["--seed", str(2**63)], ["--seed"]),
    (["--kv-cache-memory", "lots"], ["--kv-cache-memory", "512MiB"]),
    (["--device-memory-utilization", "0"], ["--device-memory-utilization"]),
    (["--device-memory-utilization", "1.5"], ["--device-memory-utilization"]),
])
def test_generate_rejects_bad_arguments_before_loading(no_model_load, args, needles):
    _one_line_error(_run(["generate", "--devices", "cpu", *args]), *needles)


def test_generate_prompt_longer_than_max_length_fails_before_loading(no_model_load, tiny_llama):
    r = _run(["generate", "--model-path", tiny_llama, "--devices", "cpu", "--max-length", "3",
              "--prompt", "def fibonacci(n): return n"])
    line = _one_line_error(r, "more than the maximum length 3", "--max-length")
    assert tiny_llama not in line


def test_generate_chat_prompt_is_checked_too(no_model_load, tiny_llama):
    r = _run(["generate", "--model-path", tiny_llama, "--devices", "cpu", "--max-length", "8", "--chat",
              "--prompt", "hi"])
    _one_line_error(r, "more than the maximum length 8")


@pytest.mark.parametrize("args,needles", [
    (["--port", "0"], ["--port"]),
    (["--port", "70000"], ["--port"]),
    (["--metrics-port", "8000"], ["--metrics-port", "--port"]),
    (["--max-queue-size", "-1"], ["--max-queue-size"]),
    (["--max-request-bytes", "huge"], ["--max-request-bytes"]),
    (["--drain-timeout", "-1"], ["--drain-timeout"]),
    (["--served-model-name", ""], ["--served-model-name"]),
    (["--max-length", "0"], ["--max-length"]),
    (["--kv-cache-memory", "1.5 furlongs"], ["--kv-cache-memory"]),
])
def test_serve_rejects_bad_arguments_before_loading(no_model_load, monkeypatch, args, needles):
    import max.serve.server as server

    monkeypatch.setattr(server, "build_app", lambda *a, **k: pytest.fail("the model was loaded"))
    _one_line_error(_run(["serve", "--devices", "cpu", *args]), *needles)


def test_too_small_kv_cache_memory_is_a_one_line_error(tiny_llama):
    r = _run(["generate", "--model-path", tiny_llama, "--devices", "cpu", "--max-length", "256",
              "--kv-cache-memory", "1KiB", "--max-new-tokens", "2"])
    _one_line_error(r, "--kv-cache-memory", "too small", "max_length 256")


def test_help_texts():
    g = _run(["generate", "--help"]).output
    assert "Generate a continuation of --prompt" in g and "for PROMPT" not in g
    assert "no top-k filter" not in g and "the top 255" in g
    s = _run(["serve", "--help"]).output
    from max.entrypoints.default_model import GENERATION

    assert GENERATION.served_name in " ".join(s.split())  # the documented default id is the real one
    for flag in ("--kv-cache-memory", "--device-memory-utilization", "--max-request-bytes", "--drain-timeout"):
        assert flag in s
    assert "max list" in " ".join(_run(["--help"]).output.split())


def test_list_shows_bundled_models_and_their_paths(monkeypatch):
    from max.entrypoints.default_model import BUNDLED, GENERATION

    out = _run(["list"]).output
    assert "Bundled models" in out and "Architectures:" in out
    for m in BUNDLED:
        assert m.name in out
        path = m.locate()
        if path is not None and os.path.exists(path):
            assert path in out
    assert f"max serve model id: {GENERATION.served_name}" in out
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == GENERATION.package else real(name, *a))
    out = _run(["list"]).output
    assert f"not installed; install with: {GENERATION.install}" in out


def test_default_model_missing_says_how_to_install(monkeypatch):
    from max.entrypoints.default_model import GENERATION

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == GENERATION.package else real(name, *a))
    _one_line_error(_run(["generate", "--devices", "cpu"]), GENERATION.install)


def test_progress_bars_count_tensors_or_files(monkeypatch):
    from max.graph.weights import protocol

    monkeypatch.setattr(protocol, "PROGRESS_THRESHOLD_BYTES", 0)
    monkeypatch.delenv("LIBREMAX_NO_PROGRESS", raising=False)
    bar = protocol.progress(10, "Loading weights", 272)
    assert bar.unit == "tensor"
    bar.close()
    bar = protocol.progress(10, "Loading safetensors", 3, unit="file")
    assert bar.unit == "file"
    bar.close()


def test_encode_too_long_says_truncate_flag_and_no_library_warning(tmp_path):
    d = make_tiny_bert(str(tmp_path / "bert"))
    cfg_path = os.path.join(d, "tokenizer_config.json")
    cfg = json.load(open(cfg_path))
    cfg["model_max_length"] = 64  # transformers warns past this length unless silenced
    json.dump(cfg, open(cfg_path, "w"))
    r = _run(["encode", "--model-path", d, "--devices", "cpu", "--prompt", " ".join(["cat"] * 100)])
    assert r.exit_code != 0
    assert "--truncate on the command line" in r.output
    assert "Token indices sequence length" not in r.output
    r = _run(["encode", "--model-path", d, "--devices", "cpu", "--truncate", "--prompt", " ".join(["cat"] * 100)])
    assert r.exit_code == 0 and "size: 32" in r.output
    assert "Token indices sequence length" not in r.output
