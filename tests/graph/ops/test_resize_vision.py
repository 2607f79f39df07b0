"""resize_linear / resize_nearest / resize_bicubic (torch.nn.functional.interpolate and float64 numpy
references), roi_align and non_maximum_suppression (float64 numpy loop references)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, ops
from support import run1, tt


def _g(fn, *types):
    return Graph("g", fn, input_types=[TensorType(dt, shp, DeviceRef.CPU()) for dt, shp in types])


# ----------------------------------------------------------------------------- resize
def _np_coords(n_in, n_out, mode):
    o = np.arange(n_out, dtype=np.float64)
    if mode == "align_corners":
        return o * (n_in - 1) / (n_out - 1) if n_out > 1 else np.zeros(n_out)
    if mode == "asymmetric":
        return o * n_in / n_out
    if mode == "pytorch_half_pixel" and n_out == 1:
        return np.zeros(1)
    return (o + 0.5) * n_in / n_out - 0.5


def _np_linear_axis(x, axis, n_out, mode):
    n_in = x.shape[axis]
    c = np.clip(_np_coords(n_in, n_out, mode), 0, n_in - 1)
    lo = np.floor(c).astype(int)
    hi = np.minimum(lo + 1, n_in - 1)
    w = c - lo
    a, b = np.take(x, lo, axis=axis), np.take(x, hi, axis=axis)
    shp = [1] * x.ndim
    shp[axis] = n_out
    return a * (1 - w.reshape(shp)) + b * w.reshape(shp)


@given(data=st.data())
def test_resize_linear_matches_numpy(data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6), label="shape")
    out = tuple(data.draw(st.integers(1, 8)) for _ in shape)
    mode = data.draw(st.sampled_from(["half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel"]))
    x = data.draw(hnp.arrays(np.float64, shape, elements=st.floats(-10, 10)), label="x")
    got = run1(lambda a: ops.resize_linear(a, out, coordinate_transformation_mode=mode), [tt(DType.float64, shape)], x)
    ref = x
    for axis, n in enumerate(out):
        if n != shape[axis]:
            ref = _np_linear_axis(ref, axis, n, mode)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("antialias", [False, True])
@pytest.mark.parametrize("size", [(3, 5), (9, 4), (6, 7)])
def test_resize_linear_matches_torch_bilinear(antialias, size):
    x = np.random.default_rng(0).standard_normal((2, 3, 6, 7))
    got = run1(lambda a: ops.resize_linear(a, (2, 3) + size, antialias=antialias), [tt(DType.float64, x.shape)], x)
    ref = F.interpolate(torch.from_numpy(x), size=size, mode="bilinear", align_corners=False, antialias=antialias)
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-12, atol=1e-12)
    ac = run1(lambda a: ops.resize_linear(a, (2, 3) + size, coordinate_transformation_mode="align_corners"),
              [tt(DType.float64, x.shape)], x)
    ref = F.interpolate(torch.from_numpy(x), size=size, mode="bilinear", align_corners=True)
    np.testing.assert_allclose(ac, ref.numpy(), rtol=1e-12, atol=1e-12)


@given(data=st.data())
def test_resize_nearest_matches_numpy(data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6), label="shape")
    out = tuple(data.draw(st.integers(1, 8)) for _ in shape)
    mode = data.draw(st.sampled_from(["half_pixel", "align_corners", "asymmetric"]))
    rmode = data.draw(st.sampled_from(["half_down", "half_up", "floor", "ceil"]))
    x = data.draw(hnp.arrays(np.int32, shape, elements=st.integers(-100, 100)).map(lambda a: a.astype(np.float32)))
    got = run1(lambda a: ops.resize_nearest(a, out, coordinate_transformation_mode=mode, round_mode=rmode),
               [tt(DType.float32, shape)], x)
    rnd = {"half_down": lambda v: np.ceil(v - 0.5), "half_up": lambda v: np.floor(v + 0.5),
           "floor": np.floor, "ceil": np.ceil}[rmode]
    ref = x
    for axis, n in enumerate(out):
        if n != shape[axis]:
            idx = np.clip(rnd(_np_coords(shape[axis], n, mode)), 0, shape[axis] - 1).astype(int)
            ref = np.take(ref, idx, axis=axis)
    np.testing.assert_array_equal(got, ref)


def test_resize_nearest_matches_torch_modes():
    x = np.random.default_rng(1).standard_normal((1, 2, 5, 7)).astype(np.float32)
    t = torch.from_numpy(x)
    got = run1(lambda a: ops.resize_nearest(a, (1, 2, 8, 3), "asymmetric", "floor"), [tt(DType.float32, x.shape)], x)
    np.testing.assert_array_equal(got, F.interpolate(t, size=(8, 3), mode="nearest").numpy())
    got = run1(lambda a: ops.resize_nearest(a, (1, 2, 8, 3), "half_pixel", "half_up"), [tt(DType.float32, x.shape)], x)
    np.testing.assert_array_equal(got, F.interpolate(t, size=(8, 3), mode="nearest-exact").numpy())


def test_resize_bicubic_is_resize_bicubic():
    x = np.random.default_rng(2).standard_normal((1, 2, 5, 6))
    got = run1(lambda a: ops.resize_bicubic(a, (1, 2, 9, 4)), [tt(DType.float64, x.shape)], x)
    ref = F.interpolate(torch.from_numpy(x), size=(9, 4), mode="bicubic", align_corners=False)
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-12, atol=1e-12)


def test_resize_errors():
    f32 = DType.float32
    with pytest.raises(ValueError, match="resize_linear: shape .* must have one entry per dim"):
        _g(lambda a: ops.resize_linear(a, (4,)), (f32, [2, 3]))
    with pytest.raises(ValueError, match="resize_linear: coordinate_transformation_mode='cubic'"):
        _g(lambda a: ops.resize_linear(a, (4, 4), coordinate_transformation_mode="cubic"), (f32, [2, 3]))
    with pytest.raises(ValueError, match="resize_nearest: round_mode='down'"):
        _g(lambda a: ops.resize_nearest(a, (4, 4), round_mode="down"), (f32, [2, 3]))
    with pytest.raises(TypeError, match="resize_nearest: input must be a floating-point tensor"):
        _g(lambda a: ops.resize_nearest(a, (4, 4)), (DType.int32, [2, 3]))
    with pytest.raises(ValueError, match="resize_linear: dim 0 .* is symbolic"):
        _g(lambda a: ops.resize_linear(a, (4, 3)), (f32, ["n", 3]))
    with pytest.raises(ValueError, match="resize_linear: output sizes must be positive"):
        _g(lambda a: ops.resize_linear(a, (0, 3)), (f32, [2, 3]))


# ----------------------------------------------------------------------------- roi_align
def _np_bilinear(img, y, x):
    h, w = img.shape[:2]
    if y < -1.0 or y > h or x < -1.0 or x > w:
        return np.zeros(img.shape[2])
    y, x = max(y, 0.0), max(x, 0.0)
    y0, x0 = int(y), int(x)
    if y0 >= h - 1:
        y0 = y1 = h - 1
        y = float(y0)
    else:
        y1 = y0 + 1
    if x0 >= w - 1:
        x0 = x1 = w - 1
        x = float(x0)
    else:
        x1 = x0 + 1
    ly, lx = y - y0, x - x0
    return ((1 - ly) * (1 - lx) * img[y0, x0] + (1 - ly) * lx * img[y0, x1]
            + ly * (1 - lx) * img[y1, x0] + ly * lx * img[y1, x1])


def _np_roi_align(x, rois, oh, ow, scale, ratio, aligned, mode):
    out = np.zeros((len(rois), oh, ow, x.shape[3]))
    off = 0.5 if aligned else 0.0
    for m, (b, x1, y1, x2, y2) in enumerate(rois):
        x1, y1, x2, y2 = x1 * scale - off, y1 * scale - off, x2 * scale - off, y2 * scale - off
        rw, rh = x2 - x1, y2 - y1
        if not aligned:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / oh, rw / ow
        gh = ratio if ratio > 0 else max(1, math.ceil(rh / oh))
        gw = ratio if ratio > 0 else max(1, math.ceil(rw / ow))
        for i in range(oh):
            for j in range(ow):
                vals = [_np_bilinear(x[int(b)], y1 + i * bh + (iy + 0.5) * bh / gh, x1 + j * bw + (ix + 0.5) * bw / gw)
                        for iy in range(gh) for ix in range(gw)]
                out[m, i, j] = np.max(vals, axis=0) if mode == "MAX" else np.mean(vals, axis=0)
    return out


@given(data=st.data())
def test_roi_align_matches_numpy(data):
    n, h, w, c = 2, data.draw(st.integers(2, 6)), data.draw(st.integers(2, 6)), data.draw(st.integers(1, 3))
    x = data.draw(hnp.arrays(np.float64, (n, h, w, c), elements=st.floats(-5, 5)), label="x")
    m = data.draw(st.integers(1, 3))
    rois = []
    for _ in range(m):
        b = data.draw(st.integers(0, n - 1))
        xa, xb = sorted(data.draw(st.floats(-1.0, w + 1.0)) for _ in range(2))
        ya, yb = sorted(data.draw(st.floats(-1.0, h + 1.0)) for _ in range(2))
        rois.append([b, xa, ya, xb, yb])
    rois = np.array(rois, dtype=np.float64)
    oh, ow = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    ratio = data.draw(st.sampled_from([0, 1, 2]))
    aligned = data.draw(st.booleans())
    mode = data.draw(st.sampled_from(["AVG", "MAX"]))
    scale = data.draw(st.sampled_from([1.0, 0.5]))
    got = run1(lambda a, r: ops.roi_align(a, r, oh, ow, spatial_scale=scale, sampling_ratio=ratio, aligned=aligned,
                                          mode=mode),
               [tt(DType.float64, x.shape), tt(DType.float64, rois.shape)], x, rois)
    np.testing.assert_allclose(got, _np_roi_align(x, rois, oh, ow, scale, ratio, aligned, mode),
                               rtol=1e-10, atol=1e-10)


def test_roi_align_errors():
    f32 = DType.float32
    with pytest.raises(ValueError, match=r"roi_align: input must be rank 4 \(NHWC\)"):
        _g(lambda a, r: ops.roi_align(a, r, 2, 2), (f32, [2, 3, 4]), (f32, [1, 5]))
    with pytest.raises(ValueError, match=r"roi_align: rois must have shape \[M, 5\]"):
        _g(lambda a, r: ops.roi_align(a, r, 2, 2), (f32, [1, 3, 4, 2]), (f32, [1, 4]))
    with pytest.raises(ValueError, match="roi_align: output_height must be >= 1"):
        _g(lambda a, r: ops.roi_align(a, r, 0, 2), (f32, [1, 3, 4, 2]), (f32, [1, 5]))
    with pytest.raises(ValueError, match="roi_align: mode must be 'AVG' or 'MAX'"):
        _g(lambda a, r: ops.roi_align(a, r, 2, 2, mode="SUM"), (f32, [1, 3, 4, 2]), (f32, [1, 5]))
    with pytest.raises(ValueError, match="roi_align: spatial_scale must be positive"):
        _g(lambda a, r: ops.roi_align(a, r, 2, 2, spatial_scale=0), (f32, [1, 3, 4, 2]), (f32, [1, 5]))


# ----------------------------------------------------------------------------- NMS
def _np_iou(a, b):
    ay1, ay2 = sorted((a[0], a[2]))
    ax1, ax2 = sorted((a[1], a[3]))
    by1, by2 = sorted((b[0], b[2]))
    bx1, bx2 = sorted((b[1], b[3]))
    ih = max(0.0, min(ay2, by2) - max(ay1, by1))
    iw = max(0.0, min(ax2, bx2) - max(ax1, bx1))
    inter = ih * iw
    union = (ay2 - ay1) * (ax2 - ax1) + (by2 - by1) * (bx2 - bx1) - inter
    return inter / union if union > 0 else 0.0


def _np_nms(boxes, scores, k, iou_t, score_t):
    rows = []
    for b in range(boxes.shape[0]):
        for c in range(scores.shape[1]):
            order = sorted((i for i in range(boxes.shape[1]) if scores[b, c, i] > score_t),
                           key=lambda i: (-scores[b, c, i], i))
            taken = []
            for i in order:
                if len(taken) == k:
                    break
                if all(_np_iou(boxes[b, i], boxes[b, j]) <= iou_t for j in taken):
                    taken.append(i)
            rows += [(b, c, i) for i in taken]
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


@given(data=st.data())
def test_nms_matches_numpy(data):
    b, c, n = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3)), data.draw(st.integers(1, 8))
    boxes = data.draw(hnp.arrays(np.float32, (b, n, 4), elements=st.integers(0, 10).map(float)), label="boxes")
    scores = data.draw(hnp.arrays(np.float32, (b, c, n), elements=st.floats(0, 1, width=32)), label="scores")
    k = data.draw(st.integers(0, 5))
    iou_t = data.draw(st.sampled_from([0.0, 0.3, 0.5, 1.0]))
    score_t = data.draw(st.sampled_from([-1.0, 0.2, 0.5]))
    got = run1(lambda x, s: ops.non_maximum_suppression(x, s, k, iou_t, score_t),
               [tt(DType.float32, boxes.shape), tt(DType.float32, scores.shape)], boxes, scores)
    np.testing.assert_array_equal(got, _np_nms(boxes.astype(np.float64), scores.astype(np.float64), k, iou_t,
                                               score_t))


def test_nms_type_and_errors():
    f32 = DType.float32
    g = _g(lambda x, s: ops.non_maximum_suppression(x, s, 3, 0.5, 0.0), (f32, [1, 4, 4]), (f32, [1, 2, 4]))
    assert "num_selected" in str(g.output_types[0]) and g.output_types[0].dtype is DType.int64
    with pytest.raises(ValueError, match=r"non_maximum_suppression: boxes must have shape \[batch, num_boxes, 4\]"):
        _g(lambda x, s: ops.non_maximum_suppression(x, s, 3), (f32, [1, 4, 3]), (f32, [1, 2, 4]))
    with pytest.raises(ValueError, match="non_maximum_suppression: scores .* must be"):
        _g(lambda x, s: ops.non_maximum_suppression(x, s, 3), (f32, [1, 4, 4]), (f32, [1, 2, 5]))
    with pytest.raises(ValueError, match=r"non_maximum_suppression: iou_threshold must be in \[0, 1\]"):
        _g(lambda x, s: ops.non_maximum_suppression(x, s, 3, 1.5), (f32, [1, 4, 4]), (f32, [1, 2, 4]))
    with pytest.raises(ValueError, match="non_maximum_suppression: max_output_boxes_per_class must be >= 0"):
        _g(lambda x, s: ops.non_maximum_suppression(x, s, -1), (f32, [1, 4, 4]), (f32, [1, 2, 4]))
