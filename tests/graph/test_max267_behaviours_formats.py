"""MAX 26.7's observed behaviours B1-B4 (/work/shared/max-behaviours.md): shared formats (verifier
messages, reprs, the device check), the scatter family, other graph-op errors and axis errors.

Each test names its fact.  Exception types are checked exactly (``type(e) is ...``), as the facts'
rule 1 asks; messages must contain MAX's key phrase.
"""

from __future__ import annotations

import numpy as np
import pytest

from max.driver import CPU, Buffer
from max.dtype import DType
from max.graph import DeviceRef, Dim, Graph, Shape, TensorType, ops
from max.graph.ops._common import normalize_axis, same_device, verifier_error
from support import build, raises

C = DeviceRef.CPU()
G = DeviceRef.GPU()
F32, I64 = DType.float32, DType.int64

SCATTER = ["scatter", "scatter_add", "scatter_max", "scatter_min", "scatter_mul"]
SCATTER_ND = ["scatter_nd", "scatter_nd_add", "scatter_nd_max", "scatter_nd_min", "scatter_nd_mul"]


def tt(dt, shape, dev=C):
    return TensorType(dt, shape, dev)


# ----------------------------------------------------------------------------- B1 shared formats
def test_B1_1_verifier_format():
    with raises(ValueError) as info:
        build([tt(DType.float16, [6]), tt(DType.uint16, [6])], lambda a, b: a - b)
    assert str(info.value) == (
        "Failed to create op 'SubOp':\n"
        "Inputs:\n"
        "    lhs = TensorValue(dtype=float16, shape=[Dim(6)], device=cpu:0)\n"
        "    rhs = TensorValue(dtype=uint16, shape=[Dim(6)], device=cpu:0)\n"
        "\n"
        "Diagnostics:\n"
        "    Failed to resolve valid dtype: Unsafe cast from ui16 to f16. Insert an explicit cast op if this "
        "conversion is wanted.\n"
        "Failed to infer result type(s) for 'rmo.sub'"
    )
    # the formatter itself (shared by every verifier-style failure)
    e = verifier_error("FooOp", "rmo.foo", [("x", 1), ("y", "a")], "first", "second")
    assert type(e) is ValueError
    assert str(e) == ("Failed to create op 'FooOp':\nInputs:\n    x = 1\n    y = 'a'\n\nDiagnostics:\n"
                      "    first\n    second\nFailed to infer result type(s) for 'rmo.foo'")


def test_B1_2_tensor_type_repr():
    t = TensorType(DType.float32, [5, 3], DeviceRef.CPU())
    assert repr(t) == str(t) == "TensorType(dtype=float32, shape=[Dim(5), Dim(3)], device=cpu:0)"
    # graph printouts keep their compact form
    assert t.to_mlir() == "tensor<float32, [5, 3], cpu:0>"


def test_B1_3_tensor_value_repr():
    v = build([tt(F32, [3])], lambda x: x)
    assert repr(v) == "TensorValue(dtype=float32, shape=[Dim(3)], device=cpu:0)"
    w = build([tt(F32, ["n", 2])], lambda x: x + 1)
    assert repr(w) == "TensorValue(dtype=float32, shape=[Dim('n'), Dim(2)], device=cpu:0)"


def test_B1_4_dtype_repr_and_str():
    assert repr(DType.float32) == "float32"
    assert str(DType.float32) == "DType.float32"
    assert f"{DType.int8}" == "DType.int8" and repr([DType.bool]) == "[bool]"


def test_B1_5_device_ref_repr():
    assert repr(DeviceRef.CPU()) == str(DeviceRef.CPU()) == "cpu:0"
    assert repr(DeviceRef.GPU(1)) == "gpu:1"


def test_B1_6_shape_repr():
    s = Shape([2, "n"])
    assert repr(s) == str(s) == "[Dim(2), Dim('n')]"
    assert str(Shape([])) == "[]"


