"""Video inputs of vision-language requests: a video file (bytes, ``data:video/...;base64,`` URI, local path,
``file://`` URL; ``http(s)`` only where image URLs are allowed) decoded with PyAV, or a list of images taken as
its frames -> the frames a model's sampler picks, as RGB ``uint8`` arrays, with the video's frame rate.

Every failure is a :class:`VideoInputError` (a ``ValueError``: the server answers 400) naming the video and
what was wrong: not a video, corrupt data, no frames, more frames than allowed.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

from max.interfaces.errors import InvalidRequest
from max.pipelines.lib.images import ImageInputError, decode_image, image_bytes_of

__all__ = ["MAX_DECODED_FRAMES", "Video", "VideoInputError", "decode_video", "video_from_images"]

MAX_DECODED_FRAMES = 108_000
"""The most frames a video file may have (an hour at 30 frames per second)."""

Sampler = Callable[[int, Optional[float]], np.ndarray]
"""``sampler(total_frames, fps)`` -> the indices of the frames the model takes."""


class VideoInputError(InvalidRequest):
    """A video reference or video file that cannot be used (a client's error: :class:`InvalidRequest`, a
    ``ValueError``)."""


@dataclass
class Video:
    frames: list[np.ndarray]
    """The sampled frames, RGB ``uint8`` ``[height, width, 3]``, all the same size."""
    indices: np.ndarray
    """Their indices among the video's frames."""
    fps: Optional[float]
    """Frames per second of the video (None: unknown, e.g. a list of images without one)."""
    total_frames: int


def decode_video(ref: Any, sampler: Sampler, what: str = "video", allow_urls: bool = False) -> Video:
    """The frames ``sampler`` picks from a video file (see the module docstring)."""
    try:
        import av
    except ImportError:  # pragma: no cover - PyAV is a dependency of the vision extra
        raise VideoInputError(f"{what}: video inputs need PyAV: pip install 'libremax[vision]'") from None
    try:
        data = image_bytes_of(ref, what, allow_urls, media="video")
    except ImageInputError as e:
        raise VideoInputError(str(e)) from None
    if not data:
        raise VideoInputError(f"{what}: the video is empty (0 bytes)")
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.video:
                raise VideoInputError(f"{what}: the file has no video stream")
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate
            fps = float(rate) if rate else None
            total = 0
            for _ in container.decode(stream):  # count: containers' frame counts are not always right
                total += 1
                if total > MAX_DECODED_FRAMES:
                    raise VideoInputError(f"{what}: the video has more than {MAX_DECODED_FRAMES} frames")
        if total == 0:
            raise VideoInputError(f"{what}: the video has no frames")
        indices = np.asarray(sampler(total, fps), np.int64)
        want = set(indices.tolist())
        got: dict[int, np.ndarray] = {}
        with av.open(io.BytesIO(data), mode="r") as container:
            for i, frame in enumerate(container.decode(container.streams.video[0])):
                if i in want:
                    got[i] = frame.to_ndarray(format="rgb24")
                if len(got) == len(want):
                    break
    except VideoInputError:
        raise
    except (av.FFmpegError, OSError, ValueError, EOFError) as e:
        raise VideoInputError(f"{what}: not a readable video, or the video data is corrupt ({e})") from None
    if len(got) != len(want):
        raise VideoInputError(f"{what}: the video's frames could not all be decoded")
    return Video(frames=[got[int(i)] for i in indices], indices=indices, fps=fps, total_frames=total)


def video_from_images(refs: Sequence[Any], sampler: Sampler, what: str = "video", allow_urls: bool = False,
                      fps: Optional[float] = None, max_frames: Optional[int] = None) -> Video:
    """A video made of images (its frames in order, all the same size), ``fps`` frames per second."""
    if not len(refs):
        raise VideoInputError(f"{what}: the list of frames is empty")
    if max_frames is not None and len(refs) > max_frames:
        raise VideoInputError(f"{what}: {len(refs)} frames, more than the {max_frames} a video may have")
    try:
        images = [np.asarray(decode_image(r, f"{what} frame {i}", allow_urls)) for i, r in enumerate(refs)]
    except ImageInputError as e:
        raise VideoInputError(str(e)) from None
    if len({im.shape for im in images}) != 1:
        raise VideoInputError(f"{what}: the frames differ in size ({sorted({im.shape[:2] for im in images})})")
    indices = np.asarray(sampler(len(images), fps), np.int64)
    return Video(frames=[images[int(i)] for i in indices], indices=indices, fps=fps, total_frames=len(images))
