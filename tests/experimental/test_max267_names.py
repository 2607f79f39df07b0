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
