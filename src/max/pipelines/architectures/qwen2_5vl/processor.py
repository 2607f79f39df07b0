"""Qwen2-VL-family image preprocessing: the processor packs the patches of every image into one array
and reports each image's patch grid (``image_grid_thw``); this folder's tokenizer splits them per image
and keeps the grids for the vision encoder."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from max.interfaces.errors import InvalidRequest
from max.pipelines.architectures.common.processor import FolderProcessor, folder_chat_template, processor_load_error
from max.pipelines.lib.tokenizer import TextAndVisionTokenizer

__all__ = ["Qwen2VLTokenizer", "expand_placeholders"]


class Qwen2VLTokenizer(TextAndVisionTokenizer):
    """:class:`TextAndVisionTokenizer` for processors that report ``image_grid_thw``."""

    def processor_without_auto(self, folder: str, why: Exception) -> Any:
        # e.g. a video processor that needs torchvision: the image processor alone does for images
        return _GridImageProcessor.load(folder, self.delegate, why)

    def split_images(self, out: dict[str, Any], request_id: str) -> tuple[Sequence[np.ndarray], dict[str, Any]]:
        pixels = np.asarray(out["pixel_values"], dtype=np.float32)
        if "image_grid_thw" not in out:
            raise InvalidRequest("the processor reported no image_grid_thw",
                                 param="images", where=f"request {request_id}")
        grid = np.asarray(out["image_grid_thw"], np.int64).reshape(-1, 3)
        return np.split(pixels, np.cumsum(grid.prod(axis=1))[:-1]), {"image_grid_thw": grid}


def expand_placeholders(text: str, placeholder: str, replacements: Sequence[str], what: str) -> str:
    """``text`` with its ``k``-th ``placeholder`` replaced by ``replacements[k]`` (ValueError when the counts
    differ)."""
    pieces = text.split(placeholder)
    if len(pieces) - 1 != len(replacements):
        raise ValueError(f"{len(pieces) - 1} {what} placeholders for {len(replacements)} {what}s")
    return pieces[0] + "".join(r + p for r, p in zip(replacements, pieces[1:]))


class _GridImageProcessor(FolderProcessor):
    """The model folder's image processor and tokenizer without its ``AutoProcessor`` (which may need more,
    e.g. torchvision for a video processor), for image processors that report each image's patch grid
    (``image_grid_thw``, Qwen2-VL family): each image placeholder token is repeated once per merged patch
    (``t * h * w / merge_size**2``), as those processors do."""

    def __init__(self, image_processor: Any, tokenizer: Any, chat_template: Optional[str]) -> None:
        self.image_processor = image_processor
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.image_token = getattr(tokenizer, "image_token", None)
        if not self.image_token:
            raise ValueError("the tokenizer names no image_token")

    @classmethod
    def load(cls, folder: str, tokenizer: Any, why: Exception) -> "_GridImageProcessor":
        from transformers import AutoImageProcessor

        try:
            ip = AutoImageProcessor.from_pretrained(folder)
            return cls(ip, tokenizer, folder_chat_template(folder))
        except Exception as e:  # noqa: BLE001 - neither loader works: say both reasons
            raise processor_load_error(folder, why, e, "image processor") from None

    def __call__(self, text: list[str], images: list[list[Any]], return_tensors: str = "np",
                 add_special_tokens: bool = True) -> dict[str, Any]:
        out = self.image_processor(images=images[0], return_tensors="np")
        if "image_grid_thw" not in out:
            raise ValueError("this image processor reports no image_grid_thw; the model's own processor is needed")
        merge = int(getattr(self.image_processor, "merge_size", 1) or 1)
        counts = [int(np.prod(g)) // (merge * merge) for g in np.asarray(out["image_grid_thw"])]
        expanded = expand_placeholders(text[0], self.image_token, [self.image_token * n for n in counts], "image")
        ids = self.tokenizer(expanded, add_special_tokens=add_special_tokens)["input_ids"]
        return {"input_ids": np.asarray([ids], np.int64), "pixel_values": np.asarray(out["pixel_values"]),
                "image_grid_thw": np.asarray(out["image_grid_thw"])}
