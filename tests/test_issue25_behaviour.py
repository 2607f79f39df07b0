"""Issue 25's behaviour items that libremax now follows (one test each; each docstring names the MAX
page or the issue's report it follows)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from max.driver import CPU, Buffer
from max.dtype import DType


def test_ops_random_is_an_attribute_of_ops():
    """https://docs.modular.com/max/api/python/graph.ops/ -- ``random`` is a submodule of ``max.graph.ops``,
    reachable as ``ops.random`` right after ``from max.graph import ops`` (fresh interpreter: nothing
    else imported it first)."""
    code = "from max.graph import ops; print(ops.random.gaussian.__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "max.graph.ops.random"


def test_tensor_from_range_and_other_sequences():
    """https://docs.modular.com/max/api/python/generated/max.experimental.tensor.Tensor/ -- ``data`` is a
    DLPack array, a number or a nested array: any (nested) sequence, ``range`` and tuples included."""
    from max.experimental.tensor import Tensor

    t = Tensor(range(5), dtype=DType.int64)
    np.testing.assert_array_equal(np.from_dlpack(t), np.arange(5))
    u = Tensor((range(2), (3.5, 4.5)))
    np.testing.assert_array_equal(np.from_dlpack(u), np.array([[0, 1], [3.5, 4.5]], np.float32))
    with pytest.raises(TypeError, match="a nested list or a DLPack array"):
        Tensor("abc")
    with pytest.raises(TypeError, match="cannot make a tensor element"):
        Tensor([[1, 2], "x"])


def test_buffer_utils_take_a_session():
    """Issue 25 (today's MAX signatures): ``cast_tensor_to`` / ``cast_tensors_to`` / ``cast_dlpack_to`` take
    ``session=``; the cast then runs as a graph compiled in that session (same values as without)."""
    from max.engine import InferenceSession
    from max.graph.buffer_utils import cast_dlpack_to, cast_tensor_to, cast_tensors_to

    session = InferenceSession(devices=[CPU()])
    x = np.array([[1.5, -2.25, 3.0], [1e5, 0.1, 7.0]], np.float32)
    a = cast_tensor_to(Buffer.from_numpy(x), DType.bfloat16, session=session)
    b = cast_tensor_to(Buffer.from_numpy(x), DType.bfloat16)
    assert a.dtype is DType.bfloat16
    np.testing.assert_array_equal(a.to_numpy().astype(np.float32), b.to_numpy().astype(np.float32))
    outs = cast_tensors_to([Buffer.from_numpy(x), Buffer.from_numpy(x[:1])], DType.float16, session=session)
    assert [o.shape for o in outs] == [(2, 3), (1, 3)]  # one compiled cast serves both shapes
    np.testing.assert_array_equal(outs[1].to_numpy(), x[:1].astype(np.float16))
    np.testing.assert_array_equal(cast_dlpack_to(x, DType.float32, DType.int32, CPU(), session=session).to_numpy(),
                                  x.astype(np.int32))
    with pytest.raises(TypeError, match="InferenceSession"):
        cast_tensor_to(Buffer.from_numpy(x), DType.float16, session=object())


def test_item_of_a_one_element_buffer():
    """Issue 25 (today's MAX): ``Buffer.item()`` reads any buffer holding exactly one element (ValueError
    otherwise); https://docs.modular.com/max/api/python/generated/max.driver.Buffer/."""
    assert Buffer.from_numpy(np.full((1, 1, 1), 2.5, np.float32)).item() == 2.5
    assert Buffer.from_numpy(np.array([7], np.int64)).item() == 7
    with pytest.raises(ValueError, match="calling `item` on a tensor with 2 items but expected only 1"):
        Buffer.from_numpy(np.zeros(2, np.float32)).item()


def test_view_of_a_slice_keeps_its_offset_and_shares_memory():
    """https://docs.modular.com/max/api/python/generated/max.driver.Buffer/ -- slices are strided views of
    the same memory; ``view(dtype, shape)`` of a slice that starts inside the storage reinterprets
    those bytes (not the storage's first ones) and writes go through."""
    base = Buffer.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
    row = base[1]
    as_int = row.view(DType.int32, [2, 2])
    np.testing.assert_array_equal(as_int.to_numpy().reshape(-1), np.arange(4, 8, dtype=np.float32).view(np.int32))
    as_bytes = base[2:].view(DType.uint8)
    assert as_bytes.shape == (1, 16)
    as_int[0, 0] = int(np.float32(-1.0).view(np.int32))
    assert base.to_numpy()[1, 0] == -1.0


def test_while_loop_body_returns_several_values():
    """https://docs.modular.com/max/api/python/graph.ops/ (``while_loop``) -- the body returns one value per
    loop-carried value; the loop yields all of them."""
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType, ops

    C = DeviceRef.CPU()
    with Graph("wl", input_types=[TensorType(DType.float32, [2], C)]) as g:
        init = (g.inputs[0].tensor, ops.constant(0, DType.int32, C), ops.constant(0.0, DType.float32, C))
        x, i, s = ops.while_loop(init, lambda a, i, s: i < 3,
                                 lambda a, i, s: [a * 2, i + 1, s + ops.sum(a, -1).reshape([])])
        g.output(x, i, s)
    x, i, s = (r.to_numpy() for r in InferenceSession().load(g).execute(Buffer.from_numpy(np.ones(2, np.float32))))
    np.testing.assert_array_equal(x, [8.0, 8.0])
    assert int(i) == 3 and float(s) == 2 + 4 + 8


def test_tensor_type_fields_are_assignable():
    """https://docs.modular.com/max/api/python/generated/max.graph.TensorType/ -- ``dtype``, ``shape`` and
    ``device`` are the type's fields and (issue 25: as on today's MAX) assignable; the values are checked
    as the constructor checks them, and a graph keeps its own copy of every type it was given."""
    from max.graph import DeviceRef, Graph, TensorType

    t = TensorType(DType.float32, [2, 3], DeviceRef.CPU())
    with Graph("tt", input_types=[t]) as g:
        x = g.inputs[0].tensor
        t.dtype, t.shape = DType.int32, [4, "n"]
        assert (t.dtype, [str(d) for d in t.shape]) == (DType.int32, ["4", "n"])
        assert x.dtype is DType.float32 and [int(d) for d in x.shape] == [2, 3]  # the graph's input unchanged
        vt = x.type
        vt.shape = [5]
        assert [int(d) for d in x.shape] == [2, 3]
        g.output(x)
    with pytest.raises(ValueError, match="non-negative"):
        t.shape = [-1]
    with pytest.raises(TypeError, match="dtype must be a DType"):
        t.dtype = "float32"
    with pytest.raises(AttributeError, match="no assignable field"):
        t.rank = 3
