"""Llama 4 image preprocessing and prompt layout.

Each image is resized without distortion to fit the best canvas of ``tile x tile`` tiles (at most
``max_patches`` tiles; the canvas that needs the least upscaling, else the least downscaling, the smaller
area on a tie; without ``resize_to_max_canvas`` an image is never upscaled past one tile), padded right and
bottom with zeros, rescaled and normalised in bfloat16 (as Llama 4's own preprocessing), and cut into
tiles row by row; an image of more than one tile also gets a global view (the whole image resized to one
tile), last.  In the prompt an image is ``<|image_start|>``, each row of tiles (``tokens_per_tile``
``<|patch|>`` per tile, ``<|tile_x_separator|>`` between tiles, ``<|tile_y_separator|>`` after the row),
then ``<|image|>`` and the global view's (or the only tile's) patches, ``<|image_end|>``: every tile has
its own placeholder span.

``Llama4Processor``'s image processor needs torchvision; without it this folder's :class:`_TileProcessor`
does the same from the folder's ``preprocessor_config.json`` and ``processor_config.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from max.pipelines.architectures.common.processor import FolderProcessor, folder_chat_template, processor_load_error
from max.pipelines.lib.tokenizer import TextAndVisionTokenizer

__all__ = ["Llama4ImagePreprocessor", "Llama4VisionTokenizer", "best_canvas", "resize_target", "supported_canvases"]


class Llama4VisionTokenizer(TextAndVisionTokenizer):
    """:class:`TextAndVisionTokenizer` for Llama 4 (one pixel array per tile, in prompt order)."""

    def processor_without_auto(self, folder: str, why: Exception) -> Any:
        return _TileProcessor.load(folder, self.delegate, why)


def supported_canvases(max_tiles: int) -> list[tuple[int, int]]:
    """Every ``(rows, cols)`` of at most ``max_tiles`` tiles, grouped by aspect ratio in order of first appearance
    when counting tiles down from ``max_tiles`` (the order decides nothing but ties of equal area)."""
    groups: dict[float, list[tuple[int, int]]] = {}
    for n in range(max_tiles, 0, -1):
        for rows in sorted(d for d in range(1, n + 1) if n % d == 0):
            groups.setdefault(rows / (n // rows), []).append((rows, n // rows))
    return [rc for g in groups.values() for rc in g]


def best_canvas(height: int, width: int, tile: int, max_tiles: int, to_max: bool = False) -> tuple[int, int]:
    """``(rows, cols)`` of the canvas an image of ``height`` x ``width`` goes on (see the module docstring)."""
    cands = supported_canvases(max_tiles)
    scales = [min(r * tile / height, c * tile / width) for r, c in cands]
    up = [s for s in scales if s >= 1]
    pick = (max(up) if to_max else min(up)) if up else max(scales)
    best = [rc for rc, s in zip(cands, scales) if s == pick]
    return min(best, key=lambda rc: rc[0] * rc[1])  # the first of the smallest area


def resize_target(height: int, width: int, rows: int, cols: int, tile: int, to_max: bool = False) -> tuple[int, int]:
    """The size the image is resized to before padding to the ``rows`` x ``cols`` canvas (aspect kept)."""
    th, tw = rows * tile, cols * tile
    if not to_max:  # never upscale past one tile
        th, tw = min(max(height, tile), th), min(max(width, tile), tw)
    if tw / width < th / height:
        h, w = min(int(np.floor(height * (tw / width))), th), tw
    else:
        h, w = th, min(int(np.floor(width * (th / height))), tw)
    return max(h, 1), max(w, 1)


def _resize(img: Any, size: tuple[int, int]) -> Any:
    """uint8 ``[C, H, W]`` -> uint8 ``[C, h, w]``, bilinear with antialiasing."""
    import torch

    return torch.nn.functional.interpolate(img[None], size=size, mode="bilinear", align_corners=False,
                                           antialias=True)[0]


class Llama4ImagePreprocessor:
    """Llama 4's image preprocessing from a ``preprocessor_config.json`` dict (see the module docstring)."""

    def __init__(self, pre: dict) -> None:
        size = pre.get("size") or {"height": 336, "width": 336}
        self.tile = int(size.get("height", 336))
        if int(size.get("width", self.tile)) != self.tile:
            raise ValueError(f"Llama 4 tiles must be square, got size {size}")
        self.max_tiles = int(pre.get("max_patches", 16))
        self.to_max = bool(pre.get("resize_to_max_canvas", False))
        self.rescale = float(pre.get("rescale_factor", 1 / 255))
        self.mean = [float(x) for x in pre.get("image_mean", [0.5] * 3)]
        self.std = [float(x) for x in pre.get("image_std", [0.5] * 3)]

    def _normalize(self, img: Any) -> Any:
        import torch

        x = img.to(torch.bfloat16) * self.rescale  # bfloat16 throughout, as Llama 4's preprocessing
        mean = torch.tensor(self.mean, dtype=torch.bfloat16)[:, None, None]
        std = torch.tensor(self.std, dtype=torch.bfloat16)[:, None, None]
        return ((x - mean) / std).float()

    def __call__(self, image: Any) -> tuple[np.ndarray, tuple[int, int]]:
        """An image (PIL) -> (tiles ``[n, 3, tile, tile]`` float32, ``(rows, cols)``)."""
        import torch

        img = torch.from_numpy(np.array(image.convert("RGB"), dtype=np.uint8)).permute(2, 0, 1).contiguous()
        h, w = int(img.shape[1]), int(img.shape[2])
        rows, cols = best_canvas(h, w, self.tile, self.max_tiles, self.to_max)
        t = self.tile
        small = _resize(img, resize_target(h, w, rows, cols, t, self.to_max))
        canvas = torch.zeros(3, rows * t, cols * t, dtype=torch.uint8)
        canvas[:, :small.shape[1], :small.shape[2]] = small
        x = self._normalize(canvas)
        tiles = x.reshape(3, rows, t, cols, t).permute(1, 3, 0, 2, 4).reshape(rows * cols, 3, t, t)
        if rows * cols > 1:
            tiles = torch.cat([tiles, self._normalize(_resize(img, (t, t)))[None]])
        return tiles.numpy(), (rows, cols)


