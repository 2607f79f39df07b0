"""MAX 26.7 behaviours of ``ops.random`` (B12) and graph control flow (B13) from
``../shared/max-behaviours.md``: each test names its fact.  Sample values are checked against
what the distribution allows (range, dtype, moments), and seeded runs against each other."""

from __future__ import annotations

import numpy as np
import pytest

from max.driver import CPU, Buffer
from max.dtype import DType
from max.engine import InferenceSession
from max.graph import DeviceRef, Graph, TensorType, ops

C = DeviceRef.CPU()
N = 4000


def tt(dtype, shape=(N,), device=C):
    return TensorType(dtype, list(shape), device)


def run(g, *inputs):
    m = InferenceSession(devices=[CPU()]).load(g)
    return [o.to_numpy() for o in m.execute(*[Buffer.from_numpy(np.asarray(i)) for i in inputs])]


def build(fn, input_types=(), seed=0):
    with Graph("g", input_types=list(input_types)) as g:
        if seed is not None:
            ops.random.set_seed(seed)
        outs = fn(*g.inputs)
        g.output(*(outs if isinstance(outs, (list, tuple)) else [outs]))
    return g


# ----------------------------------------------------------------------------- B12 random
def test_B12_1_seed_type():
    assert ops.random.SeedType(C) == TensorType(DType.uint64, [1], C)
    assert ops.random.SeedType(DeviceRef.GPU()) == TensorType(DType.uint64, [1], DeviceRef.GPU())


@pytest.mark.parametrize("dtype,shape", [(DType.uint64, [1]), (DType.int64, []), (DType.float32, [1]),
                                         (DType.int32, [])])
def test_B12_2_set_seed_takes_rank0_or_1_any_dtype(dtype, shape):
    with Graph("g", input_types=[tt(dtype, shape)]) as g:
        ops.random.set_seed(g.inputs[0].tensor)
        g.output(ops.random.uniform(tt(DType.float32)))
    a = run(g, np.full(shape, 3, dtype.to_numpy()))[0]
    b = run(g, np.full(shape, 3, dtype.to_numpy()))[0]
    c = run(g, np.full(shape, 4, dtype.to_numpy()))[0]
    np.testing.assert_array_equal(a, b)  # the seed input decides the draws
    assert not np.array_equal(a, c)
    assert a.min() >= 0 and a.max() < 1


@pytest.mark.parametrize("shape,text", [([2], "[Dim(2)]"), ([2, 1], "[Dim(2), Dim(1)]")])
def test_B12_3_set_seed_bad_shape(shape, text):
    with Graph("g", input_types=[tt(DType.uint64, shape)]) as g:
        with pytest.raises(ValueError) as e:
            ops.random.set_seed(g.inputs[0].tensor)
    assert str(e.value) == f"Seed must be a scalar or rank-1 tensor with shape [1], got shape {text}."


@pytest.mark.parametrize("value", [-1, 2**64])
def test_B12_4_set_seed_int_must_fit_uint64(value):
    with Graph("g"):
        with pytest.raises(ValueError, match=rf"^Unsafe cast: Can't promote python int with value \({value}\) to "
                           r"dtype\(DType\.uint64\)\. It would lose precision\."):
            ops.random.set_seed(value)
        ops.random.set_seed(2**64 - 1)


def test_B12_4_eager_set_seed_int_must_fit_uint64_too():
    from max.experimental import random

    with pytest.raises(ValueError, match=r"^Unsafe cast: Can't promote python int with value \(-1\)"):
        random.set_seed(-1)


@pytest.mark.parametrize("draw", [lambda t: ops.random.uniform(t), lambda t: ops.random.gaussian(t),
                                  lambda t: ops.random.normal(t)])
def test_B12_5_draw_without_seed_raises(draw):
    with Graph("g"):
        with pytest.raises(RuntimeError, match=r"^No seed set! Set with `ops\.random\.set_seed`\."):
            draw(tt(DType.float32))
        # checked before the dtype: float4 uniform would be a TypeError
        with pytest.raises(RuntimeError, match="No seed set!"):
            draw(tt(DType.float4_e2m1fn))


def test_B12_5_seed_in_enclosing_graph_counts_inside_cond():
    def fn(p):
        return ops.cond(p, [tt(DType.float32, [3])], lambda: ops.random.uniform(tt(DType.float32, [3])),
                        lambda: ops.constant(np.full(3, -1, np.float32), DType.float32, C))

    g = build(fn, [tt(DType.bool, [])])
    a = run(g, np.array(True))[0]
    assert a.shape == (3,) and a.min() >= 0 and a.max() < 1
    np.testing.assert_array_equal(run(g, np.array(False))[0], [-1, -1, -1])