def test_B1_7_cpu_device_repr():
    assert repr(CPU()) == str(CPU()) == "Device(type=cpu,id=0)"


def test_B1_8_buffer_repr_and_str():
    b = Buffer.from_numpy(np.zeros(4, np.int8))
    assert repr(b) == "max.driver.Buffer(DType.int8, (4,), cpu[0])"
    assert str(b) == "Buffer([0 0 0 0], dtype=DType.int8, shape=(4,), device=Device(type=cpu,id=0))"
    f = Buffer.from_numpy(np.array([[1.5, 2.0]], np.float32))
    assert str(f) == f"Buffer({np.array([[1.5, 2.0]], np.float32)}, dtype=DType.float32, shape=(1, 2), device=Device(type=cpu,id=0))"


def _device_text(*pairs):
    return "Input values must be on the same device" + "".join(f"\n    {n}: {t!r}" for n, t in pairs)


@pytest.mark.parametrize("other", [G, DeviceRef.CPU(1)], ids=["gpu0ref", "cpu1"])
def test_B1_9_device_mismatch_binary_ops(other):
    a, b = tt(F32, [5, 3]), tt(F32, [5, 3], other)
    for fn in (ops.sub, ops.add, ops.mul, ops.matmul):
        with raises(ValueError) as info:
            build([a, b], fn)
        assert str(info.value) == _device_text(("lhs", a), ("rhs", b))
    ba, bb = tt(DType.bool, [5, 3]), tt(DType.bool, [5, 3], other)
    for fn in (ops.logical_and, ops.logical_or, ops.logical_xor):
        with raises(ValueError) as info:
            build([ba, bb], fn)
        assert str(info.value) == _device_text(("lhs", ba), ("rhs", bb))


def test_B1_9_device_mismatch_labels_of_other_ops():
    x, xg = tt(F32, [5, 3]), tt(F32, [5, 3], G)
    ig, i = tt(I64, [2, 1], G), tt(I64, [5, 3])
    with raises(ValueError) as info:
        build([x, ig], lambda a, b: ops.gather(a, b, 0))
    assert str(info.value) == _device_text(("input", x), ("indices", ig))
    with raises(ValueError) as info:
        build([x, ig], ops.gather_nd)
    assert str(info.value) == _device_text(("input", x), ("indices", ig))
    c = tt(DType.bool, [5, 3])
    with raises(ValueError) as info:
        build([c, x, xg], ops.where)
    assert str(info.value) == _device_text(("condition", c), ("x", x), ("y", xg))
    for name in SCATTER:
        with raises(ValueError) as info:
            build([x, xg, i], lambda a, u, j: getattr(ops, name)(a, u, j, 0))
        assert str(info.value) == _device_text(("input", x), ("updates", xg), ("indices", i))
    for name in SCATTER_ND:
        with raises(ValueError) as info:
            build([x, xg, tt(I64, [5, 2])], getattr(ops, name))
        assert str(info.value) == _device_text(("input", x), ("updates", xg), ("indices", tt(I64, [5, 2])))
    for fn in (ops.concat, ops.stack):
        with raises(ValueError) as info:
            build([x, x, xg], lambda *vs: fn(list(vs)))
        assert str(info.value) == _device_text(("0", x), ("1", x), ("2", xg))
    # the helper itself
    with Graph("d", input_types=[x, xg]) as g:
        with raises(ValueError, "Input values must be on the same device\n    a: "):
            same_device("op", *(v.tensor for v in g.inputs), labels=("a", "b"))


# ----------------------------------------------------------------------------- B2 scatter family
def _scatter(name, types, axis=0):
    fn = getattr(ops, name)
    if name.startswith("scatter_nd"):
        return build(types, fn)
    return build(types, lambda a, u, i: fn(a, u, i, axis))


