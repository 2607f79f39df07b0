"""MEF files (``CompiledModel.export_mef``, ``InferenceSession(precompiled_mefs=, export_mefs=)``,
``LIBREMAX_COMPILE_CACHE``): a compiled model saved in one process runs in another without compiling
again, with the weights bound from the registry given at load.

Follows https://docs.modular.com/max/api/python/engine (CompiledModel.export_mef, InferenceSession's
``precompiled_mefs`` / ``export_mefs``); the file format itself is libremax's own."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from max.engine import InferenceSession
from max.engine.compiler.mef import MEFError

SRC = str(Path(__file__).resolve().parents[2] / "src")

GRAPH = textwrap.dedent('''
    import numpy as np
    from max.dtype import DType
    from max.graph import DeviceRef, Graph, TensorType, Weight, ops

    def build():
        cpu = DeviceRef.CPU()
        with Graph("mef_probe", input_types=[TensorType(DType.float32, ("n", 8), cpu)]) as g:
            x = g.inputs[0]
            w = Weight("w", DType.float32, (8, 4), cpu)
            b = Weight("b", DType.float32, (4,), cpu)
            scale = ops.constant(np.arange(4, dtype=np.float32) / 4 + 0.5, DType.float32, cpu)
            h = ops.relu(ops.matmul(x, w) + ops.exp(b)) * scale  # exp(b): folded once at load
            g.output(ops.softmax(h), ops.reshape(h, (-1,)))
        return g
''')


def _run(code: str, tmp: Path, env: dict | None = None, prefix: str = "") -> dict:
    """Run ``code`` (after the graph builder) in a fresh interpreter; it prints one JSON line."""
    script = tmp / f"s{len(list(tmp.glob('s*.py')))}.py"
    script.write_text(GRAPH + prefix + textwrap.dedent(code))
    e = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e.pop("LIBREMAX_COMPILE_CACHE", None)
    e.update(env or {})
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=e, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _reference(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> tuple:
    h = np.maximum(x.astype(np.float64) @ w + np.exp(b.astype(np.float64)), 0) * (np.arange(4) / 4 + 0.5)
    e = np.exp(h - h.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True), h.reshape(-1)


def _data(tmp: Path) -> tuple:
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    x = rng.standard_normal((5, 8)).astype(np.float32)
    np.savez(tmp / "data.npz", w=w, b=b, x=x)
    return w, b, x


NO_PASSES = '''
import max.engine.session as S
def _forbidden(*a, **k):
    raise AssertionError("a graph pass ran while loading a MEF file")
S.optimize_program = _forbidden
'''


def test_round_trip_across_processes_runs_without_compiling(tmp_path):
    w, b, x = _data(tmp_path)
    out = _run(f'''
        import json
        from max.engine import InferenceSession
        s = InferenceSession()
        s.compile(build()).export_mef({str(tmp_path / "m.mef")!r})
        print(json.dumps({{"passes": s.last_compile_stats["passes_run"]}}))
    ''', tmp_path)
    assert out["passes"] == 1
    got = _run(f'''
        import json
        import numpy as np
        from max.engine import InferenceSession
        d = np.load({str(tmp_path / "data.npz")!r})
        s = InferenceSession()
        m = s.load({str(tmp_path / "m.mef")!r}, weights_registry={{"w": d["w"], "b": d["b"]}})
        st = s.last_compile_stats
        o = m.execute(d["x"])
        print(json.dumps({{"passes": st["passes_run"], "from": st["loaded_from"],
                          "out": [t.to_numpy().tolist() for t in o]}}))
    ''', tmp_path, prefix=NO_PASSES)
    assert got["passes"] == 0 and got["from"].endswith("m.mef")
    # equal to the model compiled here from the graph, and to a float64 reference
    ns: dict = {}
    exec(GRAPH, ns)
    here = InferenceSession().load(ns["build"](), weights_registry={"w": w, "b": b}).execute(x)
    for a, h in zip(got["out"], here):
        np.testing.assert_array_equal(np.asarray(a, np.float32), h.to_numpy())
    for a, r in zip(got["out"], _reference(x, w, b)):
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-6)


def _exported(tmp_path: Path) -> tuple:
    ns: dict = {}
    exec(GRAPH, ns)
    s = InferenceSession()
    c = s.compile(ns["build"]())
    path = tmp_path / "m.mef"
    c.export_mef(path)
    return s, c, path


def test_compile_from_file_binds_weights_at_init(tmp_path):
    s, c, path = _exported(tmp_path)
    assert b'"w"' in path.read_bytes() and set(c.expected_weights) == {"w", "b"}
    c2 = s.compile(path)
    assert set(c2.expected_weights) == {"w", "b"}
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    for _ in range(2):  # one artifact, two weight sets: nothing about the weights is in the file
        w, b = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
        assert w.tobytes() not in path.read_bytes()
        m = s.init(c2, {"w": w, "b": b})
        np.testing.assert_allclose(m.execute(x)[0].to_numpy(), _reference(x, w, b)[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="lacks weights"):
        s.init(c2, {"w": w})


def test_file_of_another_format_version_is_refused(tmp_path):
    s, _, path = _exported(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data.replace(b"LIBREMAX-MEF 1\n", b"LIBREMAX-MEF 999\n", 1))
    with pytest.raises(MEFError, match="format version 999; this libremax reads version 1"):
        s.load(path, weights_registry={})
    path.write_bytes(data)


def test_file_from_another_libremax_compiler_is_refused(tmp_path, monkeypatch):
    from max.engine.compiler import mef

    s, _, path = _exported(tmp_path)
    monkeypatch.setattr(mef, "_FINGERPRINT", ["0" * 32])  # as if the passes' sources had changed
    with pytest.raises(MEFError, match="another libremax compiler"):
        s.load(path, weights_registry={})


def test_corrupt_or_foreign_files_are_refused(tmp_path):
    s, _, path = _exported(tmp_path)
    data = path.read_bytes()
    bad = tmp_path / "bad.mef"
    i = data.index(b'"mef_probe"')
    bad.write_bytes(data[:i] + b'"mef_probX"' + data[i + 11:])
    with pytest.raises(MEFError, match="checksum does not match"):
        s.load(bad)
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(MEFError, match="checksum does not match"):
        s.compile(bad)
    bad.write_bytes(b"MEF\x00\x01 a file from another engine")
    with pytest.raises(MEFError, match="not a libremax MEF file"):
        s.load(bad)
    with pytest.raises(RuntimeError, match="not a file"):
        s.load(tmp_path / "missing.mef")


def test_file_lowered_under_another_backend_policy_is_refused(tmp_path):
    s, _, path = _exported(tmp_path)
    other = InferenceSession()
    other.backend = dataclasses.replace(s.backend, isa="some-other-isa", native=True)
    with pytest.raises(MEFError, match="backend policy"):
        other.load(path, weights_registry={})
    # as a cache, the other policy is another key: it compiles (and does not read the file)
    ns: dict = {}
    exec(GRAPH, ns)
    cache = InferenceSession(export_mefs=tmp_path / "c")
    cache.load(ns["build"](), weights_registry={"w": np.ones((8, 4), np.float32), "b": np.ones(4, np.float32)})
    other2 = InferenceSession(precompiled_mefs=tmp_path / "c")
    other2.backend = other.backend
    other2.load(ns["build"](), weights_registry={"w": np.ones((8, 4), np.float32), "b": np.ones(4, np.float32)})
    assert other2.last_compile_stats["passes_run"] == 1 and "loaded_from" not in other2.last_compile_stats


def test_compile_cache_hit_across_processes(tmp_path):
    _data(tmp_path)
    code = '''
        import json
        import numpy as np
        from max.engine import InferenceSession
        d = np.load(%r)
        s = InferenceSession()
        m = s.load(build(), weights_registry={"w": d["w"], "b": d["b"]})
        st = s.last_compile_stats
        print(json.dumps({"passes": st["passes_run"], "from": st.get("loaded_from"), "to": st.get("exported_to"),
                          "reused": st["folds_reused"], "stored": st["folds_stored"],
                          "out": m.execute(d["x"])[0].to_numpy().tolist()}))
    ''' % str(tmp_path / "data.npz")
    env = {"LIBREMAX_COMPILE_CACHE": str(tmp_path / "cache")}
    cold = _run(code, tmp_path, env)
    assert cold["passes"] == 1 and cold["from"] is None and Path(cold["to"]).is_file()
    assert (cold["reused"], cold["stored"]) == (0, 1)
    warm = _run(code, tmp_path, env, prefix=NO_PASSES)
    assert warm["passes"] == 0 and warm["from"] == cold["to"]
    assert (warm["reused"], warm["stored"]) == (1, 0)  # the folded exp(b) came from the cache
    assert warm["out"] == cold["out"]
    # other weight values: the cached program is reused, the folded value is not
    d = np.load(tmp_path / "data.npz")
    np.savez(tmp_path / "data.npz", w=d["w"], b=d["b"] + 1, x=d["x"])
    other = _run(code, tmp_path, env)
    assert other["passes"] == 0 and (other["reused"], other["stored"]) == (0, 1)
    np.testing.assert_allclose(other["out"], _reference(d["x"], d["w"], d["b"] + 1)[0], rtol=1e-5, atol=1e-6)


def test_session_arguments_are_checked(tmp_path):
    with pytest.raises(TypeError, match="precompiled_mefs"):
        InferenceSession(precompiled_mefs=3)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        InferenceSession(precompiled_mefs=tmp_path / "nope")
    with pytest.raises(TypeError, match="export_mef"):
        _exported(tmp_path)[1].export_mef(3)


def test_pipeline_restarts_warm_from_the_compile_cache(tmp_path, monkeypatch):
    """A text-generation pipeline (tiny random Llama) built twice over one cache folder: the second
    build reads its step graph's MEF and generates the same greedy text."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from lm_support import make_tiny_llama
    from max.entrypoints.llm import LLM
    from max.interfaces import SamplingParams
    from max.pipelines import PipelineConfig

    d = make_tiny_llama(str(tmp_path / "llama"))
    monkeypatch.setenv("LIBREMAX_COMPILE_CACHE", str(tmp_path / "cache"))
    texts, stats = [], []
    for _ in range(2):
        llm = LLM(PipelineConfig(model_path=d, max_length=64, max_batch_size=2, device_specs="cpu"))
        stats.append(dict(llm.pipeline._pipeline_model.session.last_compile_stats))
        p = SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True)
        texts.append(llm.generate(["hello world"], sampling_params=p, max_new_tokens=8, use_tqdm=False))
    assert stats[0]["passes_run"] >= 1 and "exported_to" in stats[0]
    assert stats[1]["passes_run"] == 0 and stats[1]["loaded_from"] == stats[0]["exported_to"]
    assert texts[0] == texts[1] and texts[0][0]


