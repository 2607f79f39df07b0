"""numpy-style indexing of Buffers, checked against numpy with hypothesis.

Negative steps are views: reads, writes and chained indexing through them must
match numpy exactly, including write-through to the parent's memory.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers_driver import ALL_DTYPES, bits, sample_array
from max.driver import Buffer
from max.dtype import DType

shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple)


@st.composite
def index_for(draw, shape):
    """A basic numpy index valid for ``shape``: ints, slices, one Ellipsis, None."""
    items = []
    axis = 0
    used_ellipsis = False
    rank = len(shape)
    while True:
        # After an Ellipsis the remaining items index the trailing axes, so the
        # key must then go on until every axis is indexed.
        must_continue = used_ellipsis and axis < rank
        choices = [] if must_continue else ["stop"]
        if axis < rank:
            choices += ["slice", "slice"]
            if shape[axis] > 0:
                choices += ["int"]
            if not used_ellipsis:
                choices += ["ellipsis"]
        if len(items) < 6:
            choices += ["none"]
        kind = draw(st.sampled_from(choices))
        if kind == "stop":
            break
        if kind == "int":
            n = shape[axis]
            items.append(draw(st.integers(-n, n - 1)))
            axis += 1
        elif kind == "slice":
            n = shape[axis]
            bound = st.one_of(st.none(), st.integers(-n - 2, n + 2))
            step = draw(st.one_of(st.none(), st.sampled_from([-3, -2, -1, 1, 2, 3])))
            items.append(slice(draw(bound), draw(bound), step))
            axis += 1
        elif kind == "none":
            items.append(None)
        else:
            used_ellipsis = True
            items.append(Ellipsis)
            # the Ellipsis absorbs a random number of the remaining axes
            axis += draw(st.integers(0, rank - axis))
    if len(items) == 1 and draw(st.booleans()):
        return items[0]
    return tuple(items)


@st.composite
def case(draw):
    dtype = draw(st.sampled_from(ALL_DTYPES))
    shape = draw(shapes)
    key = draw(index_for(shape))
    return dtype, shape, key


def np_index(arr, key):
    """``arr[key]`` as a numpy view (never a numpy scalar)."""
    k = key if isinstance(key, tuple) else (key,)
    if not any(x is Ellipsis for x in k):
        k = k + (Ellipsis,)
    return arr[k]


def assert_same(buf: Buffer, arr: np.ndarray):
    got = buf.to_numpy()
    assert buf.shape == arr.shape
    assert got.dtype == arr.dtype
    np.testing.assert_array_equal(bits(got), bits(arr))


@settings(max_examples=300, deadline=None)
@given(case())
def test_getitem_matches_numpy(c):
    dtype, shape, key = c
    a = sample_array(dtype, shape)
    b = Buffer.from_numpy(a)
    v = b[key]
    assert_same(v, np_index(a, key))
    # a view, never a copy: it shares the parent's memory
    if np_index(a, key).size:
        got = v.to_numpy()
        assert np.shares_memory(got, a)
    steps = [k.step for k in (key if isinstance(key, tuple) else (key,)) if isinstance(k, slice)]
    if any(s is not None and s < 0 for s in steps) and v.is_contiguous:
        # a reversed axis of size > 1 must make the view non-contiguous
        rev = np_index(a, key)
        assert not any(st_ < 0 for st_, n in zip(rev.strides, rev.shape) if n > 1)
    ref = np_index(a, key)
    if any(st_ < 0 for st_, n in zip(ref.strides, ref.shape) if n > 1):
        assert not v.is_contiguous


@settings(max_examples=200, deadline=None)
@given(case(), st.data())
def test_chained_getitem_matches_numpy(c, data):
    dtype, shape, key = c
    a = sample_array(dtype, shape)
    first = np_index(a, key)
    key2 = data.draw(index_for(first.shape))
    assert_same(Buffer.from_numpy(a)[key][key2], np_index(first, key2))


def _one_element(key, shape) -> bool:
    """MAX's __setitem__ rule: an integer for every dim (or ``()``/``...`` for rank 0)."""
    items = key if isinstance(key, tuple) else (key,)
    if not shape:
        return items in ((), (Ellipsis,))
    return len(items) == len(shape) and all(isinstance(k, (int, np.integer)) for k in items)


@settings(max_examples=200, deadline=None)
@given(case(), st.data())
def test_setitem_matches_numpy(c, data):
    dtype, shape, key = c
    a = sample_array(dtype, shape)
    ref = a.copy()
    b = Buffer.from_numpy(a)  # shares memory with `a`
    value = sample_array(dtype, (1,))[0].item()
    if not _one_element(key, shape):  # setting across several indices: refused, nothing written
        with pytest.raises(ValueError, match="setting items across several indices is not supported"):
            b[key] = value
        np.testing.assert_array_equal(bits(a), bits(ref))
        return
    if data.draw(st.booleans()):
        b[key] = value
        ref[key] = value
    else:
        v = sample_array(dtype, ())
        how = data.draw(st.sampled_from(["numpy", "buffer"]))
        b[key] = v if how == "numpy" else Buffer.from_numpy(np.ascontiguousarray(v))
        ref[key] = v
    np.testing.assert_array_equal(bits(a), bits(ref))