@pytest.mark.parametrize("name", SCATTER)
def test_B2_1_scatter_accepts_any_shapes(name):
    for types in ([tt(F32, [5]), tt(F32, [2]), tt(I64, [3])],
                  [tt(F32, [5]), tt(F32, [2, 2]), tt(I64, [2, 2])],
                  [tt(F32, [0]), tt(F32, [1]), tt(I64, [1])]):
        r = _scatter(name, types)
        assert r.type == types[0]


@pytest.mark.parametrize("name", SCATTER_ND)
def test_B2_2_scatter_nd_accepts_any_shapes(name):
    for types in ([tt(F32, [5, 3]), tt(F32, [2, 4]), tt(I64, [2, 1])],
                  [tt(F32, [5, 3]), tt(F32, [2]), tt(I64, [2, 3])]):
        assert _scatter(name, types).type == types[0]


@pytest.mark.parametrize("name", SCATTER[1:] + SCATTER_ND[1:])
def test_B2_3_reducing_scatters_accept_bool(name):
    idx = tt(I64, [2, 1]) if "_nd" in name else tt(I64, [2])
    r = _scatter(name, [tt(DType.bool, [5]), tt(DType.bool, [2]), idx])
    assert r.dtype is DType.bool and r.shape == [5]


@pytest.mark.parametrize("name", SCATTER + SCATTER_ND)
@pytest.mark.parametrize("idt", [DType.float32, DType.uint8])
def test_B2_4_scatter_indices_must_be_int32_or_int64(name, idt):
    with raises(ValueError, f"Invalid indices dtype: '{idt}'. Indices must be of type int32 or int64."):
        _scatter(name, [tt(F32, [5]), tt(F32, [2]), tt(idt, [2, 1])])
    _scatter(name, [tt(F32, [5]), tt(F32, [2]), tt(DType.int32, [2, 1])])


@pytest.mark.parametrize("name", SCATTER)
def test_B2_5_scatter_axis_out_of_range(name):
    x3 = [tt(F32, [2, 3, 4]), tt(F32, [2, 3, 4]), tt(I64, [2, 3, 4])]
    with raises(ValueError, "Invalid axis value 100. Axis must be in range [-3, 2]"):
        _scatter(name, x3, 100)
    with raises(ValueError, "Invalid axis value -4. Axis must be in range [-3, 2]"):
        _scatter(name, x3, -4)
    with raises(ValueError, "Invalid axis value 2. Axis must be in range [-1, 0]"):
        _scatter(name, [tt(F32, [5]), tt(F32, [2]), tt(I64, [2])], 2)


@pytest.mark.parametrize("name", SCATTER)
def test_B2_6_scatter_dtype_mismatch(name):
    with raises(ValueError, "The input dtype 'DType.float32' and updates dtype 'DType.float64' must match."):
        _scatter(name, [tt(F32, [5]), tt(DType.float64, [2]), tt(I64, [2])])


@pytest.mark.parametrize("name", SCATTER_ND)
def test_B2_7_scatter_nd_dtype_mismatch(name):
    with raises(ValueError) as info:
        _scatter(name, [tt(F32, [5]), tt(DType.float64, [2]), tt(I64, [2, 1])])
    assert str(info.value) == "The input dtype (DType.float32) and updates dtype (DType.float64) must match"


def test_B2_8_check_order():
    # scatter*: dtype match, then axis, then indices dtype
    for name in SCATTER:
        with raises(ValueError, "The input dtype 'DType.float32' and updates dtype 'DType.float64'"):
            _scatter(name, [tt(F32, [5]), tt(DType.float64, [2]), tt(F32, [2])], 100)
        with raises(ValueError, "Invalid axis value 100."):
            _scatter(name, [tt(F32, [5]), tt(F32, [2]), tt(F32, [2])], 100)
        with raises(ValueError, "Invalid axis value 100."):  # bool input still gets the axis error
            _scatter(name, [tt(DType.bool, [5]), tt(DType.bool, [2]), tt(I64, [2])], 100)
        with raises(ValueError, "Invalid indices dtype: 'DType.float32'"):
            _scatter(name, [tt(DType.bool, [5]), tt(DType.bool, [2]), tt(F32, [2])], 0)
    # scatter_nd*: dtype before shape and device
    for name in SCATTER_ND:
        with raises(ValueError, "The input dtype (DType.float32) and updates dtype (DType.int64) must match"):
            _scatter(name, [tt(F32, [5]), tt(I64, [7, 7], G), tt(I64, [2, 1])])


