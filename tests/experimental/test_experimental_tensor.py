"""max.experimental.tensor: Tensor members, ComputeGraph realization, defaults and contextvars."""

from __future__ import annotations

import asyncio
import contextvars
import gc

import numpy as np
import pytest
import torch

from max import driver
from max.driver import CPU, Buffer
from max.dtype import DType
from max.experimental import functional as F
from max.experimental import tensor as T
from max.experimental.tensor import ComputeGraph, Tensor
from max.experimental.sharding import DeviceMesh
from max.graph import DeviceRef, Graph, Shape, TensorType

CPU_ = CPU()


def c(a, dt=DType.float32):
    return Tensor.constant(np.asarray(a), dtype=dt, device=CPU_)


# -- factories ------------------------------------------------------------------------
def test_factories():
    o = Tensor.ones((2, 3), dtype=DType.float32, device=CPU_)
    z = Tensor.zeros([2, 3], dtype=DType.int32, device=CPU_)
    f = Tensor.full((3,), 7.5, dtype=DType.float64, device=CPU_)
    np.testing.assert_array_equal(np.asarray(o), np.ones((2, 3)))
    assert np.asarray(z).dtype == np.int32 and not np.asarray(z).any()
    np.testing.assert_array_equal(np.asarray(f), [7.5] * 3)
    tt = TensorType(DType.int64, [2, 2], DeviceRef.CPU())
    for t, v in ((Tensor.ones_like(tt), 1), (Tensor.zeros_like(tt), 0), (Tensor.full_like(tt, 4), 4)):
        assert t.type == tt and t.dtype == DType.int64
        np.testing.assert_array_equal(np.asarray(t), np.full((2, 2), v))
    np.testing.assert_array_equal(np.asarray(Tensor.arange(5, dtype=DType.int64, device=CPU_)), np.arange(5))
    np.testing.assert_array_equal(np.asarray(Tensor.arange(2, 11, 3, dtype=DType.int32, device=CPU_)),
                                  np.arange(2, 11, 3))
    k = Tensor.constant([[1, 2], [3, 4]], dtype=DType.int16, device=CPU_)
    assert k.dtype == DType.int16 and k.shape == Shape([2, 2])
    assert Tensor.constant(3.5, dtype=DType.float32, device=CPU_).rank == 0
    with pytest.raises(ValueError, match="constant"):
        Tensor.constant(300, dtype=DType.int8, device=CPU_)


def test_from_dlpack_shares_memory_and_exports():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = Tensor.from_dlpack(a)
    assert t.real and t.shape == Shape([2, 3]) and t.dtype == DType.float32
    a[0, 0] = 42
    assert t.item() if False else np.asarray(t)[0, 0] == 42
    tt = torch.arange(4)
    t2 = Tensor.from_dlpack(tt)
    assert t2.dtype == DType.int64
    back = torch.from_dlpack(t2 + 1)
    assert back.tolist() == [1, 2, 3, 4]
    assert (t2 + 1).__dlpack_device__() == tt.__dlpack_device__()
    np.testing.assert_array_equal(np.from_dlpack(t2 * 2), [0, 2, 4, 6])
    assert Tensor.from_dlpack(Buffer.from_numpy(a)).shape == Shape([2, 3])


def test_metadata_members():
    x = c(np.ones((2, 3, 4)))
    assert x.shape == Shape([2, 3, 4]) and x.rank == 3 and x.num_elements() == 24
    assert x.dtype == DType.float32 and x.device == CPU_
    assert x.type == TensorType(DType.float32, [2, 3, 4], DeviceRef.CPU())
    assert isinstance(x.driver_tensor, Buffer) and x.driver_tensor.shape == (2, 3, 4)
    assert T.driver_tensor_type(x.driver_tensor) == x.type
    assert len(x) == 2 and [t.shape for t in x] == [Shape([3, 4])] * 2


def test_methods():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    x = c(a)
    np.testing.assert_array_equal(np.asarray(x.reshape((6, 4))), a.reshape(6, 4))
    np.testing.assert_array_equal(np.asarray(x.permute([2, 0, 1])), a.transpose(2, 0, 1))
    np.testing.assert_array_equal(np.asarray(x.transpose(0, 2)), a.swapaxes(0, 2))
    np.testing.assert_array_equal(np.asarray(x.T), a.swapaxes(-1, -2))
    v = c([1.0, 2.0])
    assert v.T is v
    np.testing.assert_array_equal(np.asarray(x.argmax()), a.argmax(-1)[..., None])
    assert x.argmax().dtype == DType.int64
    np.testing.assert_array_equal(np.asarray(x.max()), a.max(-1, keepdims=True))
    y = x.cast(DType.int32)
    assert y.dtype == DType.int32 and y.cast(DType.int32) is y
    assert x.to(CPU_) is x
    assert c(5.0).item() == 5.0 and isinstance(Tensor.constant(3, dtype=DType.int64, device=CPU_).item(), int)
    with pytest.raises(ValueError, match="item"):
        x.item()
    assert float(c(2.5)) == 2.5 and int(c(3.0)) == 3 and bool(c(1.0))
    with pytest.raises(ValueError, match="ambiguous"):
        bool(x)


