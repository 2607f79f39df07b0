"""Qwen3-VL preprocessing: images as Qwen2-VL's (``image_grid_thw``), and video.

A video (a ``video_url`` / ``video`` chat part: a file decoded with PyAV, or a list of frame images) is
sampled at ``fps`` frames per second (2; at least ``min_frames``, at most ``max_frames`` and the video's
own frames, evenly spaced), resized to one size for all frames (``video_smart_resize``: sides multiples of
``patch * merge``, the whole clip within ``size.shortest_edge`` .. ``size.longest_edge`` pixels), rescaled and
normalised, padded to a multiple of ``temporal_patch_size`` frames by repeating the last, and cut into
patches of ``temporal_patch_size`` frames (grid ``(t, h, w)``), in the same layout as images.  In the prompt,
the template's video placeholder becomes, per temporal patch ``k``, ``<{time_k:.1f} seconds>`` (the mean time
of its first and last frame), the vision-start token, one video token per merged patch, the vision-end token
-- the text transformers' Qwen3-VL processor writes (a list of frame images is taken whole, at the part's
``fps`` or 2 frames a second; a file whose frame rate is unknown is timed at 24, as transformers does).  The settings come from the folder's
``video_preprocessor_config.json`` (transformers' names), else the defaults of transformers' Qwen3-VL video
processor with the image processor's patch sizes.

Each temporal patch is its own run of video tokens, kept on the context like an image (``images`` spans,
``pixel_values`` and a ``(1, h, w)`` row of ``image_grid_thw`` each; ``run_is_video`` marks them and
``video_grid_thw`` holds each video's grid): the vision tower attends within a frame and M-RoPE numbers each
run on its own, so the model treats them as images (``model``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from max.interfaces.errors import InvalidRequest, PromptTooLong
from max.pipelines.architectures.qwen2_5vl.processor import Qwen2VLTokenizer, expand_placeholders
from max.pipelines.core import ImageMetadata, TextAndVisionContext
from max.pipelines.lib.tokenizer import _runs, _split_images, video_parts
from max.pipelines.lib.video import Video, VideoInputError, decode_video, video_from_images

__all__ = ["Qwen3VLTokenizer", "VideoSettings", "frame_timestamps", "preprocess_video", "sample_indices",
           "video_smart_resize"]


@dataclass(frozen=True)
class VideoSettings:
    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 128 * 32 * 32
    max_pixels: int = 768 * 32 * 32
    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768
    cap_pixels_per_frame: bool = False
    """Each frame's pixels capped at ``max_video_tokens`` patches' worth or the budget's share per frame."""
    max_video_tokens: int = 768
    rescale_factor: float = 1 / 255
    image_mean: tuple[float, ...] = field(default=(0.5, 0.5, 0.5))
    image_std: tuple[float, ...] = field(default=(0.5, 0.5, 0.5))

    @classmethod
    def load(cls, folder: str, image_processor: Any) -> "VideoSettings":
        kw: dict[str, Any] = {k: getattr(image_processor, k) for k in ("patch_size", "temporal_patch_size",
                                                                     "merge_size") if getattr(image_processor, k, None)}
        path = Path(folder, "video_preprocessor_config.json")
        if path.is_file():
            d = json.loads(path.read_text())
            size = d.get("size") or {}
            if d.get("cap_pixels_per_frame") is not None:
                kw["cap_pixels_per_frame"] = bool(d["cap_pixels_per_frame"])
            for k in ("patch_size", "temporal_patch_size", "merge_size", "min_frames", "max_frames", "max_video_tokens"):
                if d.get(k) is not None:
                    kw[k] = int(d[k])
            for k in ("fps", "rescale_factor"):
                if d.get(k) is not None:
                    kw[k] = float(d[k])
            for k in ("image_mean", "image_std"):
                if d.get(k) is not None:
                    kw[k] = tuple(float(v) for v in d[k])
            if size.get("shortest_edge"):
                kw["min_pixels"] = int(size["shortest_edge"])
            if size.get("longest_edge"):
                kw["max_pixels"] = int(size["longest_edge"])
        return cls(**kw)


def sample_indices(total: int, fps: Optional[float], s: VideoSettings) -> np.ndarray:
    """Indices of the frames taken from a ``total``-frame video of ``fps`` frames per second."""
    if fps:
        n = min(max(int(total / fps * s.fps), s.min_frames), s.max_frames, total)
    else:
        n = min(max(total, s.min_frames), s.max_frames)
    return np.linspace(0, total - 1, n).round().astype(np.int64)


