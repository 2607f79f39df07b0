"""MAX 26.7 user-facing names of max.experimental (issue 37, /work/shared/max-behaviours.md)."""

import numpy as np
import pytest

from max.driver import CPU
from max.experimental.sharding import DeviceMesh


# ----------------------------------------------------------------------------- DeviceMesh
def test_device_mesh_single_repr_devices_equality():
    m = DeviceMesh.single(CPU())
    assert repr(m) == "DeviceMesh(_=1)"
    assert m.devices == (CPU(),)
    assert m == DeviceMesh.single(CPU())
    assert m == DeviceMesh((CPU(),), (1,), ("_",))
    assert m != DeviceMesh((CPU(),), (1,), ("tp",))
    assert m.is_single and m.is_simulated
    assert DeviceMesh.default() == m


def test_device_mesh_constructor_and_coords():
    m = DeviceMesh(tuple(CPU() for _ in range(6)), (2, 3), ("dp", "tp"))
    assert repr(m) == "DeviceMesh(dp=2, tp=3)"
    assert not m.is_single and m.is_simulated
    # row-major: flat index i has coords divmod(i, 3)
    for i in range(6):
        assert (m.device_coord(i, 0), m.device_coord(i, "tp")) == divmod(i, 3)
    assert m.axis_size("tp") == 3
    with pytest.raises(ValueError):
        m.axis_size("pp")
    with pytest.raises(ValueError):
        DeviceMesh((CPU(), CPU()), (3,), ("a",))


# ----------------------------------------------------------------------------- tensor defaults (B14.11-B14.15)
from max.driver import Buffer  # noqa: E402
from max.dtype import DType  # noqa: E402
from max.experimental import tensor as T  # noqa: E402
from max.graph import DeviceRef, TensorType  # noqa: E402


def test_B14_11_default_device_is_a_single_device_mesh():
    m = T._default_device()
    assert repr(m) == "DeviceMesh(_=1)"
    assert m.devices == (CPU(),)
    assert m == DeviceMesh.single(CPU())
    with T.default_device(CPU(1)):
        assert T._default_device().devices == (CPU(1),)
        assert T.Tensor.zeros([2]).device == CPU(1)
    assert T._default_device().devices == (CPU(),)


def test_B14_12_default_dtype_of_device_and_mesh():
    assert T._default_dtype(CPU()) == DType.float32
    assert T._default_dtype(DeviceMesh.single(CPU())) == DType.float32
    with T.default_dtype(DType.int32):
        assert T._default_dtype(CPU()) == DType.int32


def test_B14_13_defaults_returns_dtype_and_mesh():
    dtype, mesh = T.defaults(dtype=None, device=None)
    assert dtype == DType.float32 and isinstance(mesh, DeviceMesh) and mesh == DeviceMesh.single(CPU())
    assert T.defaults(DType.int8, CPU()) == (DType.int8, DeviceMesh.single(CPU()))
    with pytest.raises(TypeError):
        T.defaults("float32", None)


def test_B14_14_default_device_context_value_is_the_mesh():
    with T.default_device(CPU()) as d:
        assert d == DeviceMesh.single(CPU())
    with T.default_device(DeviceMesh.single(CPU())) as d:
        assert repr(d) == "DeviceMesh(_=1)"
        x = T.Tensor.ones([3])
        assert x.device == CPU()
    with T.default_dtype(DType.float64) as dt:
        assert dt == DType.float64


def test_B14_15_defaults_like_and_driver_tensor_type():
    x = T.Tensor.zeros([1], dtype=DType.int32, device=CPU())
    with T.defaults_like(x) as v:
        assert v is None
        y = T.Tensor.zeros((2, 3))
        z = T.Tensor.zeros((2, 3), dtype=DType.float32)
    assert (y.dtype, y.device) == (DType.int32, CPU())
    assert z.dtype == DType.float32
    with T.defaults_like(TensorType(DType.float64, [3], DeviceRef.CPU())):
        assert T.Tensor.ones([2]).dtype == DType.float64
    assert T.Tensor.ones([2]).dtype == DType.float32
    with pytest.raises(TypeError):
        with T.defaults_like(3):
            pass
    buf = Buffer.from_numpy(np.arange(6, dtype=np.int16).reshape(2, 3))
    assert T.driver_tensor_type(buf) == TensorType(DType.int16, [2, 3], DeviceRef.CPU())
    assert "defaults_like" in T.__all__ and "driver_tensor_type" in T.__all__
