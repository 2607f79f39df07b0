"""MAX 26.7 behaviours of eager tensors, ``max.experimental.random`` / ``ops.random`` and control flow
(``../shared/max-behaviours.md`` B12, B13, B14, B15): each test names its fact."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from max.driver import CPU
from max.dtype import DType
from max.experimental import functional as F
from max.experimental.tensor import Tensor

CPU_ = CPU()
DEV = "device=Device(type=cpu,id=0)"


def T(data, dtype=DType.float32):
    return Tensor(data, dtype=dtype, device=CPU_)


# ----------------------------------------------------------------------------- B14 eager Tensor
def test_B14_1_repr_form_and_str_equals_repr():
    t = T([1, 2, 3], DType.int32)
    assert repr(t) == f"Tensor([1 2 3], dtype=DType.int32, {DEV})"
    assert str(t) == repr(t)


@pytest.mark.parametrize("value,text", [
    (1.0, "1"), (1.2345, "1.235"), (-0.0, "-0"), (1.23456e-5, "1.235e-05"), (1e10, "1e+10"),
    (float("nan"), "nan"), (float("inf"), "inf"), (-float("inf"), "-inf"), (0.5, "0.5"),
])
def test_B14_2_float_cells_use_4g(value, text):
    assert repr(T(value)) == f"Tensor({text}, dtype=DType.float32, {DEV})"
    # the same text as Python's own '{:.4g}' of the float32 value
    assert text == "{:.4g}".format(float(np.float32(value)))


def test_B14_2_cells_right_aligned_to_widest_of_whole_tensor():
    t = T([[1, 2], [3, 1000]], DType.int64)
    assert repr(t) == f"Tensor([   1    2\n    3 1000], dtype=DType.int64, {DEV})"
    # bfloat16 / float16 print through float32, with the same 4g rule
    assert repr(T([0.5, 3.0], DType.bfloat16)) == f"Tensor([0.5   3], dtype=DType.bfloat16, {DEV})"
    assert repr(T([1, 2], DType.uint8)) == f"Tensor([1 2], dtype=DType.uint8, {DEV})"


def test_B14_3_rank0_rank1_empty():
    assert repr(T(42.5)) == f"Tensor(42.5, dtype=DType.float32, {DEV})"
    assert repr(T(True, DType.bool)) == f"Tensor(True, dtype=DType.bool, {DEV})"
    assert repr(T([1.2345, 2.5, 100])) == f"Tensor([1.235   2.5   100], dtype=DType.float32, {DEV})"
    assert repr(T(np.zeros((0,), np.float32))) == f"Tensor([], dtype=DType.float32, {DEV})"
    assert repr(T(np.zeros((0, 3), np.float32))) == f"Tensor([], dtype=DType.float32, {DEV})"


def test_B14_4_rank2_rows():
    assert repr(T([[-1, 2], [3, -4]], DType.int32)) == f"Tensor([-1  2\n  3 -4], dtype=DType.int32, {DEV})"
    assert repr(T([[True, False], [False, True]], DType.bool)) == \
        f"Tensor([ True False\n False  True], dtype=DType.bool, {DEV})"
    assert repr(T([[1, 2, 3]], DType.int32)).startswith("Tensor([1 2 3], ")
    assert repr(T([[1], [2], [3]], DType.int32)).startswith("Tensor([1\n 2\n 3], ")


def test_B14_5_rank3_side_by_side():
    t = T(np.arange(1, 9).reshape(2, 2, 2), DType.int32)
    assert repr(t) == f"Tensor([1 2 | 5 6\n 3 4 | 7 8], dtype=DType.int32, {DEV})"
    assert repr(T([[[5]]], DType.int32)).startswith("Tensor([5], ")


def test_B14_6_rank4_blocks():
    t = T(np.arange(16).reshape(2, 2, 2, 2), DType.int32)
    assert repr(t) == ("Tensor([ 0  1 |  4  5\n  2  3 |  6  7\n \n  8  9 | 12 13\n 10 11 | 14 15], "
                       f"dtype=DType.int32, {DEV})")


def test_B14_7_no_truncation():
    t = T(np.arange(1000), DType.int32)
    r = repr(t)
    assert "..." not in r
    body = r[len("Tensor(["):r.index("]")]
    assert [int(c) for c in body.split()] == list(range(1000))


def test_B14_eager_repr_is_used_for_lazy_and_computed_tensors():
    from max.experimental.tensor import lazy

    with lazy():
        t = T([[1.0, 2.0], [3.0, 4.0]]) * 2
    assert repr(t) == f"Tensor([2 4\n 6 8], dtype=DType.float32, {DEV})"
    assert repr([T(1.0)]) == f"[Tensor(1, dtype=DType.float32, {DEV})]"


def test_B14_8_F_print_eager(capsys):
    t = T([[1.0, 1.0], [1.0, 1.0]])
    F.print(t, "eager_tensor")
    assert capsys.readouterr().out == f"Tensor eager_tensor= {t!r}\n"
    F.print(t)
    assert capsys.readouterr().out == f"Tensor debug_tensor= {t!r}\n"


def test_B14_8_F_print_in_graph_still_stages_the_op():
    from max.graph import DeviceRef, Graph, TensorType

    with Graph("p", input_types=[TensorType(DType.float32, [2], DeviceRef.CPU())]) as g:
        before = len(g._nodes)
        assert F.print(g.inputs[0].tensor, "lbl") is None
        assert any(n.op == "print" for n in g._nodes[before:])


def test_B14_9_sync_realize():
    from max.experimental.tensor import lazy

    with lazy():
        t = T([1.0, 2.0]) + 1
    assert not t.real
    assert t._sync_realize() is None
    assert t.real
    np.testing.assert_array_equal(t.to_numpy(), [2.0, 3.0])


def test_B14_10_values_generator():
    t = T([[1, 2, 3], [4, 5, 6]])
    gen = t.sum(axis=-1)._values()
    assert not isinstance(gen, list) and iter(gen) is gen
    assert list(gen) == [6.0, 15.0]
    vals = list(T([[1, 2], [3, 4]], DType.int32).transpose(0, 1)._values())
    assert vals == [1, 3, 2, 4] and all(type(v) is int for v in vals)
    assert list(T([True, False], DType.bool)._values()) == [True, False]


def test_B14_17_constant_is_deprecated():
    with pytest.warns(DeprecationWarning, match=r"^Tensor\.constant\(\) is deprecated\. Use Tensor\(value, "
                      r"dtype=dtype, device=device\)"):
        t = Tensor.constant(1, device=CPU_)
    assert t.item() == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        Tensor(1, dtype=DType.float32, device=CPU_)  # the replacement does not warn
        Tensor([1, 2])


# ----------------------------------------------------------------------------- B13 eager control flow
def test_B13_3_eager_cond_returns_a_list():
    pred = T(True, DType.bool)
    out_t = T(0.0).type

    def then_fn():
        return F.mul(F.constant(21.0, DType.float32, CPU_), 2)

    def else_fn():
        return F.negate(F.constant(42.0, DType.float32, CPU_))

    res = F.cond(pred, [out_t], then_fn, else_fn)
    assert isinstance(res, list) and len(res) == 1 and isinstance(res[0], Tensor)
    assert res[0].item() == 42.0
    assert F.cond(T(False, DType.bool), [out_t], then_fn, else_fn)[0].item() == -42.0
    two = F.cond(pred, [out_t, out_t], lambda: (T(1.0), T(2.0)), lambda: (T(3.0), T(4.0)))
    assert [t.item() for t in two] == [1.0, 2.0]
    with pytest.raises(ValueError, match="returned 1 value"):
        F.cond(pred, None, then_fn, else_fn)


def test_B13_4_eager_cond_with_no_results():
    seen = []
    assert F.cond(T(True, DType.bool), None, lambda: seen.append("then"), lambda: seen.append("else")) == []
    assert F.cond(T(False, DType.bool), None, lambda: seen.append("then"), lambda: seen.append("else")) == []
    assert seen == ["then", "else"]


# ----------------------------------------------------------------------------- B14.16 mesh / placements
def test_B14_16_ordinary_tensor_mesh_and_placements():
    from max.experimental.sharding import DeviceMesh, Replicated

    t = T([1.0, 2.0])
    assert repr(t.mesh) == "DeviceMesh(_=1)"
    assert t.mesh == DeviceMesh.single(CPU_) and t.mesh.devices == (CPU_,)
    assert t.placements == (Replicated(),)
    # a distributed tensor keeps its own
    from max.experimental.sharding import PlacementMapping, Sharded, distribute

    mesh = DeviceMesh(devices=(CPU_, CPU_), mesh_shape=(2,), axis_names=("tp",))
    d = distribute(T(np.arange(4.0)), PlacementMapping(mesh, (Sharded(0),)))
    assert d.mesh == mesh and d.placements == (Sharded(0),)


# ----------------------------------------------------------------------------- B15 functional collectives
def test_B15_2_functional_graph_collectives_on_one_cpu():
    from max.graph import ops

    t = T(np.arange(8, dtype=np.float32).reshape(2, 4))
    signal = Tensor.zeros([], device=CPU_)
    for op in (ops.allgather, ops.allreduce.sum):
        out = F.functional(op)([t], [signal])
        assert isinstance(out, list) and len(out) == 1
        assert out[0].real and list(out[0].shape) == [2, 4]
        np.testing.assert_array_equal(out[0].to_numpy(), np.arange(8).reshape(2, 4))


def test_B15_2_graph_signal_must_be_a_buffer():
    from max.graph import BufferType, DeviceRef, Graph, TensorType, ops

    tt = TensorType(DType.float32, [2, 4], DeviceRef.CPU())
    with Graph("g", input_types=[tt, TensorType(DType.float32, [], DeviceRef.CPU()),
                                 BufferType(DType.float32, [], DeviceRef.CPU())]) as g:
        x, sig_t, sig_b = g.inputs[0].tensor, g.inputs[1].tensor, g.inputs[2].buffer
        for op in (ops.allgather, ops.allreduce.sum):
            with pytest.raises(TypeError, match=r"^BufferValue\(\) argument must be an mlir\.Value of buffer type "
                               r"or a graph\.BufferValue, not 'TensorValue'"):
                op([x], [sig_t])
            assert op([x], [sig_b])[0].type == tt


def test_B15_3_signatures():
    import inspect

    from max.graph import ops

    assert list(inspect.signature(F.allgather).parameters) == ["t", "tensor_axis", "mesh_axis"]
    assert [p.default for p in inspect.signature(F.allgather).parameters.values()][1:] == [0, 0]
    assert list(inspect.signature(F.allreduce_sum).parameters) == ["t", "mesh_axis"]
    assert inspect.signature(ops.allgather).parameters["group_size"].default is None
    assert inspect.signature(ops.allreduce.sum).parameters["group_size"].default is None
    sig = inspect.signature(F.functional)
    assert list(sig.parameters) == ["graph_op", "rule"]
    assert sig.parameters["rule"].default is None


def _mesh(n=2):
    from max.experimental.sharding import DeviceMesh

    return DeviceMesh(devices=(CPU_,) * n, mesh_shape=(n,), axis_names=("tp",))


def test_B15_3_allgather_of_a_sharded_tensor():
    from max.experimental.sharding import PlacementMapping, Replicated, Sharded, distribute

    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    for axis in (0, 1):
        d = distribute(T(a), PlacementMapping(_mesh(), (Sharded(axis),)))
        g = F.allgather(d, tensor_axis=axis)
        assert g.placements == (Replicated(),)
        for local in g.local_shards:
            np.testing.assert_array_equal(local.to_numpy(), a)
        np.testing.assert_array_equal(g.full_tensor().to_numpy(), a)
    plain = T(a)
    assert F.allgather(plain) is plain
    with pytest.raises(ValueError, match="tensor_axis"):
        F.allgather(plain, tensor_axis=2)


def test_B15_3_allreduce_sum_of_partials():
    from max.experimental.sharding import Partial, PlacementMapping, Replicated, distribute

    a = np.arange(6, dtype=np.float64).reshape(2, 3)
    d = distribute(T(a, DType.float64), PlacementMapping(_mesh(3), (Partial(),)))
    parts = [s.to_numpy() for s in d.local_shards]
    r = F.allreduce_sum(d)
    assert r.placements == (Replicated(),)
    for local in r.local_shards:
        np.testing.assert_allclose(local.to_numpy(), sum(parts))
    np.testing.assert_allclose(r.full_tensor().to_numpy(), a)
    with pytest.raises(ValueError, match="partial"):
        F.allgather(d)


def test_B15_3_grouped_graph_collectives():
    from max.graph import BufferType, DeviceRef, Graph, TensorType, ops
    from max.engine import InferenceSession
    from max.driver import Buffer

    tt = TensorType(DType.float32, [2], DeviceRef.CPU())
    bt = BufferType(DType.uint8, [4], DeviceRef.CPU())
    with Graph("g", input_types=[tt] * 4 + [bt] * 4) as g:
        xs = [v.tensor for v in g.inputs[:4]]
        sigs = [v.buffer for v in g.inputs[4:]]
        sums = ops.allreduce.sum(xs, sigs, group_size=2)
        gathered = ops.allgather(xs, sigs, axis=0, group_size=2)
        assert [v.shape[0] for v in gathered] == [4, 4, 4, 4]
        with pytest.raises(ValueError, match="group_size=3"):
            ops.allgather(xs, sigs, group_size=3)
        g.output(*sums, *gathered)
    vals = [np.array([i, 10 * i], np.float32) for i in range(1, 5)]
    outs = InferenceSession().load(g).execute(*[Buffer.from_numpy(v) for v in vals],
                                               *[Buffer.from_numpy(np.zeros(4, np.uint8)) for _ in range(4)])
    got = [o.to_numpy() for o in outs]
    for i in range(4):
        grp = vals[0:2] if i < 2 else vals[2:4]
        np.testing.assert_array_equal(got[i], grp[0] + grp[1])
        np.testing.assert_array_equal(got[4 + i], np.concatenate(grp))


def test_B15_3_functional_with_a_sharding_rule():
    from max.experimental.sharding import PlacementMapping, Sharded, distribute
    from max.graph import ops

    calls = []

    def rule(x):
        calls.append(x.placements)
        return x.placements  # elementwise: the result is laid out like x

    neg = F.functional(ops.negate, rule=rule)
    d = distribute(T(np.arange(6.0)), PlacementMapping(_mesh(), (Sharded(0),)))
    r = neg(d)
    assert calls == [(Sharded(0),)] and r.placements == (Sharded(0),)
    np.testing.assert_array_equal(r.full_tensor().to_numpy(), -np.arange(6.0))


def test_tensor_from_data_inside_a_compiled_forward_is_a_traced_constant():
    """``Tensor(data)`` inside ``Module.compile`` stands for a constant of the traced graph (and is not
    left behind as an unrealized tensor of the eager compute graph)."""
    from max.experimental.nn import Module
    from max.experimental.tensor import GRAPH
    from max.graph import DeviceRef, TensorType

    class AddConst(Module):
        def forward(self, x):
            return x + Tensor([1.0, 2.0], dtype=DType.float32, device=CPU_)

    c = AddConst().compile(TensorType(DType.float32, [2], DeviceRef.CPU()))
    assert not any(t._symbolic for t in GRAPH.unrealized)
    np.testing.assert_array_equal(c(T([10.0, 20.0])).to_numpy(), [11.0, 22.0])
    np.testing.assert_array_equal((T([1.0, 1.0]) * 3).to_numpy(), [3.0, 3.0])  # eager still works


def test_B17_5_eager_item_has_the_buffer_text():
    with pytest.raises(ValueError, match=r"^calling `item` on a tensor with 2 items but expected only 1"):
        T([1.0, 2.0]).item()
    assert T([[3.0]]).item() == 3.0