def frame_timestamps(indices: Sequence[int], fps: float, temporal_patch: int) -> list[float]:
    """Seconds of each temporal patch: the mean time of its first and last frame (the last frame repeated
    to fill the final patch)."""
    idx = [int(i) for i in indices]
    idx += [idx[-1]] * (-len(idx) % temporal_patch)
    t = [i / fps for i in idx]
    return [(t[k] + t[k + temporal_patch - 1]) / 2 for k in range(0, len(t), temporal_patch)]


def video_smart_resize(n_frames: int, height: int, width: int, s: VideoSettings) -> tuple[int, int]:
    """The frames' size: sides multiples of ``patch * merge`` near the original aspect, the clip's pixels
    (``frames * height * width``, frames rounded to the temporal patch) within ``[min_pixels, max_pixels]``."""
    f, tp = s.patch_size * s.merge_size, s.temporal_patch_size
    if n_frames < tp:
        raise ValueError(f"a video needs at least {tp} frames, got {n_frames}")
    max_pixels = s.max_pixels
    if s.cap_pixels_per_frame:
        per_frame = max(min(s.max_video_tokens * f * f, s.max_pixels // n_frames), int(s.min_pixels * 1.05))
        max_pixels = per_frame * n_frames
    if height < f or width < f:
        scale = max(f / height, f / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"the frames' aspect ratio {max(height, width) / min(height, width):.0f} is over 200")
    h, w, t = round(height / f) * f, round(width / f) * f, round(n_frames / tp) * tp
    if t * h * w > max_pixels:
        beta = math.sqrt(n_frames * height * width / max_pixels)
        h, w = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
    elif t * h * w < s.min_pixels:
        beta = math.sqrt(s.min_pixels / (n_frames * height * width))
        h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
    return h, w


def preprocess_video(frames: Sequence[np.ndarray], s: VideoSettings) -> tuple[np.ndarray, tuple[int, int, int]]:
    """``(patches [t * h * w, channels * temporal_patch * patch**2], (t, h, w))`` of RGB ``uint8`` frames."""
    from PIL import Image

    height, width = frames[0].shape[:2]
    rh, rw = video_smart_resize(len(frames), height, width, s)
    mean, std = np.asarray(s.image_mean, np.float32), np.asarray(s.image_std, np.float32)
    clip = np.stack([np.asarray(Image.fromarray(f).resize((rw, rh), Image.Resampling.BICUBIC), np.float32)
                     for f in frames])
    clip = ((clip * np.float32(s.rescale_factor) - mean) / std).transpose(0, 3, 1, 2)  # [frames, C, H, W]
    tp, P, m = s.temporal_patch_size, s.patch_size, s.merge_size
    if pad := -len(clip) % tp:
        clip = np.concatenate([clip, np.repeat(clip[-1:], pad, axis=0)])
    gt, gh, gw, C = len(clip) // tp, rh // P, rw // P, clip.shape[1]
    x = clip.reshape(gt, tp, C, gh // m, m, P, gw // m, m, P).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(x.reshape(gt * gh * gw, C * tp * P * P), np.float32), (gt, gh, gw)


class Qwen3VLTokenizer(Qwen2VLTokenizer):
    """:class:`Qwen2VLTokenizer` that also takes video (see the module docstring)."""

    takes_video = True

    def __init__(self, model_path: str, **kwargs: Any) -> None:
        super().__init__(model_path, **kwargs)
        folder = os.path.expanduser(self.model_path)
        if os.path.isfile(folder):
            folder = os.path.dirname(os.path.abspath(folder))
        self.video_settings = VideoSettings.load(folder, self.processor.image_processor)
        tok = self.delegate

        def token(attr: str, default: str) -> str:
            return getattr(tok, attr, None) or getattr(self.processor, attr, None) or default

        self.video_token = token("video_token", "<|video_pad|>")
        self.vision_start, self.vision_end = token("vision_start_token", "<|vision_start|>"), \
            token("vision_end_token", "<|vision_end|>")
        self.image_token = token("image_token", "<|image_pad|>")
        self.video_token_id = int(tok.convert_tokens_to_ids(self.video_token))

    def load_video(self, part: dict[str, Any], what: str) -> Video:
        s = self.video_settings
        ref = part["video"]
        try:
            if isinstance(ref, (list, tuple)):
                fps = float(part.get("fps") or s.fps)
                return video_from_images(ref, lambda n, r: sample_indices(n, r, s), what, self.allow_image_urls,
                                         fps=fps, max_frames=s.max_frames)
            return decode_video(ref, lambda n, r: sample_indices(n, r, s), what, self.allow_image_urls)
        except VideoInputError as e:
            raise InvalidRequest(str(e), param="video_url") from None

    def new_context_sync(self, request: Any) -> TextAndVisionContext:
        msgs = _split_images(request.messages)[0] if request.messages else []
        parts = video_parts(msgs)
        if not parts:
            return super().new_context_sync(request)
        from max.pipelines.lib.images import decode_image

        where = f"request {request.request_id}"
        s = self.video_settings
        images = [decode_image(r, f"image {i}", self.allow_image_urls)
                  for i, r in enumerate(_split_images(request.messages)[1] + list(request.images or []))]
        videos, video_text = [], []
        for i, part in enumerate(parts):
            v = self.load_video(part, f"video {i}")
            try:
                patches, grid = preprocess_video(v.frames, s)
            except ValueError as e:
                raise InvalidRequest(f"video {i}: {e}", param="video_url", where=where) from None
            times = frame_timestamps(v.indices, v.fps or 24.0, s.temporal_patch_size)
            per_frame = grid[1] * grid[2] // s.merge_size ** 2
            video_text.append("".join(f"<{t:.1f} seconds>" + self.vision_start + self.video_token * per_frame +
                                      self.vision_end for t in times))
            videos.append((patches, grid))
        text = self.apply_chat_template(request.messages, request.tools, request.chat_template_options)
        try:
            text = expand_placeholders(text, self.video_token, video_text, "video")
            image_pixels, image_grids = np.zeros((0, 1), np.float32), np.zeros((0, 3), np.int64)
            if images:
                out = self.processor.image_processor(images=images, return_tensors="np")
                image_pixels = np.asarray(out["pixel_values"], np.float32)
                image_grids = np.asarray(out["image_grid_thw"], np.int64).reshape(-1, 3)
                merge = int(getattr(self.processor.image_processor, "merge_size", 1) or 1)
                text = expand_placeholders(text, self.image_token, [self.image_token * (int(np.prod(g)) // merge ** 2)
                                                                    for g in image_grids], "image")
        except ValueError as e:
            raise InvalidRequest(f"the prompt and its images and videos do not match: {e}", param="messages",
                                 where=where) from None
        ids = np.asarray(self.delegate(text, add_special_tokens=False)["input_ids"], np.int64)
        if self.max_length is not None and len(ids) >= self.max_length:
            raise PromptTooLong(f"the prompt with its images and videos is {len(ids)} tokens, which leaves no room to "
                                f"generate within the maximum length {self.max_length}; send shorter or smaller videos "
                                "or fewer images", length=len(ids), limit=self.max_length, where=where)
        # one run per image and per temporal patch of each video, in prompt order
        image_runs = [(a, b, False) for a, b in _runs(ids, self.image_token_id)]
        video_runs = [(a, b, True) for a, b in _runs(ids, self.video_token_id)]
        image_chunks = np.split(image_pixels, np.cumsum(image_grids.prod(axis=1))[:-1]) if len(image_grids) else []
        frame_chunks, frame_grids = [], []
        for patches, (t, h, w) in videos:
            frame_chunks += np.split(patches, t)
            frame_grids += [(1, h, w)] * t
        if len(image_runs) != len(image_chunks) or len(video_runs) != len(frame_chunks):
            raise InvalidRequest(f"{len(image_chunks)} images and {len(frame_chunks)} video frames but "
                                 f"{len(image_runs)} image and {len(video_runs)} video placeholder runs in the prompt",
                                 param="messages", where=where)
        runs = sorted(image_runs + video_runs)
        it_img, it_vid = iter(zip(image_chunks, image_grids.tolist())), iter(zip(frame_chunks, frame_grids))
        pixels, grids = [], []
        for _, _, is_video in runs:
            p, g = next(it_vid if is_video else it_img)
            pixels.append(np.ascontiguousarray(p, np.float32))
            grids.append(g)
        metas = [ImageMetadata(start_idx=a, end_idx=b, pixel_values=p,
                               image_hash=hashlib.sha256(p.tobytes()).hexdigest()) for (a, b, _), p in zip(runs, pixels)]
        extra = {"image_grid_thw": np.asarray(grids, np.int64).reshape(-1, 3),
                 "run_is_video": np.asarray([v for _, _, v in runs], bool),
                 "video_grid_thw": np.asarray([g for _, g in videos], np.int64).reshape(-1, 3)}
        salt = "images:" + hashlib.sha256("".join(m.image_hash or "" for m in metas).encode()).hexdigest()
        return self._new_context(request, TextAndVisionContext, ids=ids, pixel_values=tuple(pixels), images=metas,
                                 vision_token_ids=[self.image_token_id, self.video_token_id], cache_salt=salt,
                                 extra_model_args=extra)
