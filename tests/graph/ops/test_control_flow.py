"""cond, while_loop, call/subgraphs, fence, and mutable buffers ordered by chains."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from max.driver import Buffer
from max.dtype import DType
from max.graph import BufferType, DeviceRef, Graph, TensorType, ops
from support import session

F3 = TensorType(DType.float32, (3,))
B = TensorType(DType.bool, ())
I32 = TensorType(DType.int32, ())


def test_cond_picks_the_branch():
    with Graph("c", input_types=[F3, B]) as g:
        x, p = g.inputs
        (r,) = ops.cond(p, [F3], lambda: ops.exp(x), lambda: x - 1)
        g.output(r)
    m = session().load(g)
    x = np.array([0.0, 1.0, 2.0], np.float32)
    np.testing.assert_allclose(m.execute(x, np.array(True))[0].to_numpy(), np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(m.execute(x, np.array(False))[0].to_numpy(), x - 1)


def test_cond_type_errors():
    with Graph("c", input_types=[F3, B, TensorType(DType.float32, ())]) as g:
        x, p, f = g.inputs
        with pytest.raises(ValueError, match=r"cond: else_fn result 0 has type TensorType\(dtype=int32"):
            ops.cond(p, [F3], lambda: x, lambda: ops.cast(x, DType.int32))
        with pytest.raises(ValueError, match="cond: then_fn returned 2 value"):
            ops.cond(p, [F3], lambda: [x, x], lambda: x)
        with pytest.raises(TypeError, match="cond: pred must be a bool scalar"):
            ops.cond(f, [F3], lambda: x, lambda: x)
        assert ops.cond(p, None, lambda: None, lambda: None) == []


@given(n=st.integers(0, 12), step=st.integers(1, 3))
def test_while_loop_counts(n, step):
    with Graph("w", input_types=[I32]) as g:
        limit = g.inputs[0]
        zero = ops.constant(0, DType.int32, DeviceRef.CPU())
        acc = ops.constant(np.zeros(2, np.float32), DType.float32, DeviceRef.CPU())
        i, a = ops.while_loop((zero, acc), lambda i, a: i < limit, lambda i, a: [i + step, a + 1.0])
        g.output(i, a)
    i, a = session().load(g).execute(np.array(n, np.int32))
    iters = -(-n // step)
    assert int(i.to_numpy()) == iters * step
    np.testing.assert_array_equal(a.to_numpy(), [iters, iters])


def test_while_loop_spec_example_and_errors():
    with Graph("while_loop_example") as g:
        x = ops.constant(0, dtype=DType.int32, device=DeviceRef.CPU())
        y = ops.constant(5, dtype=DType.int32, device=DeviceRef.CPU())
        results = ops.while_loop((x, y), lambda x, y: ops.logical_and(x < 10, y < 15), lambda x, y: [x + 1, y + 1])
        g.output(*results)
        with pytest.raises(ValueError, match="^While loops must have at least one iteration value\\.$"):
            ops.while_loop([], lambda: x, lambda: x)
        with pytest.raises(ValueError, match=r"while_loop: body result 0 has type TensorType\(dtype=float32"):
            ops.while_loop(x, lambda v: v < 3, lambda v: ops.cast(v, DType.float32))
    out = session().load(g).execute()
    assert [int(o.to_numpy()) for o in out] == [10, 15]
    with Graph("wb", input_types=[BufferType(DType.float32, (2,))]) as g:
        with pytest.raises(NotImplementedError, match="buffer"):
            ops.while_loop(g.inputs[0], lambda b: b, lambda b: b)


def test_subgraph_call_with_weights_and_prefix():
    from max.graph import Weight

    outer = Graph("outer", input_types=[F3])
    with outer:
        w = Weight("scale", DType.float32, (3,), DeviceRef.CPU())
        sub = outer.add_subgraph("scaled", lambda a: a * w, input_types=[F3])
        (r1,) = ops.call(sub, outer.inputs[0], prefix="layer0.")
        (r2,) = ops.call(sub, r1, prefix="layer1.")
        outer.output(r2)
    reg = {"layer0.scale": np.full(3, 2.0, np.float32), "layer1.scale": np.full(3, 3.0, np.float32)}
    out = session().load(outer, weights_registry=reg).execute(np.ones(3, np.float32))
    np.testing.assert_allclose(out[0].to_numpy(), 6.0)
    with outer:
        with pytest.raises(ValueError, match="call: subgraph 'scaled' takes 1 argument"):
            ops.call(sub)


def test_fence_is_identity_and_needs_values():
    with Graph("f", input_types=[F3]) as g:
        a, = ops.fence(g.inputs[0] + 1)
        g.output(a)
        with pytest.raises(ValueError, match="fence: needs at least one value"):
            ops.fence()
    np.testing.assert_allclose(session().load(g).execute(np.zeros(3, np.float32))[0].to_numpy(), 1.0)


def test_buffer_mutations_are_visible_and_ordered():
    with Graph("buf", input_types=[BufferType(DType.float32, (2, 3)), F3]) as g:
        b, v = g.inputs
        before = ops.buffer_load(b)
        ops.buffer_store(b, before + 1)
        mid = ops.buffer_load(b)  # must see the store above, not be merged with `before`
        ops.buffer_store_slice(b, v, [0])
        b[1, 1:] = ops.constant(np.array([7, 8], np.float32), DType.float32, DeviceRef.CPU())
        after = ops.buffer_load(b)
        g.output(before, mid, after)
    m = session().load(g)
    host = np.zeros((2, 3), np.float32)
    buf = Buffer.from_numpy(host)
    before, mid, after = (o.to_numpy() for o in m.execute(buf, np.array([9, 9, 9], np.float32)))
    np.testing.assert_array_equal(before, 0)
    np.testing.assert_array_equal(mid, 1)
    expect = np.array([[9, 9, 9], [1, 7, 8]], np.float32)
    np.testing.assert_array_equal(after, expect)
    np.testing.assert_array_equal(host, expect)  # the caller's memory was mutated


def test_buffer_errors():
    with Graph("be", input_types=[BufferType(DType.float32, (2, 3)), TensorType(DType.float32, (4,)),
                                  TensorType(DType.int32, (3,))]) as g:
        b, v4, i3 = g.inputs
        with pytest.raises(ValueError, match=r"buffer_store: source and destination shapes \[Dim\(4\)\] and \[Dim\(2\), Dim\(3\)\] cannot be broadcast"):
            ops.buffer_store(b, v4)
        with pytest.raises(TypeError, match="buffer_store_slice: source has dtype DType.int32"):
            ops.buffer_store_slice(b, i3, [0])
        with pytest.raises(TypeError, match="buffer_load: x must be a BufferValue"):
            ops.buffer_load(v4)


def test_cond_with_buffer_side_effects():
    with Graph("cb", input_types=[BufferType(DType.float32, (2,)), B]) as g:
        b, p = g.inputs
        ops.cond(p, None, lambda: ops.buffer_store(b, ops.buffer_load(b) + 10),
                 lambda: ops.buffer_store(b, ops.buffer_load(b) - 10))
        g.output(ops.buffer_load(b))
    m = session().load(g)
    host = np.zeros(2, np.float32)
    buf = Buffer.from_numpy(host)
    m.execute(buf, np.array(True))
    m.execute(buf, np.array(True))
    out = m.execute(buf, np.array(False))
    np.testing.assert_array_equal(out[0].to_numpy(), 10)
    np.testing.assert_array_equal(host, 10)
