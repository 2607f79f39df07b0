"""max.experimental.random: distributions, reproducibility, errors, graph-level *_like."""

from __future__ import annotations

import numpy as np
import pytest

from max.driver import CPU, Buffer
from max.dtype import DType
from max.engine import InferenceSession
from max.experimental import random
from max.experimental import tensor as T
from max.experimental.tensor import Tensor
from max.graph import DeviceRef, Graph, Shape, TensorType

CPU_ = CPU()


def test_gaussian_statistics_and_defaults():
    random.seed(0)
    t = random.gaussian((200, 100), mean=3.0, std=2.0, dtype=DType.float32, device=CPU_)
    a = np.asarray(t)
    assert t.shape == Shape([200, 100]) and t.dtype == DType.float32
    assert abs(a.mean() - 3.0) < 0.05 and abs(a.std() - 2.0) < 0.05
    s = random.gaussian()
    assert s.rank == 0 and s.dtype == T.defaults()[0]
    n = random.normal((10,), device=CPU_)
    assert n.shape == Shape([10]) and random.normal is random.gaussian


def test_uniform_range_half_open():
    random.seed(1)
    a = np.asarray(random.uniform((100, 100), range=(-2, 5), dtype=DType.float32, device=CPU_))
    assert a.min() >= -2 and a.max() < 5 and abs(a.mean() - 1.5) < 0.1
    b = np.asarray(random.uniform((4096,), range=(0, 1), dtype=DType.bfloat16, device=CPU_).cast(DType.float32))
    assert b.min() >= 0 and b.max() < 1
    d = np.asarray(random.uniform((5,), dtype=DType.float64, device=CPU_))
    assert d.dtype == np.float64


def test_seed_reproducible():
    random.seed(123)
    a = np.asarray(random.gaussian((5,), device=CPU_))
    b = np.asarray(random.uniform((5,), device=CPU_))
    random.seed(123)
    assert np.array_equal(np.asarray(random.gaussian((5,), device=CPU_)), a)
    assert np.array_equal(np.asarray(random.uniform((5,), device=CPU_)), b)
    c = np.asarray(random.gaussian((5,), device=CPU_))
    assert not np.array_equal(c, a)  # successive draws differ
    random.seed(124)
    assert not np.array_equal(np.asarray(random.gaussian((5,), device=CPU_)), a)


def test_lazy_random_is_reproducible_too():
    random.seed(7)
    eager = np.asarray(random.gaussian((4,), device=CPU_))
    random.seed(7)
    with T.lazy():
        lz = random.gaussian((4,), device=CPU_)
    assert not lz.real
    np.testing.assert_array_equal(np.asarray(lz), eager)


@pytest.mark.parametrize("std", [0, -1.0])
def test_gaussian_bad_std(std):
    with pytest.raises(ValueError, match="std"):
        random.gaussian((2,), std=std, device=CPU_)
    with pytest.raises(ValueError, match="std"):
        random.gaussian_like(TensorType(DType.float32, [2], DeviceRef.CPU()), std=std)


@pytest.mark.parametrize("rng", [(1, 1), (2, 1), (0,), (0, 1, 2), ()])
def test_uniform_bad_range(rng):
    with pytest.raises(ValueError, match="range"):
        random.uniform((2,), range=rng, device=CPU_)


def test_like_functions_inside_a_graph():
    tt = TensorType(DType.float32, ["n", 3], DeviceRef.CPU())
    with Graph("unseeded", input_types=[tt]) as g:
        with pytest.raises(RuntimeError, match=r"No seed set! Set with `ops.random.set_seed`\."):
            random.gaussian_like(g.inputs[0].tensor.type)
    from max.graph import ops

    with Graph("r", input_types=[tt, ops.random.SeedType(DeviceRef.CPU())]) as g:
        x = g.inputs[0].tensor
        ops.random.set_seed(g.inputs[1].tensor)
        z = random.gaussian_like(x.type, mean=1.0, std=0.5)
        u = random.uniform_like(x.type, range=(2, 3))
        n = random.normal_like(x.type)
        assert z.type == tt and u.type == tt
        g.output(z, u, n)
    m = InferenceSession().load(g)
    zeros = Buffer.from_numpy(np.zeros((1000, 3), np.float32))
    seed5 = Buffer.from_numpy(np.array([5], np.uint64))
    outs = [o.to_numpy() for o in m.execute(zeros, seed5)]
    assert outs[0].shape == (1000, 3) and abs(outs[0].mean() - 1.0) < 0.05
    assert outs[1].min() >= 2 and outs[1].max() < 3
    again = [o.to_numpy() for o in m.execute(zeros, seed5)]
    np.testing.assert_array_equal(again[0], outs[0])
    assert not np.array_equal(outs[0], outs[2])
    other = m.execute(zeros, Buffer.from_numpy(np.array([6], np.uint64)))[0].to_numpy()
    assert not np.array_equal(other, outs[0])


def test_like_with_tensor_mean():
    mean = Tensor.constant([0.0, 100.0], dtype=DType.float32, device=CPU_)
    t = random.gaussian_like(TensorType(DType.float32, [500, 2], DeviceRef.CPU()), mean=mean, std=1.0)
    a = np.asarray(t)
    assert abs(a[:, 0].mean()) < 0.2 and abs(a[:, 1].mean() - 100) < 0.2
    # integer dtypes take the float samples cast (max-behaviours.md B12.6)
    i = random.gaussian((2000,), mean=10.0, std=2.0, dtype=DType.int32, device=CPU_)
    assert i.dtype == DType.int32 and abs(np.asarray(i).mean() - 9.5) < 0.3
