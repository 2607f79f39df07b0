"""Dims, shapes and types."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from max.dtype import DType
from max.graph import (
    AlgebraicDim,
    BufferType,
    ConvInputLayout,
    DeviceKind,
    DeviceRef,
    Dim,
    FilterLayout,
    Shape,
    StaticDim,
    SymbolicDim,
    TensorType,
)


def test_dim_conversion():
    assert isinstance(Dim(3), StaticDim) and Dim(3) == 3 and str(Dim(3)) == "3"
    assert isinstance(Dim("batch"), SymbolicDim) and Dim("batch") == "batch"
    d = Dim("x")
    assert Dim(d) is d
    with pytest.raises(TypeError, match="Dim: expected an int, str or Dim, got float"):
        Dim(2.5)
    with pytest.raises(ValueError, match="^Invalid name for symbolic dimension"):
        SymbolicDim("2bad")


def test_algebraic_canonical_form_and_printing():
    assert isinstance(Dim("batch") * 5, AlgebraicDim)
    assert str(Dim("batch") * 5) == "batch * 5"
    assert -Dim("x") - 4 == -(Dim("x") + 4)
    assert Dim("a") + Dim("b") == Dim("b") + Dim("a")
    assert (Dim("s") + 1) * 2 == Dim("s") * 2 + 2
    assert Dim("x") - Dim("x") == 0 and isinstance(Dim("x") - Dim("x"), StaticDim)
    assert Dim(3) * 4 + 1 == 13 and isinstance(Dim(3) * 4, StaticDim)
    assert (Dim("s") * 4) // 2 == Dim("s") * 2
    assert str(Dim("s") // 2) == "s // 2"
    assert AlgebraicDim(Dim("batch") + 1) == Dim("batch") + 1
    assert [p.name for p in (Dim("a") * Dim("b") + 1).parameters] == ["a", "b"]


@given(a=st.integers(1, 50), b=st.integers(1, 50), k=st.integers(-5, 5), m=st.integers(1, 7))
def test_algebraic_evaluation_matches_python(a, b, k, m):
    e = (Dim("a") * Dim("b") + k) * m - Dim("a") // m
    assert e.evaluate({"a": a, "b": b}) == (a * b + k) * m - a // m


def test_shape():
    s = Shape([2, "batch", Dim("batch") * 2])
    assert s.rank == 3 and str(s) == repr(s) == "[Dim(2), Dim('batch'), Dim('batch * 2')]"  # MAX's form
    assert s.to_mlir() == "[2, batch, batch * 2]"
    assert s == [2, "batch", Dim("batch") * 2] and s == (2, "batch", Dim("batch") * 2)
    assert s.static_dims == [2]
    assert not Shape.is_static(s) and Shape.is_static(Shape([1, 2]))
    assert [p.name for p in s.parameters] == ["batch"]
    assert repr(Shape([2, 2])) == "[Dim(2), Dim(2)]"
    assert s.evaluate({"batch": 3}) == (2, 3, 6)


def test_device_ref():
    assert str(DeviceRef.GPU()) == "gpu:0" and str(DeviceRef.CPU(id=1)) == "cpu:1"
    assert DeviceRef.CPU() == DeviceRef("cpu") and hash(DeviceRef.CPU()) == hash(DeviceRef(DeviceKind.CPU, 0))
    assert DeviceRef.GPU(1).is_gpu() and not DeviceRef.GPU(1).is_cpu()
    assert DeviceKind.from_string("GPU") is DeviceKind.GPU
    with pytest.raises(ValueError, match="unknown device kind"):
        DeviceKind.from_string("tpu")
    from max import driver

    assert DeviceRef.from_device(driver.CPU()) == DeviceRef.CPU()
    assert DeviceRef.CPU().to_device() == driver.CPU()
    assert DeviceRef.from_mlir("gpu:2") == DeviceRef.GPU(2)


def test_tensor_and_buffer_types():
    t = TensorType(DType.float32, (2, 3))
    assert t.dtype is DType.float32 and str(t.shape) == "[Dim(2), Dim(3)]" and t.device == DeviceRef.CPU()
    assert t.rank == 2
    assert t == TensorType(DType.float32, [2, 3], DeviceRef.CPU())
    b = t.as_buffer()
    assert isinstance(b, BufferType) and b.as_tensor() == t and b != t
    assert TensorType(DType.int64, ("batch", 10), device=DeviceRef.CPU()).to_mlir() == "tensor<int64, [batch, 10], cpu:0>"
    assert str(TensorType(DType.int64, ("batch", 10), device=DeviceRef.CPU())) == (
        "TensorType(dtype=int64, shape=[Dim('batch'), Dim(10)], device=cpu:0)")
    with pytest.raises(TypeError, match="dtype must be a DType"):
        TensorType("float32", (2,))
    with pytest.raises(ValueError, match="non-negative"):
        TensorType(DType.float32, (-1,))


def test_layout_enums():
    assert ConvInputLayout.NHWC.value == "NHWC" and ConvInputLayout.from_mlir("NCHW") is ConvInputLayout.NCHW
    assert {f.value for f in FilterLayout} == {"CFRS", "FCQRS", "FCRS", "QRSCF", "RSCF"}


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_printed_dim_expressions_read_back_to_their_value(data):
    """``str(dim)`` of products, quotients and sums is unambiguous Python: evaluating the text gives
    the dim's value (a quotient's denominator and a quotient after another factor are bracketed)."""
    from max.graph.dim import Dim as D

    names = ["a", "b", "c"]
    env = {n: data.draw(st.integers(1, 40)) for n in names}
    leaf = st.one_of(st.sampled_from(names).map(D), st.integers(1, 9).map(D))

    def extend(inner):
        return st.one_of(st.tuples(inner, inner).map(lambda t: t[0] * t[1]),
                         st.tuples(inner, inner).map(lambda t: t[0] + t[1]),
                         st.tuples(inner, st.integers(1, 5)).map(lambda t: t[0] // t[1]),
                         st.tuples(inner, st.sampled_from(names)).map(lambda t: t[0] // D(t[1])))

    e = data.draw(st.recursive(leaf, extend, max_leaves=6))
    assert eval(str(e), {}, dict(env)) == e.evaluate(env), str(e)
