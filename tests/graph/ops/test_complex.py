"""as_interleaved_complex against numpy reshapes; errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from max.dtype import DType
from max.graph import Graph, ops
from support import run1, tt


@given(shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4), half=st.integers(1, 4),
       dt=st.sampled_from([DType.float32, DType.float64, DType.int32]))
def test_as_interleaved_complex_matches_reshape(shape, half, dt):
    x = np.arange(int(np.prod(shape)) * 2 * half).reshape(*shape, 2 * half).astype(dt.to_numpy())
    out = run1(ops.as_interleaved_complex, [tt(dt, x.shape)], x)
    assert out.dtype == x.dtype and out.shape == (*shape, half, 2)
    np.testing.assert_array_equal(out, x.reshape(*shape, half, 2))
    # pairs are (real, imag)
    c = out[..., 0] + 1j * out[..., 1]
    np.testing.assert_array_equal(c, x[..., 0::2] + 1j * x[..., 1::2])


def test_as_interleaved_complex_types_and_errors():
    with Graph("t", input_types=[tt(DType.float32, ["b", 6])]) as g:
        y = ops.as_interleaved_complex(g.inputs[0].tensor)
        assert y.shape == ["b", 3, 2]
        # feeds irfft's complex layout directly
        assert ops.irfft(y, input_is_complex=True).shape == ["b", 4]
        with pytest.raises(ValueError, match=r"as_interleaved_complex: the last dim of x must be even"):
            ops.as_interleaved_complex(ops.reshape(g.inputs[0].tensor, ["b", 2, 3]))
    with Graph("s", input_types=[tt(DType.float32, [2, "d"]), tt(DType.float32, [])]) as g:
        with pytest.raises(ValueError, match=r"as_interleaved_complex: the last dim of x must be static"):
            ops.as_interleaved_complex(g.inputs[0].tensor)
        with pytest.raises(ValueError, match=r"as_interleaved_complex: x must have rank >= 1"):
            ops.as_interleaved_complex(g.inputs[1].tensor)
