"""MAX 26.7's observed behaviours B5-B11 (/work/shared/max-behaviours.md): reductions, bool arithmetic
and dtype promotion, ``where`` and the logical ops, ``split``/``chunk``, ``gather_nd``, ``pad`` and
``range``/``range_like``.

Each test names its fact.  Exception types are checked exactly; messages must contain MAX's key
phrase.  Newly accepted ops that can run are executed and compared with numpy (float64 or exact).
"""

from __future__ import annotations

import numpy as np
import pytest

from max.dtype import DType
from max.graph import DeviceRef, TensorType, ops
from support import build, raises, run1, run_graph

C = DeviceRef.CPU()
G = DeviceRef.GPU()
F32, F16, I64, B = DType.float32, DType.float16, DType.int64, DType.bool


def tt(dt, shape, dev=C):
    return TensorType(dt, shape, dev)


_RNG = np.random.default_rng(267)
BOOLS = _RNG.random((3, 4)) > 0.5
BOOLS2 = _RNG.random((3, 4)) > 0.5


# ----------------------------------------------------------------------------- B5 reductions
REDUCTIONS = ["mean", "sum", "prod", "max", "min", "argmax", "argmin"]


@pytest.mark.parametrize("name", REDUCTIONS)
def test_B5_1_reduction_over_a_zero_size_axis_builds(name):
    fn = getattr(ops, name)
    r = build([tt(F32, [0])], fn)
    assert r.shape == [1] and r.dtype is (I64 if name.startswith("arg") else F32)
    r = build([tt(F32, [2, 0])], lambda x: fn(x, axis=1))
    assert r.shape == [2, 1]
    assert build([tt(F32, [2, 0])], lambda x: x.argmax(axis=1)).type == tt(I64, [2, 1])
    assert build([tt(F32, [0])], lambda x: x.var()).shape == [1]
    assert build([tt(F32, [0])], lambda x: x.stdev()).shape == [1]


def test_B5_1_zero_size_reductions_run_like_numpy():
    a = np.zeros((2, 0), np.float32)
    s, p, m = run_graph(lambda x: (ops.sum(x, 1), ops.prod(x, 1), ops.mean(x, 1)), [tt(F32, [2, 0])], a)
    np.testing.assert_array_equal(s, a.sum(axis=1, keepdims=True))
    np.testing.assert_array_equal(p, a.prod(axis=1, keepdims=True))
    assert m.shape == (2, 1) and np.isnan(m).all()  # numpy's mean of nothing is NaN too


@pytest.mark.parametrize("name", ["mean", "sum", "prod"])
def test_B5_2_bool_reductions_give_bool(name):
    r = build([tt(B, [3, 4])], lambda b: getattr(ops, name)(b))
    assert r.type == tt(B, [3, 1])
    assert build([tt(B, [3, 4])], lambda b: b.mean()).type == tt(B, [3, 1])
    for other in ("max", "min"):
        assert build([tt(B, [3, 4])], getattr(ops, other)).type == tt(B, [3, 1])
    for other in ("argmax", "argmin"):
        assert build([tt(B, [3, 4])], getattr(ops, other)).type == tt(I64, [3, 1])
    # values: computed as integers, non-zero is True (sum/mean: any element; prod: every element)
    got = run1(lambda b: getattr(ops, name)(b, 1), [tt(B, [3, 4])], BOOLS)
    ints = BOOLS.astype(np.int64)
    ref = {"sum": ints.sum(1, keepdims=True), "mean": ints.mean(1, keepdims=True),
           "prod": ints.prod(1, keepdims=True)}[name].astype(bool)
    np.testing.assert_array_equal(got, ref)


def test_B5_3_variance_of_bool_is_a_type_error():
    for fn in (lambda b: b.var(), lambda b: b.stdev()):
        with raises(TypeError, "Variance undefined for boolean values."):
            build([tt(B, [3])], fn)


# ----------------------------------------------------------------------------- B6 bool arithmetic, promotion
BOOL_BINARY = {
    "sub": (ops.sub, lambda a, b: a - b), "add": (ops.add, lambda a, b: a + b),
    "mul": (ops.mul, lambda a, b: a * b), "div": (ops.div, lambda a, b: a / b),
    "pow": (ops.pow, lambda a, b: a ** b),
}


