"""max.graph as of today's MAX: buffer_utils, TensorType.cast, Graph.copy / copy.deepcopy,
add_subgraph(devices=), value.Numeric.  References: numpy/ml_dtypes casts."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from max import driver
from max.driver import Buffer
from max.dtype import DType
from max.engine import InferenceSession
from max.graph import DeviceRef, Graph, TensorType, Weight, buffer_utils, ops
from max.graph.value import Numeric

CPU = DeviceRef.CPU()


@pytest.mark.parametrize("src,dst", [(DType.float32, DType.bfloat16), (DType.bfloat16, DType.float32),
                                     (DType.float32, DType.float16), (DType.float64, DType.int32),
                                     (DType.float32, DType.float8_e4m3fn), (DType.float32, DType.float4_e2m1fn),
                                     (DType.float4_e2m1fn, DType.float32)])
def test_cast_tensor_to_matches_numpy(src, dst):
    vals = np.array([0.5, -1.5, 2.0, 3.25, 6.0, -0.0], np.float32)
    a = vals.astype(src.to_numpy())
    out = buffer_utils.cast_tensor_to(Buffer.from_numpy(a), dst)
    assert out.dtype is dst
    want = a.astype(np.float32).astype(dst.to_numpy())
    np.testing.assert_array_equal(out.to_numpy().astype(np.float64), want.astype(np.float64))
    same = Buffer.from_numpy(a)
    assert buffer_utils.cast_tensor_to(same, src) is same
    outs = buffer_utils.cast_tensors_to([Buffer.from_numpy(a), Buffer.from_numpy(a)], dst)
    assert [o.dtype for o in outs] == [dst, dst]
    d = buffer_utils.cast_dlpack_to(torch.from_numpy(np.array([1.5, 2.5])), DType.float64, DType.bfloat16,
                                    driver.CPU())
    assert d.dtype is DType.bfloat16 and d.to_numpy().astype(np.float32).tolist() == [1.5, 2.5]
    with pytest.raises(TypeError, match="cast_tensor_to: dtype must be a max.dtype.DType"):
        buffer_utils.cast_tensor_to(same, np.float32)


def test_tensor_type_cast():
    t = TensorType(DType.float32, ["b", 3], CPU)
    assert t.cast(DType.int8) == TensorType(DType.int8, ["b", 3], CPU)
    with pytest.raises(TypeError, match="TensorType.cast: dtype must be a DType"):
        t.cast("int8")


def test_graph_copy_and_deepcopy_are_independent():
    w = Weight("w", DType.float32, [3], CPU)
    g = Graph("g", lambda x: x * w + 1.0, input_types=[TensorType(DType.float32, [3], CPU)])
    for c in (g.copy(), copy.deepcopy(g)):
        assert c is not g and c.name == g.name and len(c._nodes) == len(g._nodes)
        assert str(c) == str(g)
        assert all(n.graph is c for n in c._nodes)
        with c:  # building into the copy leaves the original alone
            c.output(ops.negate(c.inputs[0]))
        assert str(c) != str(g)
    x = np.arange(3, dtype=np.float32)
    reg = {"w": np.full(3, 2.0, np.float32)}
    out = InferenceSession().load(g.copy(), weights_registry=reg).execute(Buffer.from_numpy(x))[0]
    np.testing.assert_array_equal(out.to_numpy(), x * 2 + 1)


def test_add_subgraph_devices():
    g = Graph("root", input_types=[TensorType(DType.float32, [2], CPU)])
    sub = g.add_subgraph("s", lambda x: x + 1.0, input_types=[TensorType(DType.float32, [2], CPU)],
                         devices=[driver.CPU()])
    assert sub.devices == [CPU]
    # MAX 26.7 does not check input devices against `devices` (max-behaviours.md B13.5)
    t = g.add_subgraph("t", input_types=[TensorType(DType.float32, [2], CPU)], devices=[DeviceRef.GPU(0)])
    assert t.devices == [DeviceRef.GPU(0)]
    with g:
        (y,) = ops.call(sub, g.inputs[0])
        g.output(y)
    out = InferenceSession().load(g).execute(Buffer.from_numpy(np.zeros(2, np.float32)))[0]
    np.testing.assert_array_equal(out.to_numpy(), [1, 1])


def test_numeric_alias():
    assert int in Numeric.__args__ and np.floating in Numeric.__args__


def test_device_placement_policy_for_host_only_ops():
    import warnings

    from max.graph import DevicePlacementPolicy

    gpu = DeviceRef.GPU(0)
    types = [TensorType(DType.float32, [1, 4, 4], gpu), TensorType(DType.float32, [1, 2, 4], gpu)]

    def build(policy):
        return Graph("nms", lambda b, s: ops.non_maximum_suppression(b, s, 3), input_types=types,
                     strict_device_placement=policy)

    with pytest.warns(UserWarning, match="non_maximum_suppression: runs on the host"):
        build(DevicePlacementPolicy.Warn)
    with pytest.raises(ValueError, match="non_maximum_suppression: runs on the host"):
        build(DevicePlacementPolicy.Error)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build("ignore")
        # CPU operands never trigger the policy
        Graph("c", lambda b, s: ops.non_maximum_suppression(b, s, 3),
              input_types=[TensorType(DType.float32, [1, 4, 4], CPU), TensorType(DType.float32, [1, 2, 4], CPU)],
              strict_device_placement="error")
    with pytest.raises(ValueError, match="strict_device_placement must be a DevicePlacementPolicy"):
        Graph("x", strict_device_placement="sometimes")
