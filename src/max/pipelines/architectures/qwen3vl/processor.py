"""Qwen3-VL preprocessing: images as Qwen2-VL's (``image_grid_thw``)."""

from __future__ import annotations

from max.pipelines.architectures.qwen2_5vl.processor import Qwen2VLTokenizer


class Qwen3VLTokenizer(Qwen2VLTokenizer):
    """:class:`Qwen2VLTokenizer` for Qwen3-VL."""