@pytest.mark.parametrize("name", list(BOOL_BINARY))
def test_B6_1_bool_arithmetic_gives_bool(name):
    op, ref = BOOL_BINARY[name]
    assert build([tt(B, [3, 4])] * 2, op).type == tt(B, [3, 4])
    got = run1(op, [tt(B, [3, 4])] * 2, BOOLS, BOOLS2)
    a, b = (BOOLS.astype(np.float64), BOOLS2.astype(np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        want = ref(a, b).astype(bool)  # in numbers, then non-zero (NaN included) is True
    np.testing.assert_array_equal(got, want)


def test_B6_1_bool_operators_negate_and_scalars():
    for fn in (lambda b: b - b, lambda b: b + b, lambda b: -b, lambda b: b - 1, lambda b: ops.negate(b)):
        assert build([tt(B, [3, 4])], fn).dtype is B
    got = run_graph(lambda b: (b - b, -b, b - 1, 1 - b, b + True), [tt(B, [3, 4])], BOOLS)
    ints = BOOLS.astype(np.int64)
    for g, w in zip(got, (ints - ints, -ints, ints - 1, 1 - ints, ints + 1)):
        np.testing.assert_array_equal(g, w.astype(bool))


def test_B6_2_bool_mul_and_div_give_bool():
    assert build([tt(B, [2])], lambda b: b * b).dtype is B
    assert build([tt(B, [2])], lambda b: b / b).dtype is B
    # other integer division still gives float32
    assert build([tt(DType.int32, [2])], lambda i: i / i).dtype is F32


def test_B6_3_python_scalars_that_do_not_fit_bool():
    with raises(ValueError, "Unsafe cast: Can't promote python int with value (2) to dtype(DType.bool). "
                            "It would lose precision."):
        build([tt(B, [3])], lambda b: b + 2)
    with raises(ValueError, "Unsafe cast: Can't promote python float to dtype(DType.bool)."):
        build([tt(B, [3])], lambda b: b + 1.5)


@pytest.mark.parametrize("pair,phrase", [
    ((F16, DType.uint16), "Unsafe cast from ui16 to f16."), ((DType.uint8, DType.int8), "Unsafe cast from ui8 to si8."),
    ((I64, F32), "Unsafe cast from si64 to f64."), ((DType.int32, F16), "Unsafe cast"),
])
def test_B6_4_unsafe_tensor_promotion_is_a_verifier_error(pair, phrase):
    with raises(ValueError, "Failed to create op 'SubOp'", "Failed to resolve valid dtype: ", phrase,
                "Insert an explicit cast op if this conversion is wanted.", "Failed to infer result type(s) for 'rmo.sub'"):
        build([tt(pair[0], [3]), tt(pair[1], [3])], lambda a, b: a - b)
    with raises(ValueError, "Failed to create op 'SelectOp'", phrase, "    condition = TensorValue(dtype=bool"):
        build([tt(B, [3]), tt(pair[0], [3]), tt(pair[1], [3])], ops.where)
    # the same rule (one formatter, one promotion helper) for the rest of the family and matmul
    for fn, name in ((ops.add, "AddOp"), (ops.mul, "MulOp"), (ops.pow, "PowOp"), (ops.equal, "EqualOp"),
                     (ops.matmul, "MatmulOp")):
        with raises(ValueError, f"Failed to create op '{name}'", phrase):
            build([tt(pair[0], [3, 3]), tt(pair[1], [3, 3])], fn)


def test_B6_5_any_python_float_takes_a_float_dtype():
    for fn in (lambda c, x: ops.where(c, x, 65536.0), lambda c, x: ops.where(c, 65505.0, x),
               lambda c, x: x + 1e300, lambda c, x: x + float("inf"), lambda c, x: x + float("nan")):
        assert build([tt(B, [3]), tt(F16, [3])], fn).dtype is F16
    x = np.array([1.0, -2.0, 0.5], np.float16)
    c = np.array([True, False, True])
    big, where_big = run_graph(lambda cc, v: (v + 1e300, ops.where(cc, v, 65536.0)), [tt(B, [3]), tt(F16, [3])], c, x)
    np.testing.assert_array_equal(big, np.full(3, np.inf, np.float16))
    np.testing.assert_array_equal(where_big, np.where(c, x, np.float16(np.inf)))


def test_B6_6_python_ints_outside_the_dtype():
    with raises(ValueError, "Unsafe cast: Can't promote python int with value (1000) to dtype(DType.int8). "
                            "It would lose precision."):
        build([tt(DType.int8, [3])], lambda x: x - 1000)
    with raises(ValueError, "Unsafe cast: Can't promote python int with value (128) to dtype(DType.int8)."):
        build([tt(B, [3]), tt(DType.int8, [3])], lambda c, x: ops.where(c, x, 128))
    with raises(ValueError, "Unsafe cast: Can't promote python int with value (70000) to dtype(DType.float16)."):
        build([tt(F16, [3])], lambda x: x + 70000)


def test_B6_7_two_python_scalars_are_a_type_error():
    with raises(TypeError, "Binary ops require at least one max object as input."):
        build([tt(B, [3])], lambda c: ops.where(c, 1, 2))
    with raises(TypeError, "Binary ops require at least one max object as input."):
        build([], lambda: ops.add(1.0, 2))


# ----------------------------------------------------------------------------- B7 where, logical ops
def test_B7_1_where_condition_must_be_bool():
    for dt in (F32, DType.int32):
        with raises(ValueError, f"Expected condition to be a boolean tensor, but got a tensor with dtype {dt}"):
            build([tt(dt, [3]), tt(F32, [3])], lambda c, x: ops.where(c, x, x))


def test_B7_2_where_shapes_that_do_not_broadcast():
    with raises(ValueError, "Failed to create op 'SelectOp'",
                "Input condition (shape [2, 4]) dimension at axis 1 (value 4) and input x (shape [2, 6]) dimension at "
                "axis 1 (value 6) are neither equivalent nor broadcastable. Insert an explicit rebind if these dims "
                "will be equivalent at runtime."):
        build([tt(B, [2, 4]), tt(F32, [2, 6]), tt(F32, [2])], ops.where)


@pytest.mark.parametrize("fn,name,rmo", [(ops.logical_and, "AndOp", "rmo.and"), (ops.logical_or, "OrOp", "rmo.or"),
                                         (ops.logical_xor, "XorOp", "rmo.xor"), (lambda a, b: a & b, "AndOp", "rmo.and")])
def test_B7_3_logical_ops_need_bools(fn, name, rmo):
    with raises(ValueError, f"Failed to create op '{name}'", f"{rmo}: Inputs must be bools, got f16, f16",
                f"Failed to infer result type(s) for '{rmo}'"):
        build([tt(F16, [2]), tt(F16, [2])], fn)
    with raises(ValueError, f"{rmo}: Inputs must be bools, got si32, si32"):
        build([tt(DType.int32, [2]), tt(DType.int32, [2])], fn)


def test_B7_4_logical_not_needs_bool():
    with raises(ValueError, "Failed to create op 'MoNotOp'", "'rmo.mo.not' op operand #0 must be boolean element type"):
        build([tt(F32, [2])], ops.logical_not)


# ----------------------------------------------------------------------------- B8 split and chunk
def test_B8_1_split_sizes_must_be_static_ints():
    for shape in (["batch"], [4]):
        with raises(TypeError, "int(Dim('batch')): Int conversions only supported for static dims"):
            build([tt(F32, shape)], lambda x: ops.split(x, ["batch"]))


def test_B8_2_split_sizes_must_sum_to_the_dim():
    with raises(ValueError, "Split sizes must sum to dimension value; x.shape[axis]=Dim(15) != sum(sizes=[10, 6])"):
        build([tt(F32, [15])], lambda x: ops.split(x, [10, 6]))
    with raises(ValueError, "Split sizes must sum to dimension value; x.shape[axis]=Dim('n') != sum(sizes=[2, 3])"):
        build([tt(F32, ["n"])], lambda x: ops.split(x, [2, 3]))
    a = np.arange(15, dtype=np.float32)
    o1, o2 = run_graph(lambda x: ops.split(x, [10, 5]), [tt(F32, [15])], a)
    np.testing.assert_array_equal(o1, a[:10])
    np.testing.assert_array_equal(o2, a[10:])


def test_B8_3_split_sizes_must_be_positive():
    with raises(ValueError, "Split sizes must be positive: sizes=[10, -6]"):
        build([tt(F32, [16])], lambda x: ops.split(x, [10, -6]))


@pytest.mark.parametrize("n", [0, 1, 2])
def test_B8_4_chunk_of_a_symbolic_dim(n):
    with raises(TypeError, "int(Dim('batch')): Int conversions only supported for static dims"):
        build([tt(F32, ["batch"])], lambda x: ops.chunk(x, n))


def test_B8_5_chunk_must_divide_statically():
    with raises(ValueError, "chunk: chunks=2 must statically divide x.shape[axis]=Dim(1)"):
        build([tt(F32, [1])], lambda x: ops.chunk(x, 2))
    with raises(ValueError, f"chunk: chunks={2**63} must statically divide x.shape[axis]=Dim(1)"):
        build([tt(F32, [1])], lambda x: ops.chunk(x, 2**63))


# ----------------------------------------------------------------------------- B9 gather_nd
def test_B9_1_gather_nd_index_depth_zero():
    assert build([tt(F32, [1]), tt(I64, [0])], ops.gather_nd).shape == [1]
    assert build([tt(F32, [1, 1]), tt(I64, [1, 0])], ops.gather_nd).shape == [1, 1, 1]
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = run1(ops.gather_nd, [tt(F32, [2, 3]), tt(I64, [4, 0])], a, np.zeros((4, 0), np.int64))
    np.testing.assert_array_equal(got, np.broadcast_to(a, (4, 2, 3)))  # every empty index selects all of input
    got = run1(lambda x, i: ops.gather_nd(x, i, batch_dims=1), [tt(F32, [2, 3]), tt(I64, [2, 5, 0])], a,
               np.zeros((2, 5, 0), np.int64))
    np.testing.assert_array_equal(got, np.broadcast_to(a[:, None, :], (2, 5, 3)))


def test_B9_2_gather_nd_reads_bool_indices_as_integers():
    assert build([tt(F32, [4, 5]), tt(B, [3, 1])], ops.gather_nd).shape == [3, 5]
    a = np.arange(20, dtype=np.float32).reshape(4, 5)
    idx = np.array([[True], [False], [True]])
    got = run1(ops.gather_nd, [tt(F32, [4, 5]), tt(B, [3, 1])], a, idx)
    np.testing.assert_array_equal(got, a[idx.astype(np.int64)[:, 0]])
    with raises(ValueError, "must match up to batch_dims=1"):  # B9.4 then applies
        build([tt(F32, [1, 4]), tt(B, [2, 1])], lambda x, i: ops.gather_nd(x, i, batch_dims=1))
    assert build([tt(F32, [4, 5]), tt(DType.uint64, [3, 1])], ops.gather_nd).shape == [3, 5]  # uint64: accepted


def test_B9_3_gather_nd_float_indices():
    with raises(ValueError, "indices.dtype=float32 must be an integer type."):
        build([tt(F32, [4, 5]), tt(F32, [3, 1])], ops.gather_nd)


def test_B9_4_gather_nd_batch_dims_must_match():
    with raises(ValueError, "input=TensorValue(dtype=float32, shape=[Dim(1), Dim(4)], device=cpu:0) and "
                            "indices=TensorValue(dtype=int64, shape=[Dim(2), Dim(1)], device=cpu:0) must match up to "
                            "batch_dims=1"):
        build([tt(F32, [1, 4]), tt(I64, [2, 1])], lambda x, i: ops.gather_nd(x, i, batch_dims=1))


def test_B9_5_gather_nd_index_depth_must_be_static():
    with raises(ValueError, "index last dimension must be static: indices=TensorValue(dtype=int64, "
                            "shape=[Dim(2), Dim('k')], device=cpu:0)"):
        build([tt(F32, [4, 5]), tt(I64, [2, "k"])], ops.gather_nd)


# ----------------------------------------------------------------------------- B10 pad
def test_B10_1_reflect_pads_may_exceed_the_dim():
    assert build([tt(F32, [1])], lambda x: ops.pad(x, [0, 1], mode="reflect")).shape == [2]
    assert build([tt(F32, [2])], lambda x: ops.pad(x, [5, 5], mode="reflect")).shape == [12]
    for n, pads in ((1, (0, 1)), (1, (3, 2)), (2, (5, 5)), (3, (7, 4))):
        a = np.arange(1, n + 1, dtype=np.float32) * 1.5
        got = run1(lambda x: ops.pad(x, list(pads), mode="reflect"), [tt(F32, [n])], a)
        np.testing.assert_array_equal(got, np.pad(a, pads, mode="reflect"))


def test_B10_2_edge_pad_of_an_empty_dim_builds():
    assert build([tt(F32, [0])], lambda x: ops.pad(x, [0, 1], mode="edge")).shape == [1]
    a = np.array([2.5], np.float32)
    got = run1(lambda x: ops.pad(x, [3, 2], mode="edge"), [tt(F32, [1])], a)
    np.testing.assert_array_equal(got, np.pad(a, (3, 2), mode="edge"))


def test_B10_3_unsupported_mode():
    with raises(ValueError, "unsupported padding mode 'wrap'; expected 'constant', 'reflect', or 'edge'"):
        build([tt(F32, [3])], lambda x: ops.pad(x, [1, 1], mode="wrap"))


# ----------------------------------------------------------------------------- B11 range, range_like
def test_B11_1_range_needs_dtype_and_device():
    with raises(TypeError, "range() missing 2 required keyword-only arguments: 'dtype' and 'device'"):
        build([], lambda: ops.range(0, 5))


@pytest.mark.parametrize("args,n,dt", [((0, 5, 2), 2, DType.int32), ((0, 5, 10), 0, DType.int32),
                                       ((0, -5, -2), 2, DType.int64), ((0.0, 1.0, 0.3), 3, F32),
                                       ((0, 5, 0), 0, F32), ((3, 11, 3), 2, I64)])
def test_B11_2_range_length_is_floored(args, n, dt):
    r = build([], lambda: ops.range(*args, dtype=dt, device=C))
    assert r.shape == [n]
    got = run1(lambda: ops.range(*args, dtype=dt, device=C), [])
    start, _, step = args
    want = (start + step * np.arange(n, dtype=np.float64)).astype(dt.to_numpy())
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got.dtype == dt.to_numpy()


def test_B11_3_range_values_must_fit_the_dtype():
    with raises(ValueError, "Unsafe cast: Can't promote python int with value (9223372036854775808) to "
                            "dtype(DType.int64). It would lose precision."):
        build([], lambda: ops.range(2**62, 2**63, 1, dtype=I64, device=C))


def test_B11_4_range_length_outside_int64():
    with raises(ValueError, "Dim value must be -2**63 <= dim < 2**63"):
        build([], lambda: ops.range(0, 2**63, 1, dtype=I64, device=C))

    def consts():
        k = [ops.constant(v, I64, C) for v in (0, 5, 1)]
        return ops.range(*k, out_dim=2**63, dtype=I64, device=C)

    with raises(ValueError, "Dim value must be -2**63 <= dim < 2**63"):
        build([], consts)


def test_B11_5_range_tensor_inputs_must_be_on_cpu():
    with raises(ValueError, "Range input values must be on CPU"):
        build([], lambda: ops.range(ops.constant(0, DType.int32, device=G), 5, out_dim=5, dtype=DType.int32,
                                    device=G))


def test_B11_6_range_inputs_must_be_scalars():
    with raises(ValueError, "range expected scalar values as inputs!"):
        build([tt(I64, [1])], lambda s: ops.range(s, 5, out_dim=5, dtype=I64, device=C))


def test_B11_7_dynamic_range_needs_out_dim():
    with raises(ValueError, "Dynamic ranges must provide an explicit out_dim"):
        build([tt(I64, [])], lambda s: ops.range(s, 5, dtype=I64, device=C))


def test_B11_8_out_dim_of_constant_inputs_is_not_checked():
    k = lambda: [ops.constant(v, I64, C) for v in (0, 5, 1)]  # noqa: E731
    assert build([], lambda: ops.range(*k(), out_dim=7, dtype=I64, device=C)).shape == [7]


def test_B11_9_eager_range_like_takes_a_tensor():
    from max.experimental.tensor import Tensor

    t = Tensor.constant(np.zeros((3, 4, 5), np.float32))
    r = Tensor.range_like(t)
    assert r.dtype is F32 and list(r.shape) == [3, 4, 5]
    vals = r.to_numpy()
    np.testing.assert_array_equal(vals[1, 2, :], np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal(vals, np.broadcast_to(np.arange(5, dtype=np.float32), (3, 4, 5)))
    with raises(AttributeError, "'TensorType' object has no attribute 'layout'"):
        Tensor.range_like(TensorType(F32, [3, 4, 5], C))


def test_B5_4_eager_reduction_with_axis_none_is_shape_1():
    """B5.4: eager ``t.max/min/mean/sum/argmax(axis=None)`` reduce every element to shape [1]; ``.item()`` reads it."""
    from max.experimental.tensor import Tensor

    data = np.array([[1.2, 3.5, 2.1], [2.3, 1.9, 4.2]], np.float32)
    t = Tensor(data)
    for name, ref in [("max", data.max()), ("min", data.min()), ("mean", data.mean()), ("sum", data.sum()),
                      ("argmax", 5)]:
        r = getattr(t, name)(axis=None)
        assert list(r.shape) == [1], name
        assert r.item() == pytest.approx(float(ref), rel=1e-6), name
