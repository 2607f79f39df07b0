"""max.experimental.tensor as of today's MAX: the Tensor(data, dtype, device) constructor, the
factories taking a Tensor or a type, split, clip/clamp, divmod, reductions over an axis or all
elements, and the printed form.  References: numpy (float64 where values are compared)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from max.driver import CPU, Buffer
from max.dtype import DType
from max.experimental import functional as F
from max.experimental.tensor import Tensor
from max.graph import DeviceRef, TensorType

CPU_ = CPU()


def test_constructor_forms():
    x = Tensor([[1.0, 2.0], [3.0, 4.0]])
    assert x.dtype is DType.float32 and list(x.shape) == [2, 2]
    np.testing.assert_array_equal(x.to_numpy(), [[1, 2], [3, 4]])
    s = Tensor(42, dtype=DType.int32)
    assert s.dtype is DType.int32 and s.rank == 0 and s.item() == 42
    b = Tensor([True, False])
    assert b.dtype is DType.bool
    # numpy / DLPack arrays keep their dtype and share memory
    a = np.array([1, 2, 3], dtype=np.int16)
    z = Tensor(a)
    assert z.dtype is DType.int16
    a[0] = 7
    assert z.to_numpy()[0] == 7
    t = torch.arange(4, dtype=torch.float64)
    assert Tensor(t).dtype is DType.float64
    assert Tensor(Buffer.from_numpy(np.ones(2, np.float32))).dtype is DType.float32
    # dtype given for an array: converted
    c = Tensor(np.array([1.5, 2.5]), dtype=DType.float32)
    assert c.dtype is DType.float32
    np.testing.assert_array_equal(c.to_numpy(), [1.5, 2.5])
    assert Tensor(x) is x or np.array_equal(Tensor(x).to_numpy(), x.to_numpy())
    with pytest.raises(ValueError, match="does not fit"):
        Tensor(300, dtype=DType.uint8)
    with pytest.raises(TypeError, match="data must be a number, a nested list or a DLPack array"):
        Tensor({"a": 1})
    with pytest.raises(TypeError, match="pass data"):
        Tensor()


def test_factories_take_a_tensor_or_a_type():
    x = Tensor.arange(6, dtype=DType.int64, device=CPU_).reshape([2, 3])
    np.testing.assert_array_equal(Tensor.zeros_like(x).to_numpy(), np.zeros((2, 3), np.int64))
    np.testing.assert_array_equal(Tensor.ones_like(x.type).to_numpy(), np.ones((2, 3)))
    f = Tensor.full_like(x, 5, dtype=DType.float32)
    assert f.dtype is DType.float32 and f.to_numpy().tolist() == [[5.0] * 3] * 2
    np.testing.assert_array_equal(Tensor.full([2], 3, dtype=DType.int32, device=CPU_).to_numpy(), [3, 3])
    np.testing.assert_array_equal(Tensor.arange(1, 7, 2, dtype=DType.int64, device=CPU_).to_numpy(), [1, 3, 5])
    # MAX 26.7: range_like takes a Tensor (max-behaviours.md B11.9)
    r = Tensor.range_like(Tensor.zeros([4], dtype=DType.int32, device=CPU_))
    np.testing.assert_array_equal(r.to_numpy(), np.arange(4, dtype=np.int32))
    with pytest.raises(AttributeError, match="'TensorType' object has no attribute 'layout'"):
        Tensor.range_like(TensorType(DType.int32, [4], DeviceRef.CPU()))
    with pytest.raises(TypeError, match="full_like: expected a Tensor or a TensorType"):
        Tensor.full_like([1, 2], 0)


@given(data=st.data())
def test_split_matches_numpy(data):
    n = data.draw(st.integers(1, 9))
    x = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
    size = data.draw(st.integers(1, n + 1))
    pieces = Tensor(x).split(size)
    want = np.array_split(x, range(size, n, size))
    assert len(pieces) == len(want)
    for p, w in zip(pieces, want):
        np.testing.assert_array_equal(p.to_numpy(), w)
    sections = data.draw(st.lists(st.integers(0, n), min_size=1, max_size=3).filter(lambda v: sum(v) <= n))
    sections.append(n - sum(sections))
    got = Tensor(x).split(sections, axis=0)
    for p, w in zip(got, np.split(x, np.cumsum(sections)[:-1])):
        np.testing.assert_array_equal(p.to_numpy(), w)


@given(x=hnp.arrays(np.float32, hnp.array_shapes(max_dims=3, max_side=4), elements=st.floats(-5, 5, width=32)),
       lo=st.one_of(st.none(), st.floats(-3, 0)), hi=st.one_of(st.none(), st.floats(0, 3)))
def test_clip_matches_numpy(x, lo, hi):
    if lo is None and hi is None:
        with pytest.raises(ValueError, match="clamp: give min, max or both"):
            Tensor(x).clip()
        return
    got = Tensor(x).clamp(lo, hi).to_numpy()
    want = np.clip(x.astype(np.float64), -np.inf if lo is None else np.float32(lo),
                   np.inf if hi is None else np.float32(hi))
    np.testing.assert_array_equal(got, want.astype(np.float32))


@given(a=hnp.arrays(np.int64, (5,), elements=st.integers(-50, 50)),
       b=hnp.arrays(np.int64, (5,), elements=st.integers(-9, 9).filter(bool)))
def test_divmod_matches_python(a, b):
    q, r = divmod(Tensor(a), Tensor(b))
    np.testing.assert_array_equal(q.to_numpy(), a // b)
    np.testing.assert_array_equal(r.to_numpy(), a % b)
    q2, r2 = divmod(7, Tensor(b))
    np.testing.assert_array_equal(q2.to_numpy(), 7 // b)
    np.testing.assert_array_equal(r2.to_numpy(), 7 % b)
    np.testing.assert_array_equal((Tensor(a) // 3).to_numpy(), a // 3)


@pytest.mark.parametrize("name,ref", [("sum", np.sum), ("mean", np.mean), ("prod", np.prod), ("max", np.max),
                                      ("min", np.min), ("argmax", np.argmax), ("argmin", np.argmin)])
@given(x=hnp.arrays(np.float64, hnp.array_shapes(min_dims=1, max_dims=3, max_side=4),
                    elements=st.floats(-2, 2), unique=True))
def test_reductions_over_an_axis_or_everything(name, ref, x):
    t = Tensor(x)
    whole = getattr(t, name)(axis=None)
    assert list(whole.shape) == [1]  # max-behaviours.md B5.4: every element reduces to shape [1]
    np.testing.assert_allclose(whole.to_numpy(), [ref(x)], rtol=1e-12)
    assert whole.item() == pytest.approx(float(ref(x)), rel=1e-12)
    ax = getattr(t, name)(axis=0)
    np.testing.assert_allclose(ax.to_numpy(), ref(x, axis=0, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(getattr(t, name)().to_numpy(), ref(x, axis=-1, keepdims=True), rtol=1e-12)


def test_printed_form():
    """MAX 26.7's eager form (max-behaviours.md B14): str is the repr, values in '{:.4g}' cells, nothing elided."""
    dev = "device=Device(type=cpu,id=0)"
    x = Tensor([1, 2, 3, 4, 5], dtype=DType.float32)
    assert str(x) == repr(x) == f"Tensor([1 2 3 4 5], dtype=DType.float32, {dev})"
    i = Tensor([[1, 2], [3, 4]], dtype=DType.int32)
    assert str(i) == f"Tensor([1 2\n 3 4], dtype=DType.int32, {dev})"
    big = Tensor.zeros([2000])
    assert "..." not in str(big) and str(big)[len("Tensor(["):str(big).index("]")].split() == ["0"] * 2000


def test_functional_creation_and_control_flow_in_a_graph():
    from max.engine import InferenceSession
    from max.graph import Graph

    def fn(x):
        z = F.zeros_like(x) + F.full([3], 2.0, dtype=DType.float32, device=DeviceRef.CPU())
        (out,) = F.while_loop([F.clamp(x, 0.0, 1.0) + z], lambda v: F.squeeze(F.max(v, axis=0), 0) < 10.0,
                              lambda v: v * 2.0)
        return out

    g = Graph("g", fn, input_types=[TensorType(DType.float32, [3], DeviceRef.CPU())])
    got = InferenceSession().load(g).execute(Buffer.from_numpy(np.array([-1.0, 0.5, 3.0], np.float32)))[0]
    v = np.array([2.0, 2.5, 3.0])
    while v.max() < 10.0:
        v = v * 2
    np.testing.assert_array_equal(got.to_numpy(), v)