def test_B2_scatter_results_still_match_numpy():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    idx = np.array([[2, 0, 1], [1, 2, 0]], np.int32)  # int32 indices work too
    with Graph("s", input_types=[tt(F32, [2, 3]), tt(F32, [2, 3]), tt(DType.int32, [2, 3])]) as g:
        x, u, i = (v.tensor for v in g.inputs)
        g.output(ops.scatter(x, u, i, 1), ops.scatter_add(x, u, i, 1))
    from max.engine import InferenceSession

    got = [r.to_numpy() for r in InferenceSession().load(g).execute(*(Buffer.from_numpy(v) for v in (a, a * 10, idx)))]
    ref = a.copy()
    ref_add = a.astype(np.float64).copy()
    for r in range(2):
        for j in range(3):
            ref[r, idx[r, j]] = a[r, j] * 10
            ref_add[r, idx[r, j]] += a[r, j] * 10
    np.testing.assert_array_equal(got[0], ref)
    np.testing.assert_allclose(got[1], ref_add)


# ----------------------------------------------------------------------------- B3 other graph-op errors
def test_B3_1_broadcast_to_verifier_message():
    with raises(ValueError, "Failed to create op 'BroadcastToOp'",
                "[broadcast_to] input dimension at index 0 (6) must be either 1 or equal to corresponding output "
                "dimension at index 1 (7)", "Failed to infer result type(s) for 'rmo.broadcast_to'"):
        build([tt(F32, [6])], lambda x: ops.broadcast_to(x, [6, 7]))
    with raises(ValueError, "[broadcast_to] input dimension at index 0 (D0) must be either 1 or equal to "
                            "corresponding output dimension at index 1 (D2)"):
        build([tt(F32, ["D0"])], lambda x: ops.broadcast_to(x, ["D1", "D2"]))
    from max.experimental import functional as F
    from max.experimental.tensor import Tensor

    t = Tensor.constant(np.zeros((4, 6), np.float32))
    with raises(ValueError, "[broadcast_to] input dimension at index 0 (4) must be either 1 or equal to "
                            "corresponding output dimension at index 0 (3)"):
        F.broadcast_to(t, [3, 6])


def test_B3_2_layer_norm_messages():
    def ln(g, b, eps=1e-5):
        return build([tt(F32, [2, 4]), tt(F32, [g]), tt(F32, [b])], lambda x, gg, bb: ops.layer_norm(x, gg, bb, eps))

    with raises(ValueError, "Gamma size 3 does not match dimension of reduction 4."):
        ln(3, 4)
    with raises(ValueError, "Beta size 3 does not match dimension of reduction 4."):
        ln(4, 3)
    for eps in (0.0, -1.0):
        with raises(ValueError, "epsilon must be positive"):
            ln(4, 4, eps)
    assert ln(4, 4, float("nan")).shape == [2, 4]  # MAX accepts NaN


def test_B3_3_invalid_symbolic_dim_name():
    with raises(ValueError, "Invalid name for symbolic dimension"):
        Dim("1")
    with raises(ValueError, "Invalid name for symbolic dimension"):
        TensorType(DType.float32, ["M", "1"], C)


def test_B3_4_reshape_cannot_infer_next_to_zero():
    with raises(ValueError, "reshape(): cannot infer -1 dimension when another dimension is 0"):
        build([tt(F32, [4, 5])], lambda x: x.reshape([-1, 0, 2]))


