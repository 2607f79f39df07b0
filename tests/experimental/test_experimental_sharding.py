"""max.experimental.sharding in one process: meshes of several CPU slots, placements, mappings and
their conversions, distribution and gathering (numpy array_split as the reference), per-op dispatch
and the reshard policy of ``mode``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from max.driver import CPU
from max.dtype import DType
from max.experimental import functional as F
from max.experimental.sharding import (
    ConversionError,
    DeviceMesh,
    DistributedTensor,
    GreedyReshard,
    NamedMapping,
    Partial,
    PlacementMapping,
    ReduceOp,
    Replicated,
    ReshardError,
    ReshardWarning,
    Sharded,
    mode,
)
from max.experimental.tensor import Tensor

CPU_ = CPU()


def mesh1(n=2):
    return DeviceMesh(devices=(CPU_,) * n, mesh_shape=(n,), axis_names=("tp",))


def test_mesh_and_placements():
    m = DeviceMesh(devices=(CPU_,) * 6, mesh_shape=(2, 3), axis_names=("dp", "tp"))
    assert m.ndim == 2 and m.num_devices == 6 and m.axis_size("tp") == 3 and m.axis_index("dp") == 0
    assert list(m.coords())[:4] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    with pytest.raises(ValueError, match="does not hold 6 devices"):
        DeviceMesh(devices=(CPU_,) * 6, mesh_shape=(4,))
    with pytest.raises(ValueError, match="no axis named 'pp'"):
        m.axis_index("pp")
    assert Replicated() is Replicated()
    assert Sharded(1) == Sharded(1) and Sharded(1) != Sharded(0)
    assert [int(d) for d in Sharded(0).local_dim(7, m, 1)] == [3, 2, 2]
    assert int(Sharded(0).global_dim([3, 2, 2])) == 7
    assert Partial().reduce_op is ReduceOp.SUM


def test_mapping_conversions():
    m = DeviceMesh(devices=(CPU_,) * 4, mesh_shape=(2, 2), axis_names=("dp", "tp"))
    pm = PlacementMapping(m, (Sharded(0), Sharded(1)))
    nm = pm.to_named_sharding(2)
    assert nm.spec == ("dp", "tp") and nm.to_placements() == (Sharded(0), Sharded(1))
    assert PlacementMapping(m, (Replicated(), Replicated())).is_fully_replicated
    assert NamedMapping(m, (None, ("dp", "tp"))).to_placements() == (Sharded(1), Sharded(1))
    with pytest.raises(ConversionError):
        PlacementMapping(m, (Partial(), Replicated())).to_named_sharding(2)
    with pytest.raises(ValueError, match="one Placement per mesh axis"):
        PlacementMapping(m, (Sharded(0),))


@given(data=st.data())
def test_distribute_and_gather_round_trip(data):
    rows, cols = data.draw(st.integers(1, 7)), data.draw(st.integers(1, 7))
    x = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
    m = DeviceMesh(devices=(CPU_,) * 4, mesh_shape=(2, 2), axis_names=("a", "b"))
    placements = tuple(data.draw(st.sampled_from([Replicated(), Sharded(0), Sharded(1), Partial()]))
                       for _ in range(2))
    d = F.transfer_to(Tensor(x), PlacementMapping(m, placements))
    assert isinstance(d, DistributedTensor) and d.placements == placements
    assert list(map(int, d.shape)) == [rows, cols]
    np.testing.assert_array_equal(d.to_numpy(), x)
    # the local shards are numpy.array_split pieces along each sharded axis
    for coord, shard in zip(m.coords(), d.local_shards):
        want = x
        for ax, p in enumerate(placements):
            if isinstance(p, Sharded):
                want = np.array_split(want, m.mesh_shape[ax], axis=p.axis)[coord[ax]]
            elif isinstance(p, Partial) and coord[ax]:
                want = np.zeros_like(want)
        np.testing.assert_array_equal(shard.to_numpy(), want)


def test_documented_example_matmul_relu():
    m = mesh1()
    a = F.transfer_to(F.full([4, 8], 1.0, dtype=DType.float32, device=m.devices[0]),
                      PlacementMapping(m, (Sharded(1),)))
    b = F.transfer_to(F.full([8, 2], 1.0, dtype=DType.float32, device=m.devices[0]),
                      PlacementMapping(m, (Sharded(0),)))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with mode(GreedyReshard(on_reshard="warn")):
            y = F.relu(F.matmul(a, b))
    assert any(issubclass(x.category, ReshardWarning) for x in w)
    assert y.placements == (Replicated(),)
    np.testing.assert_array_equal(y.to_numpy(), np.full((4, 2), 8.0))
    with mode(GreedyReshard(on_reshard="error")):
        with pytest.raises(ReshardError, match="all-reduce"):
            F.matmul(a, b)


def test_op_rules_and_values():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((6, 4)).astype(np.float32)
    m = mesh1(3)
    rows = PlacementMapping(m, (Sharded(0),))
    dx, dy = F.transfer_to(Tensor(x), rows), F.transfer_to(Tensor(y), rows)
    s = dx * dy + 1.0  # elementwise on equal placements: stays sharded, no reshard
    with mode(GreedyReshard(on_reshard="error")):
        s = F.relu(dx * dy + 1.0)
    assert s.placements == (Sharded(0),)
    np.testing.assert_allclose(s.to_numpy(), np.maximum(x * y + 1, 0), rtol=1e-6)
    w = rng.standard_normal((4, 5)).astype(np.float32)
    dw = F.transfer_to(Tensor(w), PlacementMapping(m, (Replicated(),)))
    r = dx @ dw  # row-sharded @ replicated stays row-sharded
    assert r.placements == (Sharded(0),)
    np.testing.assert_allclose(r.to_numpy(), x @ w, rtol=1e-5, atol=1e-5)
    sm = F.softmax(dx, axis=0)  # any other op: replicate first, then run on every device
    assert sm.placements == (Replicated(),)
    e = np.exp(x - x.max(0))
    np.testing.assert_allclose(sm.to_numpy(), e / e.sum(0), rtol=1e-5)
    with pytest.raises(ValueError, match="mixing distributed and ordinary tensors"):
        dx + Tensor(y)
    other = F.transfer_to(Tensor(x), PlacementMapping(mesh1(2), (Sharded(0),)))
    with pytest.raises(ValueError, match="different meshes"):
        dx + other
    # an ordinary tensor: one device, whole (max-behaviours.md B14.16)
    assert Tensor(x).sharding is None and Tensor(x).placements == (Replicated(),) and len(Tensor(x).local_shards) == 1
    assert Tensor(x).mesh == DeviceMesh.single(CPU_)