def _loop_graph():
    from max.dtype import DType
    from max.graph import DeviceRef, Graph, TensorType, Weight, ops

    cpu = DeviceRef.CPU()
    with Graph("loop", input_types=[TensorType(DType.float32, (4,), cpu), TensorType(DType.int32, (), cpu)]) as g:
        x, n = g.inputs
        w = Weight("w", DType.float32, (4,), cpu)
        res = ops.while_loop([x, ops.constant(0, DType.int32, cpu)], lambda v, i: i < n,
                             lambda v, i: [v * ops.exp(w) + 1.0, i + 1])
        t = ops.cond(n > 2, [TensorType(DType.float32, (4,), cpu)], lambda: res[0] * 2.0, lambda: res[0] - w)
        g.output(t[0])
    return g


def test_regions_round_trip_and_a_single_precompiled_file(tmp_path):
    """Loop bodies and branches are stored optimised too (and bind their weights at load)."""
    w = np.linspace(-1, 1, 4).astype(np.float32)
    s = InferenceSession()
    s.compile(_loop_graph()).export_mef(tmp_path / "loop.mef")
    m = s.load(tmp_path / "loop.mef", weights_registry={"w": w})
    assert s.last_compile_stats["passes_run"] == 0
    # precompiled_mefs naming one file: used for the graph it was made from
    s2 = InferenceSession(export_mefs=tmp_path / "c")
    s2.load(_loop_graph(), weights_registry={"w": w})
    exported = Path(s2.last_compile_stats["exported_to"])
    s3 = InferenceSession(precompiled_mefs=exported)
    m3 = s3.load(_loop_graph(), weights_registry={"w": w})
    assert s3.last_compile_stats["loaded_from"] == str(exported)
    x = np.arange(4, dtype=np.float32)
    for n in (0, 1, 3):
        v = x.astype(np.float64)
        for _ in range(n):
            v = v * np.exp(w.astype(np.float64)) + 1
        want = v * 2 if n > 2 else v - w
        for model in (m, m3):
            np.testing.assert_allclose(model.execute(x, np.int32(n))[0].to_numpy(), want, rtol=1e-5)