class _TileProcessor(FolderProcessor):
    """The model folder's tokenizer with :class:`Llama4ImagePreprocessor` and Llama 4's prompt layout."""

    def __init__(self, tokenizer: Any, image_processor: Llama4ImagePreprocessor, proc: dict, tokens_per_tile: int,
                 chat_template: Any) -> None:
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.chat_template = chat_template
        self.tokens_per_tile = tokens_per_tile
        self.image_token = proc.get("fake_image_token", "<|image|>")
        self.global_token = proc.get("image_token", "<|image|>")
        self.start = proc.get("start_of_image_token", "<|image_start|>")
        self.end = proc.get("end_of_image_token", "<|image_end|>")
        self.patch = proc.get("patch_token", "<|patch|>")
        self.x_sep = proc.get("tile_x_separator_token", "<|tile_x_separator|>")
        self.y_sep = proc.get("tile_y_separator_token", "<|tile_y_separator|>")

    @classmethod
    def load(cls, folder: str, tokenizer: Any, why: Exception) -> "_TileProcessor":
        try:
            ip = Llama4ImagePreprocessor(json.loads(Path(folder, "preprocessor_config.json").read_text()))
            pc = Path(folder, "processor_config.json")
            proc = json.loads(pc.read_text()) if pc.is_file() else {}
            cfg = json.loads(Path(folder, "config.json").read_text()).get("vision_config") or {}
            patch = int(proc.get("patch_size", cfg.get("patch_size", 14)))
            ratio = float(proc.get("pixel_shuffle_ratio", cfg.get("pixel_shuffle_ratio", 0.5)))
            return cls(tokenizer, ip, proc, int(round((ip.tile // patch) ** 2 * ratio * ratio)),
                       folder_chat_template(folder))
        except Exception as e:  # noqa: BLE001 - neither loader works: say both reasons
            raise processor_load_error(folder, why, e, "preprocessor config and tokenizer") from None

    def layout(self, rows: int, cols: int) -> str:
        """An image's placeholder text for a ``rows`` x ``cols`` canvas."""
        run = self.patch * self.tokens_per_tile
        s = self.start
        if rows * cols > 1:
            s += "".join(self.x_sep.join([run] * cols) + self.y_sep for _ in range(rows))
        return s + self.global_token + run + self.end

    def __call__(self, text: list[str], images: list[list[Any]], return_tensors: str = "np",
                 add_special_tokens: bool = True) -> dict[str, Any]:
        done = [self.image_processor(im) for im in images[0]]
        pieces = text[0].split(self.image_token)
        if len(pieces) - 1 != len(done):
            raise ValueError(f"{len(pieces) - 1} image placeholders for {len(done)} images")
        expanded = pieces[0] + "".join(self.layout(*rc) + p for (_, rc), p in zip(done, pieces[1:]))
        ids = self.tokenizer(expanded, add_special_tokens=add_special_tokens)["input_ids"]
        return {"input_ids": np.asarray([ids], np.int64),
                "pixel_values": np.concatenate([t for t, _ in done]).astype(np.float32)}
