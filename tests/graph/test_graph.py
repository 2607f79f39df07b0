"""Graph construction, values, weights and the textual IR."""

from __future__ import annotations

import numpy as np
import pytest

from max.dtype import DType
from max.graph import BufferType, DeviceRef, Graph, TensorType, TensorValue, Weight, ops


def test_forward_callable_and_context_manager_build_the_same_graph():
    def fwd(x, y):
        return ops.relu(x @ y)

    types = [TensorType(DType.float32, (2, 3)), TensorType(DType.float32, (3, 4))]
    g1 = Graph("f", fwd, input_types=types)
    with Graph("f", input_types=types) as g2:
        g2.output(fwd(*g2.inputs))
    assert [str(t) for t in g1.output_types] == [str(t) for t in g2.output_types]
    assert g1.output_types[0] == TensorType(DType.float32, (2, 4))


def test_current_graph_and_nesting():
    with pytest.raises(RuntimeError, match="no graph is being built"):
        Graph.current
    with Graph("outer") as g:
        assert Graph.current is g
        with Graph("inner") as h:
            assert Graph.current is h
        assert Graph.current is g


def test_str_prints_one_line_per_node_with_types_and_user_location():
    with Graph("pretty", input_types=[TensorType(DType.float32, ("batch", 4))]) as g:
        x = g.inputs[0].tensor
        y = ops.exp(x) + 1
        g.output(y)
    text = str(g)
    assert "graph @pretty(%0: tensor<float32, [batch, 4], cpu:0>)" in text
    assert "exp(%0) : tensor<float32, [batch, 4], cpu:0>" in text
    assert "add(" in text and "output(" in text
    assert "test_graph.py" in text  # each node remembers the line that made it
    node = y._node
    assert node.loc.endswith(f"test_graph.py:{node.loc.rsplit(':', 1)[1]}")


def test_value_accessors_and_narrowing():
    with Graph("v", input_types=[TensorType(DType.float32, (2, 3)), BufferType(DType.float32, (2,))]) as g:
        x, buf = g.inputs
        assert isinstance(x, TensorValue) and x.tensor is x
        assert x.shape == [2, 3] and x.rank == 2 and x.dtype is DType.float32 and x.device == DeviceRef.CPU()
        assert x.T.shape == [3, 2]
        assert buf.buffer is buf
        with pytest.raises(TypeError, match="is not a tensor"):
            buf.tensor
        assert bool(x) is True  # MAX 26.7: a graph value is truthy (max-behaviours.md B13.1)


def test_output_accepts_tensor_like_and_rejects_others():
    with Graph("o", input_types=[TensorType(DType.float32, (2,))]) as g:
        g.output(g.inputs[0], 3.0, np.arange(3, dtype=np.int32))
    assert [t.dtype for t in g.output_types] == [DType.float32, DType.float32, DType.int32]
    with Graph("bad", input_types=[]) as g:
        with pytest.raises(TypeError, match="output 0"):
            g.output(object())


def test_weights_are_added_lazily_once():
    w = Weight("layer.weight", DType.float32, (3, 3), DeviceRef.CPU())
    with pytest.raises(RuntimeError, match="used with no graph"):
        w + 1
    with Graph("w", input_types=[TensorType(DType.float32, (2, 3))]) as g:
        x = g.inputs[0]
        y = x @ w
        z = y @ w
        g.output(z)
    assert list(g.weights()) == ["layer.weight"]
    assert sum(n.op == "weight" for n in g._nodes) == 1
    other = Weight("layer.weight", DType.float32, (4, 4), DeviceRef.CPU())
    with g:
        with pytest.raises(ValueError, match="already has a different weight named 'layer.weight'"):
            g.add_weight(other)


def test_graph_input_types_validated():
    with pytest.raises(TypeError, match=r"input_types\[0\] must be a TensorType"):
        Graph("bad", input_types=[(2, 3)])


def test_chains_thread_side_effects():
    with Graph("c", input_types=[]) as g:
        c0 = g._current_chain
        assert g.always_ready_chain is not None
        g.merge_device_chains()
        assert g._current_chain is c0  # nothing to merge