def test_damaged_folded_weights_are_computed_again(tmp_path):
    ns: dict = {}
    exec(GRAPH, ns)
    w, b, x = _data(tmp_path)
    reg = {"w": w, "b": b}
    InferenceSession(export_mefs=tmp_path / "c").load(ns["build"](), weights_registry=reg)
    (entry,) = (tmp_path / "c" / "folded").glob("*.bin")
    data = bytearray(entry.read_bytes())
    data[-1] ^= 0xFF  # one bit of exp(b) flipped on disk
    entry.write_bytes(bytes(data))
    s = InferenceSession(precompiled_mefs=tmp_path / "c", export_mefs=tmp_path / "c")
    m = s.load(ns["build"](), weights_registry=reg)
    assert s.last_compile_stats["passes_run"] == 0
    assert (s.last_compile_stats["folds_reused"], s.last_compile_stats["folds_stored"]) == (0, 1)
    np.testing.assert_allclose(m.execute(x)[0].to_numpy(), _reference(x, w, b)[0], rtol=1e-5, atol=1e-6)


def test_an_unusable_cache_folder_only_warns(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("LIBREMAX_COMPILE_CACHE", str(blocker / "cache"))
    with pytest.warns(RuntimeWarning, match="compiling without the cache"):
        s = InferenceSession()
    ns: dict = {}
    exec(GRAPH, ns)
    w, b, x = _data(tmp_path)
    m = s.load(ns["build"](), weights_registry={"w": w, "b": b})
    np.testing.assert_allclose(m.execute(x)[0].to_numpy(), _reference(x, w, b)[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(OSError, match="cannot create export_mefs"):
        InferenceSession(export_mefs=blocker / "x")


def test_attribute_values_round_trip_with_their_types():
    from max.dtype import DType
    from max.engine.compiler import mef
    from max.graph.dim import Dim
    from max.graph.type import BufferType, DeviceKind, DeviceRef, TensorType

    values = [DeviceKind.CPU, (1, 2.5, float("inf"), -0.0, None, True, "s"), [slice(1, None, 2), Ellipsis],
              {"a": (Dim("x") + 1) // 2, 3: "k"}, np.float32(1.5), DType.bfloat16,
              TensorType(DType.float32, ("a", 3), DeviceRef.CPU()),
              BufferType(DType.int8, (Dim("b") * 2,), DeviceRef.GPU(1))]
    for v in values:
        back = mef._dec(json.loads(json.dumps(mef.encode_value(v))))
        assert type(back) is type(v) and repr(back) == repr(v)
    a = np.arange(6, dtype=np.int8).reshape(2, 3)
    back = mef._dec(json.loads(json.dumps(mef.encode_value(a))))
    assert back.dtype == a.dtype and np.array_equal(back, a)
    with pytest.raises(MEFError, match="no MEF encoding"):
        mef.encode_value(object())
    with pytest.raises(MEFError, match="outside libremax"):
        mef._dec({"enum": "os:PathLike", "v": 1})
