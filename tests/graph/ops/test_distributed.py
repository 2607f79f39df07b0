"""allgather / allreduce_sum: single device, several inputs on one device, CPU + GPU, several GPUs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from max.driver import Buffer
from max.dtype import DType
from max.graph import BufferType, DeviceRef, Dim, Graph, TensorType, ops
from support import session, to_input, tt
from support import test_device_ref as device_ref


def _sig(dev: DeviceRef | None = None) -> BufferType:
    return BufferType(DType.uint8, (64,), dev or device_ref())


def _sig_buffer(dev: DeviceRef):
    b = Buffer.from_numpy(np.zeros(64, np.uint8))
    if dev.is_cpu():
        return b
    from max import driver

    return b.to(driver.Accelerator(dev.id))


def _run(fn, tensor_types, arrays, sig_devs):
    types = list(tensor_types) + [_sig(d) for d in sig_devs]
    with Graph("coll", input_types=types) as g:
        vals = list(g.inputs)
        xs = [v.tensor for v in vals[: len(tensor_types)]]
        sigs = [v.buffer for v in vals[len(tensor_types):]]
        outs = fn(xs, sigs)
        g.output(*outs)
    devs = {d for t in tensor_types for d in [t.device]} | set(sig_devs)
    from max import driver
    from max.engine import InferenceSession

    acc = sorted({d.id for d in devs if not d.is_cpu()})
    sess = InferenceSession(devices=[driver.CPU()] + [driver.Accelerator(i) for i in acc])
    model = sess.load(g)
    inputs = [_place(a, t.device) for a, t in zip(arrays, tensor_types)] + [_sig_buffer(d) for d in sig_devs]
    return outs, [o.to_numpy() for o in model.execute(*inputs)]


def _place(a, dev: DeviceRef):
    b = Buffer.from_numpy(np.ascontiguousarray(a))
    if dev.is_cpu():
        return b
    from max import driver

    return b.to(driver.Accelerator(dev.id))


@given(data=st.data(), seed=st.integers(0, 2**16))
def test_allgather_matches_concatenate(data, seed):
    k = data.draw(st.integers(1, 3))
    rank = data.draw(st.integers(1, 3))
    base = [data.draw(st.integers(1, 3)) for _ in range(rank)]
    axis = data.draw(st.integers(-rank, rank - 1))
    rng = np.random.default_rng(seed)
    arrays = []
    for _ in range(k):
        shape = list(base)
        shape[axis] = data.draw(st.integers(0, 3))
        arrays.append(rng.standard_normal(shape).astype(np.float32))
    dev = device_ref()
    types = [TensorType(DType.float32, a.shape, dev) for a in arrays]
    vals, outs = _run(lambda xs, sigs: ops.allgather(xs, sigs, axis=axis), types, arrays, [dev] * k)
    ref = np.concatenate(arrays, axis=axis)
    assert len(outs) == k
    for v, o in zip(vals, outs):
        assert v.device == dev and tuple(int(d) for d in v.shape) == ref.shape
        np.testing.assert_array_equal(o, ref)


def test_allreduce_sum_and_single_device():
    dev = device_ref()
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(3)]
    types = [TensorType(DType.float32, (2, 3), dev)] * 3
    _, outs = _run(lambda xs, sigs: ops.allreduce.sum(xs, sigs), types, arrays, [dev] * 3)
    for o in outs:
        np.testing.assert_allclose(o, arrays[0].astype(np.float64) + arrays[1] + arrays[2], rtol=1e-6)
    # the degenerate single-device case is a copy
    _, (o,) = _run(lambda xs, sigs: ops.allreduce_sum(xs, sigs), types[:1], arrays[:1], [dev])
    np.testing.assert_array_equal(o, arrays[0])
    _, (o,) = _run(lambda xs, sigs: ops.allgather(xs, sigs, 1), types[:1], arrays[:1], [dev])
    np.testing.assert_array_equal(o, arrays[0])


def test_allgather_symbolic_types():
    dev = device_ref()
    with Graph("t", input_types=[tt(DType.float32, ["a", 4]), tt(DType.float32, ["b", 4]), _sig(), _sig()]) as g:
        x, y, s0, s1 = g.inputs
        r = ops.allgather([x.tensor, y.tensor], [s0.buffer, s1.buffer])
        assert [v.shape for v in r] == [[Dim("a") + Dim("b"), 4]] * 2
        assert all(v.device == dev for v in r)
        g.output(*r)
    model = session().load(g)
    a, b = np.ones((2, 4), np.float32), np.zeros((3, 4), np.float32)
    sig = [_sig_buffer(dev), _sig_buffer(dev)]
    outs = model.execute(to_input(a), to_input(b), *sig)
    for o in outs:
        np.testing.assert_array_equal(o.to_numpy(), np.concatenate([a, b]))


def test_collective_errors():
    F = tt(DType.float32, [2, 3])
    with Graph("e", input_types=[F, tt(DType.float32, [2, 4]), tt(DType.float64, [2, 3]), tt(DType.float32, [3]),
                                 _sig(), _sig(), _sig(DeviceRef.CPU()) if not device_ref().is_cpu() else _sig()]) as g:
        x, x24, x64, x3, s0, s1, s2 = g.inputs
        x, x24, x64, x3 = (v.tensor for v in (x, x24, x64, x3))
        with pytest.raises(ValueError, match=r"allgather: expected one signal buffer per input: got 2 inputs and 1"):
            ops.allgather([x, x], [s0])
        with pytest.raises(ValueError, match=r"allgather: inputs is empty"):
            ops.allgather([], [])
        with pytest.raises(TypeError, match=r"^BufferValue\(\) argument must be an mlir\.Value of buffer type or a "
                           r"graph\.BufferValue, not 'TensorValue' \(allgather: signal_buffers\[1\]\)"):
            ops.allgather([x, x], [s0, x])
        with pytest.raises(TypeError, match=r"allgather: inputs\[1\] has dtype .*float64"):
            ops.allgather([x, x64], [s0, s1])
        with pytest.raises(ValueError, match=r"allgather: inputs\[1\] has rank 1"):
            ops.allgather([x, x3], [s0, s1])
        with pytest.raises(ValueError, match=r"allgather: inputs\[1\] \[Dim\(2\), Dim\(4\)\] and inputs\[0\] \[Dim\(2\), Dim\(3\)\] differ in dim 1"):
            ops.allgather([x, x24], [s0, s1])
        assert ops.allgather([x, x24], [s0, s1], axis=1)[0].shape == [2, 7]
        with pytest.raises(IndexError, match=r"^Axis out of range \(expected to be in range of \[-2, 1\], but got 2\)"):
            ops.allgather([x, x], [s0, s1], axis=2)
        with pytest.raises(TypeError, match=r"allgather: inputs must be an iterable of TensorValues"):
            ops.allgather(x, [s0])
        with pytest.raises(TypeError, match=r"allgather: signal_buffers must be an iterable of BufferValues"):
            ops.allgather([x], s0)
        with pytest.raises(ValueError, match=r"allreduce_sum: inputs\[1\] has shape \[Dim\(2\), Dim\(4\)\], inputs\[0\] has \[Dim\(2\), Dim\(3\)\]"):
            ops.allreduce_sum([x, x24], [s0, s1])
        if not device_ref().is_cpu():
            with pytest.raises(ValueError, match=r"allgather: signal_buffers\[0\] is on cpu"):
                ops.allgather([x], [s2])


@pytest.mark.gpu
def test_allgather_cpu_and_gpu():
    """Inputs on two different devices (host and the first GPU): results land on each input's device."""
    cpu, gpu = DeviceRef.CPU(), DeviceRef.GPU(0)
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((1, 3)).astype(np.float32)]
    types = [TensorType(DType.float32, (2, 3), cpu), TensorType(DType.float32, (1, 3), gpu)]
    vals, outs = _run(lambda xs, sigs: ops.allgather(xs, sigs), types, arrays, [cpu, gpu])
    assert [v.device for v in vals] == [cpu, gpu]
    for o in outs:
        np.testing.assert_array_equal(o, np.concatenate(arrays))
    vals, outs = _run(lambda xs, sigs: ops.allreduce_sum(xs, sigs), [types[0], TensorType(DType.float32, (2, 3), gpu)],
                      [arrays[0], arrays[0] * 2], [cpu, gpu])
    for o in outs:
        np.testing.assert_allclose(o, arrays[0] * 3, rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs at least 2 GPUs")
def test_allgather_multi_gpu():
    n = torch.cuda.device_count()
    devs = [DeviceRef.GPU(i) for i in range(n)]
    rng = np.random.default_rng(6)
    arrays = [rng.standard_normal((i + 1, 4)).astype(np.float32) for i in range(n)]
    types = [TensorType(DType.float32, a.shape, d) for a, d in zip(arrays, devs)]
    vals, outs = _run(lambda xs, sigs: ops.allgather(xs, sigs), types, arrays, devs)
    assert [v.device for v in vals] == devs
    for o in outs:
        np.testing.assert_array_equal(o, np.concatenate(arrays))
