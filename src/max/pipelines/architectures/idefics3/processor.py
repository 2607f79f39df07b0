"""Idefics3 image preprocessing: the processor returns ``[batch, tiles, C, H, W]`` (each image split into
tiles plus a global view, every tile with its own placeholder span, all-zero tiles as padding)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from max.interfaces.errors import InvalidRequest
from max.pipelines.lib.tokenizer import TextAndVisionTokenizer

__all__ = ["Idefics3Tokenizer"]


class Idefics3Tokenizer(TextAndVisionTokenizer):
    """:class:`TextAndVisionTokenizer` whose pixel arrays are the real tiles of the request."""

    def split_images(self, out: dict[str, Any], request_id: str) -> tuple[Sequence[np.ndarray], dict[str, Any]]:
        pixels = np.asarray(out["pixel_values"], dtype=np.float32)
        if pixels.ndim != 5:
            raise InvalidRequest("expected tiles [batch, tiles, C, H, W] from the processor, "
                                 f"got shape {list(pixels.shape)}", param="images", where=f"request {request_id}")
        tiles = pixels[0]
        real = np.flatnonzero(np.abs(tiles).reshape(len(tiles), -1).max(axis=1) > 0)  # all-zero: padding
        mask = out.get("pixel_attention_mask")
        if mask is not None and not np.asarray(mask)[0][real].all():
            raise InvalidRequest("the processor padded inside an image tile, which "
                                 "this model does not support", param="images", where=f"request {request_id}")
        return tiles[real], {}
