"""What vision-language families' configurations share: reading a config's sub-dict (``text_config``,
``vision_config``), square sizes and integer downsampling ratios, and the derived sizes of a patch grid
(mixins that a family's frozen ``VisionConfig`` dataclass inherits; they read the fields it declares)."""

from __future__ import annotations


def hf_part(hf: dict, key: str, architecture: str) -> dict:
    """``hf[key]`` (a nested config such as ``text_config``); a clear error if it is not a dict."""
    part = hf.get(key)
    if not isinstance(part, dict):
        raise ValueError(f"{architecture}: the config has no {key}")
    return part


def square_size(v: object, what: str, architecture: str) -> int:
    """A square size from an int or ``[h, w]`` with ``h == w``."""
    if isinstance(v, (list, tuple)):
        if len(v) != 2 or v[0] != v[1]:
            raise NotImplementedError(f"{architecture}: only a square {what} is supported, got {v}")
        v = v[0]
    return int(v)  # type: ignore[call-overload]


def inverse_ratio(ratio: float, name: str, architecture: str) -> int:
    """The integer ``1 / ratio`` of a pixel-shuffle ratio (e.g. 0.5 -> 2); an error if it is not one."""
    scale = int(round(1 / ratio))
    if abs(scale * ratio - 1) > 1e-6:
        raise NotImplementedError(f"{architecture}: {name} {ratio} must be 1 / an integer")
    return scale


class SquarePatchGrid:
    """A ViT over a square image cut into square patches (fields ``image_size``, ``patch_size``,
    ``hidden_size``, ``num_attention_heads``)."""

    image_size: int
    patch_size: int
    hidden_size: int
    num_attention_heads: int

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


class PixelShuffleTokens(SquarePatchGrid):
    """A square patch grid whose ``scale_factor`` x ``scale_factor`` patches become one token."""

    scale_factor: int

    @property
    def tokens_per_tile(self) -> int:
        return self.patches_per_side ** 2 // self.scale_factor ** 2


class MergedPatchGrid:
    """A Qwen-VL ViT over ``temporal_patch_size`` x ``patch_size``² patches whose
    ``spatial_merge_size``² neighbours merge into one token (fields ``hidden_size``, ``num_heads``,
    ``in_channels``, ``temporal_patch_size``, ``patch_size``, ``spatial_merge_size``)."""

    hidden_size: int
    num_heads: int
    in_channels: int
    temporal_patch_size: int
    patch_size: int
    spatial_merge_size: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size ** 2