@pytest.mark.parametrize("dtype", [DType.int8, DType.uint8, DType.int64, DType.bool, DType.float8_e4m3fn,
                                   DType.float4_e2m1fn])
def test_B12_6_gaussian_any_dtype(dtype):
    like = tt(dtype)
    with Graph("t"):
        ops.random.set_seed(0)
        assert ops.random.gaussian(like).type == like
    # the same seed draws the same float32 samples; other dtypes get them cast
    out = run(build(lambda: ops.random.gaussian(like, mean=0.5, std=2.0), seed=3))[0]
    ref = run(build(lambda: ops.random.gaussian(tt(DType.float32), mean=0.5, std=2.0), seed=3))[0]
    assert ref.dtype == np.float32 and abs(ref.mean() - 0.5) < 0.1 and 0.95 < ref.std() / 2.0 < 1.05
    assert out.dtype == dtype.to_numpy()
    if dtype is DType.bool:
        np.testing.assert_array_equal(out, ref != 0)
    elif dtype.is_integral():  # truncated toward 0; uint8 wraps (-1.3 -> 255)
        np.testing.assert_array_equal(out, np.trunc(ref).astype(np.int64).astype(dtype.to_numpy()))
        if dtype is DType.uint8:
            assert {0, 1, 255} <= set(np.unique(out).tolist())
    else:  # rounded to the nearest float8 / float4 value
        np.testing.assert_array_equal(out.astype(np.float32), ref.astype(dtype.to_numpy()).astype(np.float32))


@pytest.mark.parametrize("dtype,rng", [(DType.int8, (-5, 3)), (DType.uint8, (230, 255)), (DType.int64, (0, 10)),
                                       (DType.bool, (0, 1)), (DType.float8_e4m3fn, (0, 1))])
def test_B12_7_uniform_int_bool_float8(dtype, rng):
    like = tt(dtype)
    out = run(build(lambda: ops.random.uniform(like, range=rng)))[0]
    assert out.dtype == dtype.to_numpy()
    vals = out.astype(np.float64)
    lo, hi = rng
    assert vals.min() >= lo and vals.max() < hi if dtype is not DType.bool else True
    if dtype.is_integral():
        # every integer of [lo, hi) appears, about equally often
        assert set(np.unique(vals).astype(int).tolist()) == set(range(lo, hi))
        counts = np.bincount((vals - lo).astype(int))
        assert counts.min() > 0.5 * N / (hi - lo)
    elif dtype is DType.bool:
        assert 0.4 < vals.mean() < 0.6  # a fair coin: bool's only range is (0, 1)
    else:
        assert abs(vals.mean() - 0.5) < 0.05


def test_B12_7_uniform_sub_byte_dtype_refused():
    with Graph("g"):
        ops.random.set_seed(0)
        with pytest.raises(TypeError, match=r"^Cannot create a constant of type 'DType\.float4_e2m1fn' since it is "
                           r"a sub-byte type\."):
            ops.random.uniform(tt(DType.float4_e2m1fn))


@pytest.mark.parametrize("dtype", [DType.float32, DType.float16, DType.int32])
def test_B12_8_uniform_with_tensor_range(dtype):
    if dtype is DType.int32:
        lo_v, hi_v = -3, 4
    else:
        lo_v, hi_v = 0.0, 1.0

    def fn():
        rng = (ops.constant(lo_v, dtype, device=C), ops.constant(hi_v, dtype, device=C))
        return ops.random.uniform(tt(dtype), range=rng)

    out = run(build(fn))[0]
    assert out.dtype == dtype.to_numpy() and out.shape == (N,)
    v = out.astype(np.float64)
    assert v.min() >= lo_v and v.max() <= hi_v
    if dtype is DType.int32:
        assert set(np.unique(v).astype(int).tolist()) == set(range(-3, 4))
    else:
        assert abs(v.mean() - 0.5) < 0.05


def test_B12_8_uniform_tensor_range_broadcasts():
    def fn(lo, hi):
        return ops.random.uniform(tt(DType.float32, [N, 2]), range=(lo, hi))

    out = run(build(fn, [tt(DType.float32, [2]), tt(DType.float32, [2])]),
              np.array([0, 10], np.float32), np.array([1, 20], np.float32))[0]
    assert 0 <= out[:, 0].min() and out[:, 0].max() <= 1
    assert 10 <= out[:, 1].min() and out[:, 1].max() <= 20 and abs(out[:, 1].mean() - 15) < 0.5


