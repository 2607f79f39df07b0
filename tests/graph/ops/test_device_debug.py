"""transfer_to and print."""

from __future__ import annotations

import numpy as np
import pytest

from max import driver
from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, ops
from support import run1, run_graph, session, tt

CPU = DeviceRef.CPU()


def _build(fn, types=()):
    with Graph("g", input_types=list(types)) as g:
        return fn(*g.inputs)


# ------------------------------------------------------------------ transfer_to
def test_transfer_same_device_is_identity():
    def f(x):
        assert ops.transfer_to(x, CPU) is x
        assert ops.transfer_to(x, driver.CPU()) is x
        assert x.to(CPU) is x
        return x

    _build(f, [TensorType(DType.float32, ["n", 2], CPU)])


def test_transfer_type_to_gpu():
    def f(x):
        y = ops.transfer_to(x, DeviceRef.GPU())
        assert y.type == TensorType(DType.float32, ["n", 2], DeviceRef.GPU())
        assert y._node.op == "transfer_to"
        z = x.to(DeviceRef.GPU(1))
        assert z.device == DeviceRef.GPU(1)
        return y

    _build(f, [TensorType(DType.float32, ["n", 2], CPU)])


def test_transfer_executes_on_cpu():
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.testing.assert_array_equal(run1(lambda x: ops.transfer_to(x, CPU) + 1, [tt(DType.float32, [3, 2])], a), a + 1)


def test_transfer_errors():
    t = [TensorType(DType.float32, [2], CPU)]
    with pytest.raises(TypeError, match="transfer_to: x must be a tensor value"):
        _build(lambda x: ops.transfer_to(1.0, CPU), t)
    with pytest.raises(TypeError, match="transfer_to: x must be a tensor value"):
        _build(lambda x: ops.transfer_to(np.zeros(2), CPU), t)
    with pytest.raises(TypeError, match="transfer_to"):
        _build(lambda x: ops.transfer_to(x, "gpu"), t)
    with pytest.raises(TypeError, match="transfer_to: device must be"):
        _build(lambda x: ops.transfer_to(x, None), t)


@pytest.mark.gpu
def test_transfer_round_trip_gpu():
    from max.engine import InferenceSession

    a = np.arange(4, dtype=np.float32)

    def f(x):
        y = ops.transfer_to(x, DeviceRef.GPU()) * 2
        return ops.transfer_to(y, CPU)

    g = Graph("t", f, input_types=[TensorType(DType.float32, [4], CPU)])
    m = InferenceSession(devices=[driver.CPU(), driver.Accelerator()]).load(g)
    (out,) = m.execute(driver.Buffer.from_numpy(a))
    np.testing.assert_array_equal(out.to_numpy(), a * 2)


# ------------------------------------------------------------------ print
def test_print_tensor_and_string(capsys):
    def f(x):
        ops.print(x, label="addition_output")
        ops.print("between")
        x.print()  # TensorValue.print -> default label
        return x + 1

    a = np.array([1.5, -2.0], dtype=np.float32)
    np.testing.assert_array_equal(run1(f, [tt(DType.float32, [2])], a), a + 1)
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["addition_output: [ 1.5, -2. ]", "between", "debug_tensor: [ 1.5, -2. ]"]


def test_print_is_kept_ordered_and_not_folded(capsys):
    def f(x):
        c = ops.constant(np.array([7, 8], dtype=np.int32), DType.int32, CPU)
        ops.print(c, label="c")  # constant operand: must not be folded away
        ops.print(c, label="c")  # identical print: must not be merged
        ops.print(x * 2, label="unused_value")  # its operand is used by nothing else
        return x

    a = np.array([3], dtype=np.int64)
    g = Graph("p", f, input_types=[tt(DType.int64, [1])])
    m = session().load(g)
    m.execute(driver.Buffer.from_numpy(a))
    m.execute(driver.Buffer.from_numpy(a))
    out = capsys.readouterr().out.splitlines()
    assert out == ["c: [7, 8]", "c: [7, 8]", "unused_value: [6]"] * 2


def test_print_threads_the_chain():
    with Graph("g", input_types=[TensorType(DType.float32, [2], CPU)]) as g:
        before = g._current_chain
        assert ops.print(g.inputs[0], "l") is None
        node = g._current_chain._node
        assert node.op == "print" and node.side_effects
        assert node.inputs[-1] is before
        ops.print("s")
        assert g._current_chain._node.inputs[-1] is node.results[0]


def test_print_bfloat16_and_symbolic(capsys):
    run_graph(lambda x: (ops.print(x.cast(DType.bfloat16), "bf"), x)[1], [tt(DType.float32, ["n"])],
              np.array([0.5, 2.0, 3.0], dtype=np.float32))
    assert capsys.readouterr().out.strip() == "bf: [0.5, 2. , 3. ]"


def test_print_errors():
    t = [TensorType(DType.float32, [2], CPU)]
    with pytest.raises(TypeError, match="print: label must be a str"):
        _build(lambda x: ops.print(x, label=3), t)
    with pytest.raises(TypeError, match="print: value must be"):
        _build(lambda x: ops.print(object()), t)
    with pytest.raises(RuntimeError, match="print: no graph is being built"):
        ops.print("x")
