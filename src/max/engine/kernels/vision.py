"""Kernels for ``max.graph.ops.vision`` (``roi_align``, ``non_maximum_suppression``).

``roi_align`` loops over ROIs (each is a vectorised bilinear gather of its
sample grid); ``non_maximum_suppression`` loops over (batch, class) pairs and
runs the greedy selection on a precomputed IoU matrix.  Both are CPU/GPU
agnostic torch code.
"""

from __future__ import annotations

import math

import torch

from max.engine.kernels import kernel


def _bilinear(img: torch.Tensor, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Sample ``img`` ``[H, W, C]`` at float coordinates ``y`` ``[P]``, ``x`` ``[Q]`` -> ``[P, Q, C]``."""
    h, w = img.shape[0], img.shape[1]

    def axis(c: torch.Tensor, n: int) -> tuple:
        valid = (c >= -1.0) & (c <= n)
        c = c.clamp_min(0.0)
        lo = c.floor().to(torch.int64)
        at_end = lo >= n - 1
        lo = torch.where(at_end, torch.full_like(lo, n - 1), lo)
        hi = torch.where(at_end, lo, lo + 1)
        c = torch.where(at_end, lo.to(c.dtype), c)
        frac = c - lo.to(c.dtype)
        return lo, hi, frac, valid

    y0, y1, fy, vy = axis(y, h)
    x0, x1, fx, vx = axis(x, w)
    top = img[y0][:, x0] * (1 - fx)[None, :, None] + img[y0][:, x1] * fx[None, :, None]
    bot = img[y1][:, x0] * (1 - fx)[None, :, None] + img[y1][:, x1] * fx[None, :, None]
    out = top * (1 - fy)[:, None, None] + bot * fy[:, None, None]
    return out * (vy[:, None] & vx[None, :]).to(out.dtype)[..., None]


@kernel("roi_align")
def roi_align(x: torch.Tensor, rois: torch.Tensor, *, output_height: int, output_width: int,
              spatial_scale: float, sampling_ratio: int, aligned: bool, mode: str) -> torch.Tensor:
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    img_all = x.to(work)
    out = torch.zeros((rois.shape[0], output_height, output_width, x.shape[3]), dtype=work, device=x.device)
    offset = 0.5 if aligned else 0.0
    for m, roi in enumerate(rois.to(torch.float64).tolist()):
        b = int(roi[0])
        if not 0 <= b < x.shape[0]:
            raise ValueError(f"roi_align: rois[{m}] has batch index {b}, outside [0, {x.shape[0]})")
        x1, y1, x2, y2 = (v * spatial_scale - offset for v in roi[1:])
        rw, rh = x2 - x1, y2 - y1
        if not aligned:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / output_height, rw / output_width
        gh = sampling_ratio if sampling_ratio > 0 else max(1, math.ceil(rh / output_height))
        gw = sampling_ratio if sampling_ratio > 0 else max(1, math.ceil(rw / output_width))
        iy = torch.arange(output_height * gh, dtype=work, device=x.device)
        ix = torch.arange(output_width * gw, dtype=work, device=x.device)
        ys = y1 + (torch.div(iy, gh, rounding_mode="floor") * bh + (iy % gh + 0.5) * bh / gh)
        xs = x1 + (torch.div(ix, gw, rounding_mode="floor") * bw + (ix % gw + 0.5) * bw / gw)
        v = _bilinear(img_all[b], ys, xs).reshape(output_height, gh, output_width, gw, -1)
        out[m] = v.amax(dim=(1, 3)) if mode == "MAX" else v.mean(dim=(1, 3))
    return out.to(x.dtype)


def _iou(boxes: torch.Tensor) -> torch.Tensor:
    y1 = torch.minimum(boxes[:, 0], boxes[:, 2])
    y2 = torch.maximum(boxes[:, 0], boxes[:, 2])
    x1 = torch.minimum(boxes[:, 1], boxes[:, 3])
    x2 = torch.maximum(boxes[:, 1], boxes[:, 3])
    area = (y2 - y1) * (x2 - x1)
    ih = (torch.minimum(y2[:, None], y2[None, :]) - torch.maximum(y1[:, None], y1[None, :])).clamp_min(0)
    iw = (torch.minimum(x2[:, None], x2[None, :]) - torch.maximum(x1[:, None], x1[None, :])).clamp_min(0)
    inter = ih * iw
    union = area[:, None] + area[None, :] - inter
    return torch.where(union > 0, inter / union, torch.zeros_like(inter))


@kernel("non_maximum_suppression", foldable=False)
def non_maximum_suppression(boxes: torch.Tensor, scores: torch.Tensor, *, max_output_boxes_per_class: int,
                            iou_threshold: float, score_threshold: float, count: int | None) -> torch.Tensor:
    rows: list[tuple[int, int, int]] = []
    for b in range(boxes.shape[0]):
        iou = _iou(boxes[b].to(torch.float64)).cpu()
        for c in range(scores.shape[1]):
            sc = scores[b, c].to(torch.float64).cpu()
            cand = torch.nonzero(sc > score_threshold).flatten().tolist()
            cand.sort(key=lambda i: (-sc[i].item(), i))
            taken: list[int] = []
            for i in cand:
                if len(taken) >= max_output_boxes_per_class:
                    break
                if all(iou[i, j].item() <= iou_threshold for j in taken):
                    taken.append(i)
            rows.extend((b, c, i) for i in taken)
    out = torch.tensor(rows, dtype=torch.int64, device=boxes.device).reshape(-1, 3)
    if count is not None and out.shape[0] != count:
        raise ValueError(f"non_maximum_suppression selected {out.shape[0]} boxes, but out_dim is {count}")
    return out