@pytest.mark.parametrize("dtype,rng,bad", [(DType.int8, (0, 1000), 1000), (DType.uint8, (-5, 3), -5)])
def test_B12_9_uniform_range_must_fit(dtype, rng, bad):
    with Graph("g"):
        ops.random.set_seed(0)
        with pytest.raises(ValueError, match=rf"^Unsafe cast: Can't promote python int with value \({bad}\) to "
                           rf"dtype\(DType\.{dtype.name}\)\. It would lose precision\."):
            ops.random.uniform(tt(dtype), range=rng)


def test_B12_10_eager_normal_uint8():
    from max.experimental import random

    random.set_seed(11)
    f = random.normal([2000], dtype=DType.float32, device=CPU()).to_numpy()
    random.set_seed(11)
    u = random.normal([2000], dtype=DType.uint8, device=CPU())
    assert u.dtype is DType.uint8
    # the same float samples, cast to uint8 (truncated, wrapped)
    np.testing.assert_array_equal(u.to_numpy(), (np.trunc(f).astype(np.int64) % 256).astype(np.uint8))
    assert {0, 1, 255} <= set(np.unique(u.to_numpy()).tolist())


def test_B12_11_seed_returns_global_seed_tensor():
    from max.experimental import random
    from max.experimental.tensor import Tensor

    random.set_seed(1234)
    s = random.seed()
    assert isinstance(s, Tensor) and s.dtype is DType.uint64 and list(s.shape) == [1]
    assert s.item() == 1234
    a = random.uniform([5], device=CPU()).to_numpy()
    random.set_seed(int(s.item()))
    np.testing.assert_array_equal(random.uniform([5], device=CPU()).to_numpy(), a)


# ----------------------------------------------------------------------------- B13 control flow
def test_B13_1_bool_of_tensor_value_is_true():
    with Graph("g", input_types=[tt(DType.float32, [2, 3]), tt(DType.float32, [])]) as g:
        x, s = g.inputs[0].tensor, g.inputs[1].tensor
        assert bool(x) is True and bool(x > 100) is True and bool(s) is True
        assert (x if x else None) is x
        y = x < 10
        z = s < 10
        assert (y and z) is z and (y or z) is y


def test_B13_1_python_and_in_while_predicate_is_its_second_operand():
    i64 = tt(DType.int64, [])
    with Graph("w", input_types=[i64, i64]) as g:
        out = ops.while_loop(
            (g.inputs[0], g.inputs[1]),
            lambda x, y: ops.transfer_to(x < 10 and y < 10, DeviceRef.CPU()),
            lambda x, y: [x + 1, y + 1])
        g.output(*out)
    x, y = run(g, np.array(0, np.int64), np.array(3, np.int64))
    assert (int(x), int(y)) == (7, 10)  # only `y < 10` decided


def test_B13_2_len_of_tensor_value_is_a_type_error():
    with Graph("g", input_types=[tt(DType.float32, [4, 3]), tt(DType.float32, ["n"])]) as g:
        for v in (g.inputs[0].tensor, g.inputs[1].tensor):
            with pytest.raises(TypeError, match=r"^object of type 'TensorValue' has no len\(\)$"):
                len(v)
        assert g.inputs[0].tensor.shape[0] == 4  # the size is the shape's


def test_B13_5_subgraph_input_devices_not_checked_against_devices():
    cpu_bool = TensorType(DType.bool, [], DeviceRef.CPU())
    gpu_bool = TensorType(DType.bool, [], DeviceRef.GPU(0))
    g = Graph("root", input_types=[cpu_bool, gpu_bool])
    sub = g.add_subgraph("sub", input_types=[cpu_bool, gpu_bool], devices=[DeviceRef.GPU(0)])
    with sub:
        p, x1 = sub.inputs[0].tensor, sub.inputs[1].tensor
        (r,) = ops.cond(p, [TensorType(DType.bool, [], DeviceRef.GPU(1))],
                        lambda: ops.transfer_to(x1, DeviceRef.GPU(1)),
                        lambda: ops.transfer_to(x1, DeviceRef.GPU(1)))
        sub.output(r)
    with g:
        (y,) = ops.call(sub, g.inputs[0], g.inputs[1])
        assert y.type == TensorType(DType.bool, [], DeviceRef.GPU(1))
        g.output(y)
    assert sub.devices == [DeviceRef.GPU(0)]


def test_B13_6_cond_with_no_results_returns_empty_list():
    with Graph("g", input_types=[tt(DType.bool, [])]) as g:
        assert ops.cond(g.inputs[0], None, lambda: None, lambda: None) == []
        g.output()
