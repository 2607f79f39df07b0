"""InternVL image preprocessing: the processor splits each image into up to ``max_patches`` tiles of the
vision encoder's size plus a thumbnail (``crop_to_patches``), returns every image's tiles in one
``pixel_values`` array, and writes each image as ``<img>`` + ``image_seq_length`` context tokens per tile +
``</img>``.  This folder's tokenizer splits the tiles per image by the length of its placeholder span.

``InternVLProcessor`` itself needs torchvision (its video processor); without it, the image processor and
the tokenizer do the same expansion here (:class:`_TileProcessor`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from max.interfaces.errors import InvalidRequest
from max.pipelines.architectures.common.processor import FolderProcessor, folder_chat_template, processor_load_error
from max.pipelines.lib.tokenizer import TextAndVisionTokenizer, _runs

__all__ = ["InternVLTokenizer"]


class InternVLTokenizer(TextAndVisionTokenizer):
    """:class:`TextAndVisionTokenizer` whose pixel arrays are each image's tiles ``[tiles, C, H, W]``."""

    def processor_without_auto(self, folder: str, why: Exception) -> Any:
        return _TileProcessor.load(folder, self.delegate, why)

    def split_images(self, out: dict[str, Any], request_id: str) -> tuple[Sequence[np.ndarray], dict[str, Any]]:
        pixels = np.asarray(out["pixel_values"], dtype=np.float32)
        per_tile = int(getattr(self.processor, "image_seq_length", 0) or 0)
        spans = _runs(np.asarray(out["input_ids"][0], np.int64), self.image_token_id)
        tiles = [(b - a) // per_tile if per_tile else 0 for a, b in spans]
        if pixels.ndim != 4 or not per_tile or any(t * per_tile != b - a for t, (a, b) in zip(tiles, spans)) \
                or sum(tiles) != len(pixels):
            raise InvalidRequest(f"the processor's {list(pixels.shape)} tiles do not match its {len(spans)} image "
                                 f"placeholder spans of {per_tile} tokens per tile", param="images",
                                 where=f"request {request_id}")
        return np.split(pixels, np.cumsum(tiles)[:-1]), {}


class _TileProcessor(FolderProcessor):
    """The model folder's image processor and tokenizer without ``InternVLProcessor``: tiles as the image
    processor makes them (``crop_to_patches``), each image placeholder expanded to ``<img>`` +
    ``image_seq_length * tiles`` context tokens + ``</img>``, as InternVLProcessor does."""

    def __init__(self, image_processor: Any, tokenizer: Any, image_seq_length: int, chat_template: Any) -> None:
        self.image_processor = image_processor
        self.tokenizer = tokenizer
        self.image_seq_length = image_seq_length
        self.chat_template = chat_template
        names = ("context_image_token", "start_image_token", "end_image_token")
        self.image_token, self.start, self.end = (getattr(tokenizer, n, None) for n in names)
        if not (self.image_token and self.start and self.end):
            raise ValueError(f"the tokenizer must name {', '.join(names)}")

    @classmethod
    def load(cls, folder: str, tokenizer: Any, why: Exception) -> "_TileProcessor":
        from transformers import AutoImageProcessor

        try:
            ip = AutoImageProcessor.from_pretrained(folder)
            seq = _image_seq_length(folder)
            return cls(ip, tokenizer, seq, folder_chat_template(folder))
        except Exception as e:  # noqa: BLE001 - neither loader works: say both reasons
            raise processor_load_error(folder, why, e, "image processor and tokenizer") from None

    def __call__(self, text: list[str], images: list[list[Any]], return_tensors: str = "np",
                 add_special_tokens: bool = True) -> dict[str, Any]:
        out = self.image_processor(images=images[0], crop_to_patches=True, return_tensors="np")
        counts = [int(n) for n in np.asarray(out["num_patches"]).reshape(-1)]
        pieces = text[0].split(self.image_token)
        if len(pieces) - 1 != len(counts):
            raise ValueError(f"{len(pieces) - 1} image placeholders for {len(counts)} images")
        expanded = pieces[0] + "".join(self.start + self.image_token * (self.image_seq_length * n) + self.end + p
                                       for n, p in zip(counts, pieces[1:]))
        ids = self.tokenizer(expanded, add_special_tokens=add_special_tokens)["input_ids"]
        return {"input_ids": np.asarray([ids], np.int64), "pixel_values": np.asarray(out["pixel_values"])}


def _image_seq_length(folder: str) -> int:
    """Tokens per tile: ``processor_config.json``'s ``image_seq_length``, else from ``config.json`` (the patch grid
    shrunk by the pixel shuffle)."""
    pc = Path(folder, "processor_config.json")
    if pc.is_file():
        seq = json.loads(pc.read_text()).get("image_seq_length")
        if seq:
            return int(seq)
    from max.pipelines.architectures.internvl.config import vision_config_from_hf

    return vision_config_from_hf(json.loads(Path(folder, "config.json").read_text())).tokens_per_tile
