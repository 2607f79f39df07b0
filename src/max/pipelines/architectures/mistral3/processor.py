"""Mistral 3 / Pixtral image preprocessing.  The processor resizes each image (longest side at most
``longest_edge``, both sides rounded up to multiples of ``patch_size * spatial_merge_size``), pads the
batch to one size and reports the real sizes (``image_sizes``); an image's placeholder becomes one row of
``[IMG]`` tokens per merged-patch row, each row closed by ``[IMG_BREAK]``, the last by ``[IMG_END]``.

This folder's tokenizer crops every image back to its own size and treats an image's whole layout (its
``[IMG]`` rows with their break and end tokens) as one span, so chunked prefill and the prefix cache
never split it; only the ``[IMG]`` positions take image embeddings.  Without transformers'
``PixtralProcessor`` (it needs torchvision) the folder's image processor, tokenizer and
``processor_config.json`` make the same prompt (:class:`_PixtralProcessor`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from max.interfaces.errors import InvalidRequest
from max.pipelines.architectures.common.processor import FolderProcessor, folder_chat_template, processor_load_error
from max.pipelines.lib.tokenizer import TextAndVisionTokenizer

__all__ = ["Mistral3Tokenizer", "image_layout_tokens"]


def image_layout_tokens(rows: int, cols: int, image: str, brk: str, end: str) -> list[str]:
    """The placeholder layout of an image of ``rows`` x ``cols`` image tokens."""
    out = ([image] * cols + [brk]) * rows
    out[-1] = end
    return out


class Mistral3Tokenizer(TextAndVisionTokenizer):
    """:class:`TextAndVisionTokenizer` for Pixtral-style processors (``image_sizes``, break/end tokens)."""

    def processor_without_auto(self, folder: str, why: Exception) -> Any:
        return _PixtralProcessor.load(folder, self.delegate, why)

    def split_images(self, out: dict[str, Any], request_id: str) -> tuple[Sequence[np.ndarray], dict[str, Any]]:
        pixels = np.asarray(out["pixel_values"], dtype=np.float32)
        if "image_sizes" not in out or pixels.ndim != 4:
            raise InvalidRequest(f"expected padded images [n, C, H, W] and image_sizes from the processor, got "
                                 f"{list(pixels.shape)}", param="images", where=f"request {request_id}")
        sizes = np.asarray(out["image_sizes"], np.int64).reshape(-1, 2)
        side = int(getattr(self.processor, "patch_size", 1)) * int(getattr(self.processor, "spatial_merge_size", 1))
        if len(sizes) != len(pixels) or (sizes % side).any() or (sizes <= 0).any() \
                or (sizes > np.asarray(pixels.shape[2:])).any():
            raise InvalidRequest(f"the processor's image_sizes {sizes.tolist()} do not fit its {len(pixels)} images "
                                 f"{list(pixels.shape[2:])} in whole {side}-pixel tokens", param="images",
                                 where=f"request {request_id}")
        return [np.ascontiguousarray(pixels[i, :, :h, :w]) for i, (h, w) in enumerate(sizes)], {}

    def image_spans(self, ids: np.ndarray) -> list[tuple[int, int]]:
        """Each image's span: from its first ``[IMG]`` to its ``[IMG_END]``."""
        brk, end = (self._token_id(a) for a in ("image_break_token", "image_end_token"))
        inside = np.isin(ids, [self.image_token_id, brk, end])
        spans: list[tuple[int, int]] = []
        start = None
        for i, (tok, flag) in enumerate(zip(ids.tolist(), inside.tolist())):
            if flag and start is None:
                start = i
            if start is not None and (not flag or tok == end):
                spans.append((start, i + 1 if flag else i))
                start = None
        if start is not None:
            spans.append((start, len(ids)))
        return spans

    def _token_id(self, attr: str) -> int:
        tid = getattr(self.processor, f"{attr}_id", None)
        if tid is None:
            tid = self.delegate.convert_tokens_to_ids(getattr(self.processor, attr))
        return int(tid)


class _PixtralProcessor(FolderProcessor):
    """The folder's image processor and tokenizer laid out as ``PixtralProcessor`` does (see the module
    docstring), its sizes and token names from ``processor_config.json``."""

    def __init__(self, image_processor: Any, tokenizer: Any, chat_template: Optional[str], opts: dict) -> None:
        self.image_processor = image_processor
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.patch_size = int(opts.get("patch_size", 16))
        self.spatial_merge_size = int(opts.get("spatial_merge_size", 1))
        self.image_token = str(opts.get("image_token", "[IMG]"))
        self.image_break_token = str(opts.get("image_break_token", "[IMG_BREAK]"))
        self.image_end_token = str(opts.get("image_end_token", "[IMG_END]"))
        for t in (self.image_token, self.image_break_token, self.image_end_token):
            if tokenizer.convert_tokens_to_ids(t) in (None, tokenizer.unk_token_id):
                raise ValueError(f"the tokenizer has no {t} token")
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)

    @classmethod
    def load(cls, folder: str, tokenizer: Any, why: Exception) -> "_PixtralProcessor":
        from transformers import AutoImageProcessor

        try:
            ip = AutoImageProcessor.from_pretrained(folder)
            cfg = Path(folder, "processor_config.json")
            opts = json.loads(cfg.read_text()) if cfg.is_file() else {}
            return cls(ip, tokenizer, folder_chat_template(folder), opts)
        except Exception as e:  # noqa: BLE001 - neither loader works: say both reasons
            raise processor_load_error(folder, why, e, "image processor") from None

    def __call__(self, text: list[str], images: list[list[Any]], return_tensors: str = "np",
                 add_special_tokens: bool = True) -> dict[str, Any]:
        side = self.patch_size * self.spatial_merge_size
        out = self.image_processor(images=images[0], patch_size={"height": side, "width": side}, return_tensors="np")
        sizes = np.asarray(out["image_sizes"], np.int64).reshape(-1, 2)
        pieces = text[0].split(self.image_token)
        if len(pieces) - 1 != len(sizes):
            raise ValueError(f"{len(pieces) - 1} image placeholders for {len(sizes)} images")
        spans = ["".join(image_layout_tokens(int(h) // side, int(w) // side, self.image_token, self.image_break_token,
                                             self.image_end_token)) for h, w in sizes]
        expanded = pieces[0] + "".join(s + p for s, p in zip(spans, pieces[1:]))
        ids = self.tokenizer(expanded, add_special_tokens=add_special_tokens)["input_ids"]
        return {"input_ids": np.asarray([ids], np.int64), "pixel_values": np.asarray(out["pixel_values"]),
                "image_sizes": sizes}