def test_B3_5_reshape_count_mismatch_suggests_rebind():
    hint = "If you are confident this is correct, consider a rebind to assert that the reshape is valid"
    with raises(ValueError, "Failed to create op 'ReshapeOp'", "[reshape] input and output number of elements must match",
                hint):
        build([tt(F32, ["n_patches", 2048])], lambda x: x.reshape([x.shape[0] // 4, 4, 2048]))
    with raises(ValueError, "[reshape] input and output number of elements must match", hint):
        build([tt(F32, [4, 5])], lambda x: x.reshape([3, 7]))


def test_B3_6_slice_index_overflow():
    with raises(ValueError, "Failed to create op 'SliceOp'",
                "rmo.slice index computation overflow: doesn't fit in an int64"):
        build([tt(F32, [1])], lambda x: ops.slice_tensor(x, [slice(-6618538577426847335, None, 3019951631318595876)]))


def test_B3_7_slice_stop_out_of_range():
    with raises(ValueError, "Failed to create op 'SliceOp'", "rmo.slice stop index 1024 out of range for dimension size 3",
                "Failed to infer result type(s) for 'rmo.slice'"):
        build([tt(F32, [4096, 3])], lambda x: x[:, 0:1024])


def test_B3_8_slice_start_out_of_range():
    with raises(ValueError, "rmo.slice start index 20 out of range for dimension size 4"):
        build([tt(F32, [4])], lambda x: ops.slice_tensor(x, [slice(20, 2, 1)]))


def test_B3_9_slice_bounds_against_the_step():
    msg = ("rmo.slice start and stop should be increasing for positive step and decreasing for negative step, "
           "but got start {}, stop {} for step 1")
    with raises(ValueError, "Failed to create op 'SliceOp'", msg.format(2, 1)):
        build([tt(F32, ["dim0"])], lambda x: x[2:1])
    with raises(ValueError, msg.format(3, 1)):
        build([tt(F32, [5])], lambda x: x[3:1])
    assert build([tt(F32, ["dim0"])], lambda x: x[1:2]).shape == [1]


def test_B3_10_stack_messages_and_order():
    with raises(ValueError, "Expected at least one value to stack"):
        build([], lambda: ops.stack([]))
    with raises(ValueError, "All inputs to stack must be the same rank"):
        build([tt(F32, [2, 3]), tt(F32, [2])], lambda a, b: ops.stack([a, b]))
    with raises(ValueError, "All inputs to stack must have the same dtype"):  # dtype before shape
        build([tt(F32, [2, 3]), tt(DType.int32, [2, 4])], lambda a, b: ops.stack([a, b]))
    with raises(ValueError, "Concat inputs differ on non-concat axis 2: vals=[") as info:
        build([tt(F32, [2, 3]), tt(F32, [2, 4])], lambda a, b: ops.stack([a, b]))
    assert "TensorValue(dtype=float32, shape=[Dim(1), Dim(2), Dim(4)], device=cpu:0)" in str(info.value)


def test_B3_11_while_loop_needs_values():
    with Graph("w") as g:
        x = ops.constant(0, DType.int32, C)
        with raises(ValueError, "While loops must have at least one iteration value."):
            ops.while_loop([], lambda: x < 1, lambda: [])
        g.output(x)


def test_B3_12_shape_to_tensor_argument_errors():
    with raises(TypeError, "'NoneType' object is not iterable"):
        build([], lambda: ops.shape_to_tensor(None))
    with raises(TypeError, "'int' object is not iterable"):
        build([], lambda: ops.shape_to_tensor(42))
    with raises(ValueError, "Invalid name for symbolic dimension"):
        build([], lambda: ops.shape_to_tensor("not a shape"))
    assert build([], lambda: ops.shape_to_tensor("ab")).shape == [2]  # a string is read as dim names


def test_B3_13_eager_from_dim_of_a_symbolic_dim():
    from max.experimental.tensor import Tensor

    for d, text in ((Dim("x"), "x"), (Dim("a") * Dim("b"), "a * b")):
        with raises(ValueError, f"Tensor.from_dim({text}): a symbolic dimension has no value in eager mode. Use a "
                                "static dimension, or call this while building a graph (e.g. inside Module.compile "
                                "or F.functional)."):
            Tensor.from_dim(d)


# ----------------------------------------------------------------------------- B4 axis errors
@pytest.mark.parametrize("name", ["sum", "mean", "min", "max", "prod", "argmax", "argmin"])
@pytest.mark.parametrize("dt", [F32, DType.bool])
def test_B4_1_reduction_axis_out_of_range_is_value_error(name, dt):
    fn = getattr(ops, name)
    with raises(ValueError, "Invalid axis=5 for input x.rank=2"):
        build([tt(dt, [2, 3])], lambda x: fn(x, axis=5))
    with raises(ValueError, "Invalid axis=-1 for input x.rank=0"):
        build([tt(dt, [])], lambda x: fn(x))


def test_B4_2_transpose_axis_out_of_range_is_index_error():
    with raises(IndexError, "Axis axis_1 out of range (expected to be in range of [-2, 1], but got 2)"):
        build([tt(F32, [2, 3])], lambda x: x.transpose(2, 0))
    with raises(IndexError, "Axis axis_2 out of range (expected to be in range of [-2, 1], but got -3)"):
        build([tt(F32, [2, 3])], lambda x: x.transpose(0, -3))
    with raises(IndexError, "Axis axis_1 out of range (expected to be in range of [-1, 0], but got 1)"):
        build([tt(F32, [])], lambda x: x.transpose(1, 0))
    with raises(IndexError, "Axis axis_2 out of range (expected to be in range of [-1, 0], but got 1)"):
        build([tt(F32, [])], lambda x: x.transpose(0, 1))
    assert build([tt(F32, [])], lambda x: x.transpose(0, -1)).shape == []


def test_B4_3_stack_axis_counts_the_output_rank():
    with raises(IndexError, "Axis out of range (expected to be in range of [-3, 2], but got -4)"):
        build([tt(F32, [2, 3])], lambda x: ops.stack([x], axis=-4))
    assert build([tt(F32, [2, 3])], lambda x: ops.stack([x], axis=-3)).shape == [1, 2, 3]


def test_B4_4_split_axis_out_of_range():
    with raises(IndexError, "Axis must be in range [-1, 1), got 2"):
        build([tt(F32, [15])], lambda x: ops.split(x, [10, 5], axis=2))


def test_B4_shared_axis_helper_forms():
    """One helper raises every form; the ops without a fact of their own use the IndexError form."""
    assert normalize_axis(-1, 3, "op") == 2
    with raises(ValueError, "Invalid axis=3 for input x.rank=3"):
        normalize_axis(3, 3, "op", form="reduce")
    with raises(IndexError, "Axis out of range (expected to be in range of [-3, 2], but got 3)"):
        normalize_axis(3, 3, "op")
    with raises(ValueError, "Axis out of range"):
        normalize_axis(3, 3, "op", form="value")
    with raises(IndexError, "Axis must be in range [-3, 3), got 3"):
        normalize_axis(3, 3, "op", form="split")
    with raises(ValueError, "Invalid axis value 3. Axis must be in range [-3, 2]"):
        normalize_axis(3, 3, "op", form="scatter")
    with raises(TypeError, "axis must be an int"):
        normalize_axis(1.0, 3, "op")
    for fn in (lambda x: ops.softmax(x, 2), lambda x: ops.cumsum(x, 2), lambda x: ops.concat([x], 2),
               lambda x: ops.squeeze(x, 2), lambda x: ops.unsqueeze(x, 3), lambda x: ops.gather(x, [0], 2),
               lambda x: ops.top_k(x, 1, 2), lambda x: ops.chunk(x, 1, 2)):
        with raises(IndexError, "Axis out of range (expected to be in range of ["):
            build([tt(F32, [2, 3])], fn)