def test_dunders_against_numpy():
    a = np.array([[1.5, -2.0], [3.0, 4.0]], np.float32)
    b = np.array([[2.0, 1.0], [-1.0, 0.5]], np.float32)
    x, y = c(a), c(b)
    cases = {
        "+": (x + y, a + b), "r+": (1 + x, 1 + a), "-": (x - y, a - b), "r-": (1 - x, 1 - a),
        "*": (x * y, a * b), "r*": (2 * x, 2 * a), "/": (x / y, a / b), "r/": (1 / y, 1 / b),
        "//": (x // y, a // b), "%": (x % y, np.mod(a, b)), "**": (abs(x) ** y, np.abs(a) ** b),
        "r**": (2 ** x, 2 ** a), "@": (x @ y, a @ b), "neg": (-x, -a), "pos": (+x, a), "abs": (abs(x), np.abs(a)),
        "==": (x == y, a == b), "!=": (x != y, a != b), "<": (x < y, a < b), "<=": (x <= y, a <= b),
        ">": (x > y, a > b), ">=": (x >= y, a >= b), "[]": (x[1, ::-1], a[1, ::-1]), "[None]": (x[None, 0], a[None, 0]),
    }
    for k, (got, want) in cases.items():
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, err_msg=k)
    p, q = c([True, False, True], DType.bool), c([True, True, False], DType.bool)
    pa, qa = np.array([1, 0, 1], bool), np.array([1, 1, 0], bool)
    np.testing.assert_array_equal(np.asarray(p & q), pa & qa)
    np.testing.assert_array_equal(np.asarray(p | q), pa | qa)
    np.testing.assert_array_equal(np.asarray(p ^ q), pa ^ qa)
    np.testing.assert_array_equal(np.asarray(~p), ~pa)
    idx = Tensor.constant([1, 0], dtype=DType.int64, device=CPU_)
    np.testing.assert_array_equal(np.asarray(x[idx]), a[[1, 0]])
    {x: 1}  # tensors are hashable (identity)


def test_repr_shows_values():
    r = repr(c([[1.0, 2.0], [3.0, 4.5]]))
    assert r == "Tensor([  1   2\n   3 4.5], dtype=DType.float32, device=Device(type=cpu,id=0))"
    assert repr(Tensor(7, dtype=DType.bfloat16, device=CPU_)).startswith("Tensor(7, dtype=DType.bfloat16")


# -- realization ----------------------------------------------------------------------
def test_eager_ops_are_realized():
    x = c([1.0, 2.0]) + 1
    assert x.real
    assert x.driver_tensor.to_numpy().tolist() == [2.0, 3.0]


def test_lazy_realization_semantics():
    g = T.GRAPH
    x = c([1.0, 2.0, 3.0])
    with T.lazy():
        a = x * 2
        b = a + 1
        dead = a - 100
        e = F.exp(b)
    assert not a.real and not b.real and not e.real
    assert a in g.unrealized and b in g.unrealized
    assert any(s is x for s in g.sources.values()) or x._value in g.sources
    with pytest.raises(RuntimeError, match="unrealized"):
        _ = b.driver_tensor
    # metadata does not realize
    assert b.shape == Shape([3]) and b.dtype == DType.float32 and b.device == CPU_ and not b.real
    del dead
    gc.collect()
    np.testing.assert_allclose(np.asarray(b), [3.0, 5.0, 7.0])  # needs the value: realizes
    # evaluate realized every live unrealized tensor; the graph is emptied
    assert a.real and b.real and e.real
    assert len(g.unrealized) == 0 and not g.sources
    assert len(g.graph._nodes) == len(g.graph._base_nodes)
    np.testing.assert_allclose(np.asarray(e), np.exp([3.0, 5.0, 7.0]), rtol=1e-6)
    # an unrealized tensor realizes through .realize and evaluate()
    with T.lazy():
        d = b * b
    assert d.realize is d and d.real
    with T.lazy():
        f = d + 1
    asyncio.run(g.evaluate(f))
    assert f.real and f.driver_tensor.to_numpy().tolist() == [10.0, 26.0, 50.0]


def test_unrealized_input_makes_ops_lazy_and_mixed_chains():
    with T.lazy():
        a = c([1.0, 2.0]) + 1
    b = a * 3  # outside lazy(), but a is unrealized: staged too
    assert not b.real
    assert b.item() if False else np.asarray(b).tolist() == [6.0, 9.0]
    assert (b + 1).real  # realized inputs again run eagerly


