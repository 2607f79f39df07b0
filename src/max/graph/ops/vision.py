"""Detection ops: ``roi_align`` and ``non_maximum_suppression``.

``roi_align(input, rois, output_height, output_width, spatial_scale=1.0,
sampling_ratio=0.0, aligned=False, mode="AVG")``: ``input`` is NHWC
``[N, H, W, C]``; ``rois`` is ``[M, 5]`` rows ``(batch_index, x1, y1, x2,
y2)`` in input coordinates before ``spatial_scale``.  Each ROI is split into
``output_height x output_width`` bins; every bin averages (``"AVG"``) or takes
the maximum (``"MAX"``) of ``sampling_ratio x sampling_ratio`` bilinearly
interpolated points (``sampling_ratio <= 0``: ``ceil(roi_size / bins)``
points per axis, per ROI).  ``aligned`` shifts the box by half a pixel
(``-0.5``); without it a box is at least 1x1.  Points more than one pixel
outside the image count as 0.  Result: ``[M, output_height, output_width, C]``.

``non_maximum_suppression(boxes, scores, max_output_boxes_per_class,
iou_threshold, score_threshold, out_dim="num_selected")`` (ONNX
NonMaxSuppression with corner boxes): ``boxes`` ``[B, N, 4]`` as ``(y1, x1,
y2, x2)`` (either corner order), ``scores`` ``[B, C, N]``.  Per batch and
class, boxes with a score above ``score_threshold`` are taken by decreasing
score (ties: lower index first), dropping any whose IoU with an already
taken box exceeds ``iou_threshold``, at most ``max_output_boxes_per_class``.
Result: int64 ``[out_dim, 3]`` rows ``(batch, class, box)`` ordered by batch,
class, then selection order; ``out_dim`` names the data-dependent count.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from max.dtype import DType
from max.graph.dim import Dim, StaticDim
from max.graph.ops._common import as_tensor, fail, host_only, same_device, stage1
from max.graph.shape import Shape
from max.graph.type import TensorType
from max.graph.value import TensorValue

__all__ = ["non_maximum_suppression", "roi_align"]


def _number(op: str, name: str, v: Any) -> float:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        fail(op, f"{name} must be a number, got {type(v).__name__} {v!r}", TypeError)
    f = float(v)
    if not math.isfinite(f):
        fail(op, f"{name} must be finite, got {v!r}")
    return f


def _count(op: str, name: str, v: Any, minimum: int) -> int:
    if isinstance(v, StaticDim):
        v = v.dim
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        fail(op, f"{name} must be an int, got {type(v).__name__} {v!r}", TypeError)
    if int(v) < minimum:
        fail(op, f"{name} must be >= {minimum}, got {v}")
    return int(v)


def roi_align(input: Any, rois: Any, output_height: int, output_width: int,  # noqa: A002
              spatial_scale: float = 1.0, sampling_ratio: float = 0.0, aligned: bool = False,
              mode: str = "AVG") -> TensorValue:
    """Region-of-interest align over an NHWC input (see the module docstring)."""
    op = "roi_align"
    x = as_tensor(input, op=op, arg="input")
    r = as_tensor(rois, op=op, arg="rois", dtype=x.dtype, device=x.device)
    if x.rank != 4:
        fail(op, f"input must be rank 4 (NHWC), got {x.type}")
    if not x.dtype.is_float() or x.dtype.is_float8():
        fail(op, f"input must be a floating-point tensor, got {x.dtype}", TypeError)
    if r.rank != 2 or r.shape[1] != 5:
        fail(op, f"rois must have shape [M, 5] (batch_index, x1, y1, x2, y2), got {r.shape}")
    if r.dtype is not x.dtype:
        fail(op, f"rois dtype {r.dtype} differs from input dtype {x.dtype}", ValueError)
    same_device(op, x, r)
    oh = _count(op, "output_height", output_height, 1)
    ow = _count(op, "output_width", output_width, 1)
    scale = _number(op, "spatial_scale", spatial_scale)
    if scale <= 0:
        fail(op, f"spatial_scale must be positive, got {spatial_scale!r}")
    ratio = _number(op, "sampling_ratio", sampling_ratio)
    if ratio != int(ratio):
        fail(op, f"sampling_ratio must be a whole number (<= 0 for adaptive), got {sampling_ratio!r}")
    if not isinstance(aligned, (bool, np.bool_)):
        fail(op, f"aligned must be a bool, got {type(aligned).__name__}", TypeError)
    m = str(mode).upper()
    if m not in ("AVG", "MAX"):
        fail(op, f"mode must be 'AVG' or 'MAX', got {mode!r}")
    out = TensorType(x.dtype, Shape([r.shape[0], oh, ow, x.shape[3]]), x.device)
    attrs = {"output_height": oh, "output_width": ow, "spatial_scale": scale,
             "sampling_ratio": int(ratio), "aligned": bool(aligned), "mode": m}
    return stage1(op, [x, r], out, attrs)


def non_maximum_suppression(boxes: Any, scores: Any, max_output_boxes_per_class: int,
                            iou_threshold: float = 0.0, score_threshold: float = float("-inf"),
                            out_dim: Any = "num_selected") -> TensorValue:
    """Greedy per-class non-maximum suppression (ONNX semantics; see the module docstring)."""
    op = "non_maximum_suppression"
    b = as_tensor(boxes, op=op, arg="boxes")
    s = as_tensor(scores, op=op, arg="scores", device=b.device)
    if b.rank != 3 or b.shape[2] != 4:
        fail(op, f"boxes must have shape [batch, num_boxes, 4], got {b.shape}")
    if s.rank != 3:
        fail(op, f"scores must have shape [batch, num_classes, num_boxes], got {s.shape}")
    if s.shape[0] != b.shape[0] or s.shape[2] != b.shape[1]:
        fail(op, f"scores {s.shape} must be [batch, num_classes, num_boxes] for boxes {b.shape}")
    for name, v in (("boxes", b), ("scores", s)):
        if not v.dtype.is_float() or v.dtype.is_float8():
            fail(op, f"{name} must be a floating-point tensor, got {v.dtype}", TypeError)
    same_device(op, b, s)
    host_only(op, b, s)
    k = _count(op, "max_output_boxes_per_class", max_output_boxes_per_class, 0)
    iou = _number(op, "iou_threshold", iou_threshold)
    if not 0.0 <= iou <= 1.0:
        fail(op, f"iou_threshold must be in [0, 1], got {iou_threshold!r}")
    score = float(score_threshold)
    if math.isnan(score):
        fail(op, "score_threshold must not be NaN")
    try:
        d = Dim(out_dim)
    except (TypeError, ValueError) as e:
        fail(op, f"out_dim {out_dim!r} is not a valid dim: {e}", TypeError)
    attrs = {"max_output_boxes_per_class": k, "iou_threshold": iou, "score_threshold": score,
             "count": d.dim if isinstance(d, StaticDim) else None}
    return stage1(op, [b, s], TensorType(DType.int64, Shape([d, 3]), b.device), attrs)