@settings(max_examples=150, deadline=None)
@given(case(), st.data())
def test_write_through_negative_step_view(c, data):
    dtype, shape, key = c
    a = sample_array(dtype, shape)
    ref = a.copy()
    view = Buffer.from_numpy(a)[key]
    rview = np_index(ref, key)
    key2 = data.draw(index_for(rview.shape))
    value = sample_array(dtype, ())
    if not _one_element(key2, rview.shape):
        with pytest.raises(ValueError, match="setting items across several indices"):
            view[key2] = value
        return
    view[key2] = value
    rview[key2] = value
    np.testing.assert_array_equal(bits(a), bits(ref))


def test_negative_steps_examples():
    a = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    b = Buffer.from_numpy(a)
    r = b[::-1, :, ::-2]
    assert not r.is_contiguous
    assert r.shape == (2, 3, 2)
    np.testing.assert_array_equal(r.to_numpy(), a[::-1, :, ::-2])
    r[0, 0, 0] = -7  # writes through to a[1, 0, 3]
    assert a[1, 0, 3] == -7
    with pytest.raises(ValueError, match="setting items across several indices"):
        r[1] = np.array([[1, 2], [3, 4], [5, 6]])
    for i, j in np.ndindex(3, 2):  # element by element through the reversed view
        r[1, i, j] = [[1, 2], [3, 4], [5, 6]][i][j]
    np.testing.assert_array_equal(a[0, :, ::-2], [[1, 2], [3, 4], [5, 6]])
    # to_numpy of a negative-step view is itself a numpy view with negative strides
    n = r.to_numpy()
    assert np.shares_memory(n, a) and n.strides[0] < 0
    # reversing twice gives back a contiguous view
    assert b[::-1][::-1].is_contiguous
    assert b[:, :, 1:3].is_contiguous is False
    assert b[1].is_contiguous and b[None, 1, ...].is_contiguous


def test_index_errors():
    b = Buffer.zeros([2, 3], DType.float32)
    with pytest.raises(IndexError, match="index 3 is out of bounds for axis 1 with size 3"):
        b[0, 3]
    with pytest.raises(IndexError, match="index -3 is out of bounds for axis 0 with size 2"):
        b[-3]
    with pytest.raises(ValueError, match=r"^the provided number of indices \(3\) is not equal to the tensor rank \(2\)"):
        b[0, 0, 0]
    with pytest.raises(IndexError, match="single ellipsis"):
        b[..., 0, ...]
    with pytest.raises(TypeError, match="got list"):
        b[[0, 1]]
    with pytest.raises(TypeError, match="got float"):
        b[1.0]
    with pytest.raises(TypeError, match="got bool"):
        b[True]
    with pytest.raises(TypeError, match="slice indices must be integers"):
        b[0:1.5]
    with pytest.raises(ValueError, match="zero"):
        b[::0]
    with pytest.raises(IndexError, match="out of bounds"):
        b[0, 5] = 1.0


def test_setitem_errors():
    b = Buffer.zeros([2, 3], DType.float32)
    with pytest.raises(ValueError, match=r"index Ellipsis selects more than one element of a buffer of shape \(2, 3\)"):
        b[...] = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match=r"cannot assign a value of shape \(4,\)"):
        b[0, 0] = np.zeros(4, np.float32)
    with pytest.raises(TypeError, match="str"):
        b[0, 0] = "x"
    with pytest.raises(ValueError, match="uint8"):
        Buffer.zeros([2], DType.uint8)[0] = 300
    ro = np.zeros(3, np.float32)
    ro.flags.writeable = False
    rb = Buffer.from_numpy(ro)  # a read-only source is copied (MAX 26.7, max-behaviours.md B17.2)
    rb[0] = 1.0
    rb[1:].inplace_copy_from(Buffer.from_numpy(np.array([2, 3], np.float32)))
    np.testing.assert_array_equal(rb.to_numpy(), [1, 2, 3])
    np.testing.assert_array_equal(ro, [0, 0, 0])


def test_block_copy_overlapping_self():
    # blocks are copied with inplace_copy_from (slice assignment is refused, as in MAX)
    a = np.arange(6, dtype=np.float64)
    b = Buffer.from_numpy(a)
    b[1:].inplace_copy_from(b[:-1])
    ref = np.arange(6, dtype=np.float64)
    ref[1:] = ref[:-1].copy()
    np.testing.assert_array_equal(a, ref)
    b.inplace_copy_from(b[::-1].contiguous())
    np.testing.assert_array_equal(a, ref[::-1])
