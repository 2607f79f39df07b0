"""Normalisation layers: RMSNorm, LayerNorm, GroupNorm (and the deprecated V1 forms)."""

from max.nn.norm.constant_layer_norm import ConstantLayerNorm
from max.nn.norm.group_norm import GroupNorm
from max.nn.norm.layer_norm import LayerNorm, LayerNormV1
from max.nn.norm.rms_norm import RMSNorm, RMSNormV1

__all__ = ["ConstantLayerNorm", "GroupNorm", "LayerNorm", "LayerNormV1", "RMSNorm", "RMSNormV1"]
