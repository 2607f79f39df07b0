"""What vision-language families' configurations share: reading a config's sub-dict (``text_config``,
``vision_config``), square sizes and integer downsampling ratios, and the derived sizes of a patch grid
(bases of a family's frozen ``VisionConfig`` dataclass: ``SquarePatchGrid`` and ``PixelShuffleTokens`` read
fields the family declares; ``MergedPatchGrid`` declares the Qwen-VL towers' shared fields itself)."""

from __future__ import annotations

from dataclasses import dataclass


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


@dataclass(frozen=True)
class MergedPatchGrid:
    """A Qwen-VL ViT over ``temporal_patch_size`` x ``patch_size``² patches whose ``spatial_merge_size``²
    neighbours merge into one token of width ``out_hidden_size`` (the fields Qwen2.5-VL and Qwen3-VL share;
    each family's ``VisionConfig`` adds its own)."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    patch_size: int
    spatial_merge_size: int
    temporal_patch_size: int
    in_channels: int
    hidden_act: str
    rope_theta: float

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size ** 2


def merged_patch_fields(v: dict, hidden_act: str) -> dict:
    """:class:`MergedPatchGrid`'s fields from a Hugging Face ``vision_config`` dict (``hidden_act``: the
    family's default activation)."""
    rp = v.get("rope_parameters") or {}
    return dict(depth=int(v["depth"]), hidden_size=int(v["hidden_size"]),
                intermediate_size=int(v["intermediate_size"]), num_heads=int(v["num_heads"]),
                out_hidden_size=int(v["out_hidden_size"]), patch_size=int(v["patch_size"]),
                spatial_merge_size=int(v["spatial_merge_size"]),
                temporal_patch_size=int(v.get("temporal_patch_size", 2)),
                in_channels=int(v.get("in_channels", 3)), hidden_act=str(v.get("hidden_act", hidden_act)),
                rope_theta=float(rp.get("rope_theta", 10000.0)))
