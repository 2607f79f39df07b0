"""scripts/device_check.sh --dry-run: the GPU device check's steps run here without a GPU (tests collected,
the benchmark on a 2-layer model on the CPU), so the script is known to work before a GPU machine is lent.
Also the helpers it uses (scripts/device_check.py): pins, wheel tags, the gpu-marked files, junit counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import device_check  # noqa: E402


def test_dry_run(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable)
    env.pop("LIBREMAX_TEST_DEVICE", None)
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "device_check.sh"), "--dry-run"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    files = sorted(os.listdir(tmp_path))
    assert files == ["bench.json", "device_check.log", "steps.tsv", "summary.json"], files  # flat, few
    s = json.load(open(tmp_path / "summary.json"))
    assert s["mode"] == "dry-run" and s["failed_steps"] == []
    steps = s["steps"]
    assert steps["environment"]["status"] == "ok"
    assert steps["install"]["status"] in ("ok", "skipped")
    for group in ("tests_ops", "tests_gpu"):
        assert steps[group]["status"] == "skipped" and "collected only" in steps[group]["reason"]
        assert int(steps[group]["reason"].split(": ")[-1].split()[0].split("/")[0]) > 0  # tests were collected
    lm = s["bench"]["models"]["tiny"]["libremax"]
    assert "error" not in lm, lm
    assert lm["tok_s_b1"] > 0 and lm["tok_s_b2"] > 0 and lm["tpot_s"] > 0 and lm["ttft_s"] > 0
    assert lm["bytes_per_token"] > 0 and 0 < lm["roofline_share"]
    hf = s["bench"]["models"]["tiny"]["transformers"]
    assert "error" not in hf and hf["tpot_s"] > 0
    assert s["checks"]["tiny"]["b1_vs_transformers_eager"] > 0


def test_pins_and_wheel_tags():
    pins = device_check.pins()
    assert pins["gguf"] and pins["msgspec"] and pins["llguidance"]
    assert "torch" not in pins and "transformers" not in pins  # the image has them
    ok = device_check._wheel_ok
    assert ok("msgspec-0.22.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl") is None
    assert ok("llguidance-1.9.1-cp39-abi3-manylinux_2_31_x86_64.whl") is None
    assert ok("gguf-0.19.0-py3-none-any.whl") is None
    assert ok("msgspec-0.22.0-cp311-cp311-manylinux_2_17_x86_64.whl") is not None
    assert ok("soxr-1.1.0-cp312-abi3-manylinux_2_28_aarch64.whl") is not None


def test_gpu_files(capsys):
    device_check.gpu_files(["tests/graph"])
    files = capsys.readouterr().out.split()
    assert "tests/pipelines/test_cuda_graph_decode.py" in files and "tests/driver/test_driver_gpu.py" in files
    assert not any(f.startswith("tests/graph/") for f in files)


def test_junit_counts(tmp_path):
    p = tmp_path / "j.xml"
    p.write_text('<testsuites><testsuite tests="4" failures="1" errors="0" skipped="1">'
                 '<testcase classname="a" name="t1"/><testcase classname="a" name="t2"><failure/></testcase>'
                 '</testsuite></testsuites>')
    c = device_check.junit_counts(str(p))
    assert (c["tests"], c["passed"], c["failures"], c["skipped"]) == (4, 2, 1, 1)
    assert c["failed_tests"] == ["a::t2"]
