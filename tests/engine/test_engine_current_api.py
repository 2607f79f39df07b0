"""max.engine as of today's MAX: compile / init / init_all / load_all, CompiledModel,
Model.input_devices / devices, PrintStyle / DebugConfig and the max.engine.api path."""

from __future__ import annotations

import numpy as np
import pytest

from max import driver
from max.driver import Buffer
from max.dtype import DType
from max.engine import CompiledModel, DebugConfig, InferenceSession, PrintStyle
from max.graph import DeviceRef, Graph, TensorType, Weight, ops

CPU = DeviceRef.CPU()


def _graph(name="g"):
    w = Weight("scale", DType.float32, [3], CPU)
    return Graph(name, lambda x: x * w, input_types=[TensorType(DType.float32, [3], CPU)])


def test_compile_then_init_with_different_weights():
    s = InferenceSession(devices=[driver.CPU()])
    c = s.compile(_graph())
    assert isinstance(c, CompiledModel) and sorted(c.expected_weights) == ["scale"]
    x = Buffer.from_numpy(np.arange(3, dtype=np.float32))
    m2 = s.init(c, {"scale": np.full(3, 2.0, np.float32)})
    m3 = s.init(c, {"scale": np.full(3, 3.0, np.float32)})
    np.testing.assert_array_equal(m2.execute(x)[0].to_numpy(), [0, 2, 4])
    np.testing.assert_array_equal(m3.execute(x)[0].to_numpy(), [0, 3, 6])
    with pytest.raises(ValueError, match=r"weights_registry lacks weights \['scale'\]"):
        s.init(c, {})
    with pytest.raises(TypeError, match="expected a CompiledModel"):
        s.init(_graph())
    ms = s.init_all([c, s.compile(_graph("h"))], {"scale": np.ones(3, np.float32)})
    assert [m.execute(x)[0].to_numpy().tolist() for m in ms] == [[0, 1, 2], [0, 1, 2]]


def test_load_all_and_model_devices():
    s = InferenceSession()
    assert s.devices[0] == driver.CPU()  # the host CPU is always there
    models = s.load_all([_graph("a"), _graph("b")], weights_registry={"scale": np.ones(3, np.float32)})
    assert len(models) == 2
    assert models[0].input_devices == [driver.CPU()] and models[0].devices == [driver.CPU()]
    with pytest.raises(ValueError, match="no models given"):
        s.load_all([])


def test_print_styles(tmp_path, capfd):
    s = InferenceSession()

    def fn(x):
        ops.print(x, label="probe")
        return x

    g = Graph("p", fn, input_types=[TensorType(DType.float32, [4], CPU)])
    m = s.load(g)
    x = Buffer.from_numpy(np.array([1.0, 2.123456789, 3.0, 4.0], np.float32))
    try:
        s.set_debug_print_options(PrintStyle.COMPACT, precision=3)
        m.execute(x)
        assert "probe: [1.   , 2.123, 3.   , 4.   ]" in capfd.readouterr().out
        s.set_debug_print_options("NONE")
        m.execute(x)
        assert "probe" not in capfd.readouterr().out
        s.set_debug_print_options(PrintStyle.BINARY, output_directory=str(tmp_path))
        m.execute(x)
        np.testing.assert_array_equal(np.load(tmp_path / "probe.npy"), x.to_numpy())
        assert s.debug == DebugConfig(PrintStyle.BINARY, 6, str(tmp_path))
        with pytest.raises(ValueError, match="BINARY needs an output_directory"):
            s.set_debug_print_options(PrintStyle.BINARY)
        s.debug = DebugConfig(PrintStyle.FULL, 2)
        m.execute(x)
        assert "probe: [1.  , 2.12, 3.  , 4.  ]" in capfd.readouterr().out
    finally:
        s.set_debug_print_options(PrintStyle.COMPACT, 6)


def test_engine_api_module_path():
    from max.engine import api

    assert api.InferenceSession is InferenceSession and api.CompiledModel is CompiledModel