def test_tensor_constructor_and_from_tensor_value():
    buf = Buffer.from_numpy(np.arange(3, dtype=np.float32))
    t = Tensor(storage=buf)
    assert t.real and t.driver_tensor is buf
    with T.lazy():
        v = (t + 1)._value
    u = Tensor.from_tensor_value(v)
    assert np.asarray(u).tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(TypeError):
        Tensor()
    with Graph("other", input_types=[TensorType(DType.float32, [3], DeviceRef.CPU())]) as g:
        with pytest.raises(ValueError, match="compute graph"):
            Tensor.from_tensor_value(g.inputs[0].tensor)


def test_compute_graph_members():
    cg = ComputeGraph(seed=3)
    assert isinstance(cg.graph, Graph) and cg.seed == 3 and not cg.sources and len(cg.unrealized) == 0
    x = c([1.0])
    cg.add_source(x)
    assert len(cg.sources) == 1 and list(cg.sources.values())[0] is x
    cg2 = ComputeGraph(sources=[x])
    assert len(cg2.sources) == 1
    with T.lazy():
        lz = x + 1
    with pytest.raises(ValueError, match="unrealized"):
        cg.add_source(lz)
    lz.realize


# -- defaults ---------------------------------------------------------------------------
def test_defaults_cpu_float32_without_accelerator():
    if driver.accelerator_count():
        dt, dev = T.defaults()
        assert dt == DType.bfloat16 and not dev.devices[0].is_host
    else:
        assert T.defaults() == (DType.float32, DeviceMesh.single(CPU_))
        t = Tensor.ones((2,))
        assert t.dtype == DType.float32 and t.device == CPU_
    assert T.defaults(DType.int8, CPU_) == (DType.int8, DeviceMesh.single(CPU_))
    assert T.defaults(None, CPU_) == (DType.float32, DeviceMesh.single(CPU_))
    assert T.defaults(device=DeviceRef.CPU()) [1] == DeviceMesh.single(CPU_)


def test_default_dtype_and_device_context_managers():
    with T.default_dtype(DType.float64):
        assert Tensor.zeros((2,), device=CPU_).dtype == DType.float64
        with T.default_device(CPU_):
            assert T.defaults() == (DType.float64, DeviceMesh.single(CPU_))
        with T.default_dtype(DType.int32):
            assert Tensor.arange(3, device=CPU_).dtype == DType.int32
    assert Tensor.zeros((2,), device=CPU_).dtype == DType.float32
    with pytest.raises(TypeError):
        T.default_dtype("float32")
    with pytest.raises(TypeError):
        T.default_device("cpu")


def test_contextvar_context_restores_and_is_per_context():
    var: contextvars.ContextVar[int] = contextvars.ContextVar("v", default=0)
    with T.contextvar_context(var, 5):
        assert var.get() == 5
        with T.contextvar_context(var, 6):
            assert var.get() == 6
        assert var.get() == 5
    assert var.get() == 0
    with pytest.raises(KeyError):
        with T.contextvar_context(var, 9):
            raise KeyError
    assert var.get() == 0

    async def task(dt):
        with T.default_dtype(dt):
            await asyncio.sleep(0)
            return Tensor.zeros((1,), device=CPU_).dtype

    async def main():
        return await asyncio.gather(task(DType.float64), task(DType.int8))

    assert asyncio.run(main()) == [DType.float64, DType.int8]


# -- devices ---------------------------------------------------------------------------
def test_ops_on_tensors_from_different_devices_fail_at_the_call():
    x = c([1.0, 2.0])
    with T.lazy():  # a tensor typed on a GPU (never realized: the type rule rejects it first)
        g = Tensor.from_tensor_value(F.constant(np.ones(2, np.float32), DType.float32, DeviceRef.GPU())._value)
    assert g.type.device == DeviceRef.GPU() and not g.real
    for bad in (lambda: x + g, lambda: F.matmul(x, g), lambda: F.where(c([True, False], DType.bool), x, g)):
        with pytest.raises(ValueError, match="^Input values must be on the same device\n    "):
            bad()


@pytest.mark.gpu
def test_gpu_tensors():
    gpu = driver.Accelerator()
    assert T.defaults() == (DType.bfloat16, DeviceMesh.single(gpu))
    x = Tensor.ones((2, 3), dtype=DType.float32, device=gpu)
    y = x + 1
    assert y.device == gpu and y.real
    np.testing.assert_array_equal(np.asarray(y.to(CPU_)), np.full((2, 3), 2.0))
    with pytest.raises(ValueError, match="different devices"):
        y + c(np.ones((2, 3)))
    with T.lazy():
        z = (y * 2).to(CPU_)
    np.testing.assert_array_equal(np.asarray(z), np.full((2, 3), 4.0))
    assert Tensor.ones((2,)).dtype == DType.bfloat16
