"""scatter_{add,max,min,mul} and scatter_nd_{add,max,min,mul} against float64 numpy loops."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, ops
from support import run1, tt

SCATTER = {"add": ops.scatter_add, "max": ops.scatter_max, "min": ops.scatter_min, "mul": ops.scatter_mul}
SCATTER_ND = {"add": ops.scatter_nd_add, "max": ops.scatter_nd_max, "min": ops.scatter_nd_min,
              "mul": ops.scatter_nd_mul}
KINDS = list(SCATTER)
_UFUNC = {"add": np.add, "max": np.maximum, "min": np.minimum, "mul": np.multiply}


def _ref_scatter(x, upd, idx, axis, kind):
    out = x.astype(np.float64).copy()
    ax = axis % x.ndim
    for pos in np.ndindex(*idx.shape):
        tgt = list(pos)
        tgt[ax] = idx[pos] % x.shape[ax]
        out[tuple(tgt)] = _UFUNC[kind](out[tuple(tgt)], upd[pos])
    return out


def _ref_scatter_nd(x, upd, idx, kind):
    out = x.astype(np.float64).copy()
    k = idx.shape[-1]
    for pos in np.ndindex(*idx.shape[:-1]):
        tgt = tuple(int(i) % x.shape[j] for j, i in enumerate(idx[pos]))
        out[tgt] = _UFUNC[kind](out[tgt], upd[pos])
    assert k >= 1
    return out


@pytest.mark.parametrize("kind", KINDS)
@given(data=st.data())
def test_scatter_reduce_matches_numpy(kind, data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4), label="shape")
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    ax = axis % len(shape)
    ishape = tuple(data.draw(st.integers(1, s), label=f"d{i}") if i != ax else data.draw(st.integers(1, 5))
                   for i, s in enumerate(shape))
    dt = data.draw(st.sampled_from([DType.float32, DType.float64, DType.int32, DType.int64]), label="dtype")
    npdt = dt.to_numpy()
    x = data.draw(hnp.arrays(npdt, shape, elements=st.integers(-4, 4)), label="x")
    upd = data.draw(hnp.arrays(npdt, ishape, elements=st.integers(-4, 4)), label="updates")
    idx = data.draw(hnp.arrays(np.int64, ishape, elements=st.integers(-shape[ax], shape[ax] - 1)), label="idx")
    fn = SCATTER[kind]
    out = run1(lambda a, u, i: fn(a, u, i, axis=axis), [tt(dt, shape), tt(dt, ishape), tt(DType.int64, ishape)],
               x, upd, idx)
    assert out.dtype == npdt
    np.testing.assert_array_equal(out.astype(np.float64), _ref_scatter(x, upd, idx, axis, kind))


@pytest.mark.parametrize("kind", KINDS)
@given(data=st.data())
def test_scatter_nd_reduce_matches_numpy(kind, data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4), label="shape")
    k = data.draw(st.integers(1, len(shape)), label="depth")
    n = data.draw(st.integers(1, 6), label="n_updates")
    dt = data.draw(st.sampled_from([DType.float32, DType.int64]), label="dtype")
    npdt = dt.to_numpy()
    x = data.draw(hnp.arrays(npdt, shape, elements=st.integers(-4, 4)), label="x")
    ushape = (n,) + tuple(shape[k:])
    upd = data.draw(hnp.arrays(npdt, ushape, elements=st.integers(-3, 3)), label="updates")
    cols = [data.draw(hnp.arrays(np.int64, (n,), elements=st.integers(-shape[j], shape[j] - 1))) for j in range(k)]
    idx = np.stack(cols, axis=-1)
    fn = SCATTER_ND[kind]
    out = run1(lambda a, u, i: fn(a, u, i), [tt(dt, shape), tt(dt, ushape), tt(DType.int64, (n, k))], x, upd, idx)
    np.testing.assert_array_equal(out.astype(np.float64), _ref_scatter_nd(x, upd, idx, kind))


def _g(fn, *types):
    return Graph("g", fn, input_types=[TensorType(dt, shp, DeviceRef.CPU()) for dt, shp in types])


@pytest.mark.parametrize("kind", KINDS)
def test_scatter_reduce_errors_name_the_op(kind):
    f32, i64 = DType.float32, DType.int64
    fn = SCATTER[kind]
    with pytest.raises(ValueError, match="^The input dtype 'DType.float32' and updates dtype 'DType.int64' must match.$"):
        _g(lambda a, u, i: fn(a, u, i), (f32, [3]), (i64, [2]), (i64, [2]))
    # MAX 26.7: no shape checks, bool input accepted (B2.1, B2.3)
    _g(lambda a, u, i: fn(a, u, i), (f32, [3]), (f32, [2]), (i64, [3]))
    _g(lambda a, u, i: fn(a, u, i), (DType.bool, [3]), (DType.bool, [2]), (i64, [2]))
    fnd = SCATTER_ND[kind]
    _g(lambda a, u, i: fnd(a, u, i), (f32, [3, 4]), (f32, [2, 5]), (i64, [2, 1]))
    _g(lambda a, u, i: fnd(a, u, i), (f32, [3, 4]), (f32, [2]), (i64, [2, 3]))
    with pytest.raises(ValueError, match=r"^The input dtype \(DType.float32\) and updates dtype \(DType.int64\) must match$"):
        _g(lambda a, u, i: fnd(a, u, i), (f32, [3, 4]), (i64, [2, 4]), (i64, [2, 1]))
