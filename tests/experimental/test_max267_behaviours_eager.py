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
