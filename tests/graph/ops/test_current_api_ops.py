"""Ops of the current MAX API: prod, bottom_k, acos, ceil, floor_div, pad reflect/edge, rms_norm,
group_norm, buffer_create, ops.random; MAX's stricter semantics and exception classes.

References: float64 numpy (np.prod, np.sort, np.arccos, np.ceil, //, np.pad) and float64 torch
(F.group_norm)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from max import driver
from max.dtype import DType
from max.engine import InferenceSession
from max.graph import BufferType, DeviceRef, Graph, TensorType, ops
from support import run1, run_graph, tt

shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4)
CPU = DeviceRef.CPU()


def _g(fn, *types):
    return Graph("g", fn, input_types=[TensorType(dt, shp, CPU) for dt, shp in types])


# ----------------------------------------------------------------------------- reductions
@given(data=st.data())
def test_prod_matches_numpy(data):
    shape = data.draw(shapes)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    dt = data.draw(st.sampled_from([DType.float32, DType.float64, DType.int32, DType.int64]))
    if dt.is_float():
        x = data.draw(hnp.arrays(dt.to_numpy(), shape, elements=st.floats(-2, 2, width=32)))
    else:
        x = data.draw(hnp.arrays(dt.to_numpy(), shape, elements=st.integers(-3, 3)))
    out = run1(lambda a: ops.prod(a, axis), [tt(dt, shape)], x)
    ref = np.prod(x.astype(np.float64), axis=axis, keepdims=True)
    assert out.dtype == dt.to_numpy() and out.shape == ref.shape
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=1e-5 if dt is DType.float32 else 1e-12)


@given(data=st.data())
def test_bottom_k_matches_numpy(data):
    shape = data.draw(shapes)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    k = data.draw(st.integers(0, shape[axis]))
    x = data.draw(hnp.arrays(np.float32, shape, elements=st.floats(-9, 9, width=32), unique=True))
    vals, idx = run_graph(lambda a: ops.bottom_k(a, k, axis), [tt(DType.float32, shape)], x)
    ref_idx = np.take(np.argsort(x, axis=axis, kind="stable"), np.arange(k), axis=axis)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_array_equal(vals, np.take_along_axis(x, ref_idx, axis=axis))
    assert idx.dtype == np.int64


def test_bottom_k_errors():
    with pytest.raises(ValueError, match=r"bottom_k: k=5 is larger than axis 1"):
        _g(lambda a: ops.bottom_k(a, 5), (DType.float32, [2, 4]))
    with pytest.raises(TypeError, match="bottom_k: k must be an int"):
        _g(lambda a: ops.bottom_k(a, 1.5), (DType.float32, [2, 4]))


# ----------------------------------------------------------------------------- elementwise
@given(x=hnp.arrays(np.float64, shapes, elements=st.floats(-1, 1)))
def test_acos_matches_numpy(x):
    np.testing.assert_allclose(run1(ops.acos, [tt(DType.float64, x.shape)], x), np.arccos(x), rtol=1e-12)


@given(x=hnp.arrays(np.float32, shapes, elements=st.floats(-50, 50, width=32)))
def test_ceil_matches_numpy(x):
    np.testing.assert_array_equal(run1(ops.ceil, [tt(DType.float32, x.shape)], x), np.ceil(x))


@given(data=st.data())
def test_floor_div_matches_python(data):
    shape = data.draw(shapes)
    dt = data.draw(st.sampled_from([DType.int32, DType.int64, DType.float32, DType.float64]))
    a = data.draw(hnp.arrays(dt.to_numpy(), shape, elements=st.integers(-50, 50)))
    b = data.draw(hnp.arrays(dt.to_numpy(), shape, elements=st.integers(-7, 7).filter(lambda v: v != 0)))
    out = run1(ops.floor_div, [tt(dt, shape), tt(dt, shape)], a, b)
    assert out.dtype == dt.to_numpy()
    np.testing.assert_array_equal(out, np.floor_divide(a, b))


def test_new_elementwise_type_errors():
    with pytest.raises(TypeError, match="acos: x must be a floating-point tensor"):
        _g(ops.acos, (DType.int32, [2]))
    with pytest.raises(TypeError, match="ceil: x must be numeric"):
        _g(ops.ceil, (DType.bool, [2]))
    with pytest.raises(ValueError, match="Failed to create op 'FloorDivOp'(.|\n)*Unsafe cast from si32 to f32"):
        _g(ops.floor_div, (DType.float32, [2]), (DType.int32, [2]))
    i = np.array([3, -4, 7], np.int32)
    np.testing.assert_array_equal(run1(ops.ceil, [tt(DType.int32, [3])], i), i)


# ----------------------------------------------------------------------------- pad
@pytest.mark.parametrize("mode,np_mode", [("reflect", "reflect"), ("edge", "edge")])
@given(data=st.data())
def test_pad_modes_match_numpy(mode, np_mode, data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5))
    pads = []
    for n in shape:
        hi = n - 1 if mode == "reflect" else 3
        pads += [data.draw(st.integers(0, hi)), data.draw(st.integers(0, hi))]
    x = data.draw(hnp.arrays(np.int64, shape, elements=st.integers(-100, 100)))
    out = run1(lambda a: ops.pad(a, pads, mode=mode), [tt(DType.int64, shape)], x)
    np.testing.assert_array_equal(out, np.pad(x, [(pads[2 * i], pads[2 * i + 1]) for i in range(len(shape))],
                                              mode=np_mode))


# ----------------------------------------------------------------------------- norms
@given(data=st.data())
def test_rms_norm_matches_numpy(data):
    shape = data.draw(shapes)
    dt = data.draw(st.sampled_from([DType.float32, DType.float64, DType.bfloat16]))
    offset = data.draw(st.sampled_from([0.0, 1.0]))
    before = data.draw(st.booleans())
    x = data.draw(hnp.arrays(np.float64, shape, elements=st.floats(-3, 3)))
    w = data.draw(hnp.arrays(np.float64, shape[-1:], elements=st.floats(-2, 2)))
    npdt = dt.to_numpy()
    xin, win = x.astype(npdt), w.astype(npdt)
    out = run1(lambda a, b: ops.rms_norm(a, b, 1e-5, weight_offset=offset, multiply_before_cast=before),
               [tt(dt, shape), tt(dt, shape[-1:])], xin, win)
    xf = xin.astype(np.float64)
    ref = xf / np.sqrt(np.mean(xf * xf, axis=-1, keepdims=True) + 1e-5) * (win.astype(np.float64) + offset)
    tol = 2e-2 if dt is DType.bfloat16 else 1e-5
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=tol, atol=tol)


@given(data=st.data())
def test_group_norm_matches_torch(data):
    groups = data.draw(st.integers(1, 3))
    c = groups * data.draw(st.integers(1, 3))
    shape = (data.draw(st.integers(1, 2)), c) + tuple(data.draw(st.lists(st.integers(1, 4), max_size=2)))
    x = data.draw(hnp.arrays(np.float64, shape, elements=st.floats(-3, 3)))
    g = data.draw(hnp.arrays(np.float64, (c,), elements=st.floats(-2, 2)))
    b = data.draw(hnp.arrays(np.float64, (c,), elements=st.floats(-2, 2)))
    out = run1(lambda a, gg, bb: ops.group_norm(a, gg, bb, groups, 1e-5),
               [tt(DType.float64, shape), tt(DType.float64, (c,)), tt(DType.float64, (c,))], x, g, b)
    if x.size // (shape[0] * groups) > 1:  # torch refuses one-value groups
        ref = F.group_norm(torch.from_numpy(x), groups, torch.from_numpy(g), torch.from_numpy(b), 1e-5).numpy()
    else:
        ref = np.broadcast_to(b.reshape((c,) + (1,) * (len(shape) - 2)), shape)  # each value is its group mean
    np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-10)


def test_norm_errors():
    f32 = DType.float32
    with pytest.raises(ValueError, match=r"rms_norm: weight has shape \[Dim\(3\)\], expected \[4\]"):
        _g(lambda x, w: ops.rms_norm(x, w), (f32, [2, 4]), (f32, [3]))
    with pytest.raises(ValueError, match="^epsilon must be positive"):
        _g(lambda x, w: ops.rms_norm(x, w, -1.0), (f32, [2, 4]), (f32, [4]))
    with pytest.raises(TypeError, match="rms_norm: input must be a float16/bfloat16/float32/float64 tensor"):
        _g(lambda x, w: ops.rms_norm(x, w), (DType.int32, [2, 4]), (f32, [4]))
    with pytest.raises(ValueError, match=r"group_norm: the channel dim 6 of input \[Dim\(2\), Dim\(6\), Dim\(3\)\] is not divisible by "
                                         r"num_groups=4"):
        _g(lambda x, g, b: ops.group_norm(x, g, b, 4, 1e-5), (f32, [2, 6, 3]), (f32, [6]), (f32, [6]))
    with pytest.raises(ValueError, match=r"group_norm: input must have rank >= 2"):
        _g(lambda x, g, b: ops.group_norm(x, g, b, 1, 1e-5), (f32, [6]), (f32, [6]), (f32, [6]))


# ----------------------------------------------------------------------------- buffers and random
def test_buffer_create_store_load():
    bt = BufferType(DType.float32, [2, 3], CPU)

    def fn(x):
        b = ops.buffer_create(bt)
        first = ops.buffer_load(b)
        ops.buffer_store(b, x)
        ops.buffer_store_slice(b, x[0:1] * 2, [slice(1, 2)])
        return first, ops.buffer_load(b)

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    zeros, out = run_graph(fn, [tt(DType.float32, [2, 3])], x)
    np.testing.assert_array_equal(zeros, np.zeros((2, 3)))
    np.testing.assert_array_equal(out, np.stack([x[0], 2 * x[0]]))
    with pytest.raises(TypeError, match="buffer_create: type must be a BufferType"):
        _g(lambda: ops.buffer_create(TensorType(DType.float32, [2], CPU)))
    with pytest.raises(ValueError, match="buffer_create: type .* has symbolic dim n"):
        _g(lambda: ops.buffer_create(BufferType(DType.float32, ["n"], CPU)))


def test_ops_random_module_path_and_seed():
    from max.graph.ops import random as rnd

    like = TensorType(DType.float32, [2000], CPU)

    def fn():
        rnd.set_seed(7)
        a = rnd.gaussian(like, mean=1.0, std=2.0)
        rnd.set_seed(7)
        b = rnd.normal(like, mean=1.0, std=2.0)
        return a, b, rnd.uniform(like, range=(-1, 3))

    m = InferenceSession(devices=[driver.CPU()]).load(Graph("r", fn))
    a, b, u = (o.to_numpy() for o in m.execute())
    np.testing.assert_array_equal(a, b)  # reseeded to the same state inside the graph
    assert abs(a.mean() - 1.0) < 0.2 and abs(a.std() - 2.0) < 0.2
    assert u.min() >= -1 and u.max() < 3 and abs(u.mean() - 1.0) < 0.15
    a2 = m.execute()[0].to_numpy()
    np.testing.assert_array_equal(a, a2)  # the in-graph seed makes every run repeat
    with pytest.raises(ValueError, match="random.gaussian: std must be > 0"):
        _g(lambda: (rnd.set_seed(0), rnd.gaussian(like, std=0.0)))
    with pytest.raises(TypeError, match="random.set_seed: seed must be an int"):
        _g(lambda: rnd.set_seed(1.5))


# ----------------------------------------------------------------------------- MAX's stricter semantics
def test_semantics_max_enforces():
    f32 = DType.float32
    with pytest.raises(ValueError, match=r"tile: repeats must be positive"):
        _g(lambda x: ops.tile(x, [0, 1]), (f32, [2, 3]))
    # MAX 26.7: index depth 0 selects all of input per index vector
    assert _g(lambda x, i: ops.gather_nd(x, i), (f32, [2, 3]), (DType.int64, [4, 0])).output_types[0].shape == [4, 2, 3]
    with pytest.raises(ValueError, match=r"^Unsafe cast: Can't promote python int with value \(301\) to dtype\(DType.uint8\)"):
        _g(lambda: ops.range(0, 301, 1, dtype=DType.uint8, device=CPU))
    with pytest.raises(ValueError, match=r"^Unsafe cast: Can't promote python float to dtype\(DType.int32\)"):
        _g(lambda: ops.range(0.5, 3, 1, dtype=DType.int32, device=CPU))
    with pytest.raises(ValueError, match="range: out_dim is 4 but"):
        _g(lambda: ops.range(0, 3, 1, out_dim=4, dtype=DType.int64, device=CPU))
    # broadcast_to onto a symbolic target: only size-1 dims (or the same symbol) broadcast
    with pytest.raises(ValueError, match=r"Failed to create op 'BroadcastToOp'(.|\n)*\[broadcast_to\] input dimension at index 0 \(3\) must be either 1 or equal to corresponding output dimension at index 0 \(n\)"):
        _g(lambda x: ops.broadcast_to(x, ["n"]), (f32, [3]))
    with pytest.raises(ValueError, match=r"\[broadcast_to\] input dimension at index 0 \(m\) must be either 1"):
        _g(lambda x: ops.broadcast_to(x, ["n"]), (f32, ["m"]))
    assert _g(lambda x: ops.broadcast_to(x, ["n", 2]), (f32, [1, 2])).output_types[0].shape == ["n", 2]
    # transpose(0, 0) of a scalar is the scalar itself
    g = _g(lambda x: ops.transpose(x, 0, 0), (f32, []))
    assert g.output_types[0].shape == []


def test_exception_classes():
    from max.graph.graph import NoGraphError

    with pytest.raises(LookupError, match="no graph is being built"):
        ops.add(np.ones(2, np.float32), np.ones(2, np.float32))
    with pytest.raises(LookupError):
        Graph.current  # noqa: B018
    assert issubclass(NoGraphError, RuntimeError)
    g = Graph("g", input_types=[TensorType(DType.float32, [2], CPU)])
    with pytest.raises(TypeError, match="output_types is undefined until output"):
        g.output_types  # noqa: B018
    g.output(g.inputs[0])
    assert g.output_types == [TensorType(DType.float32, [2], CPU)]
