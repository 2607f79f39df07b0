"""InternVL configuration (``InternVLForConditionalGeneration``): a text decoder (``text_config``: Qwen2,
Llama or Qwen3, through that family's own translation), the InternViT vision encoder (``vision_config``:
CLS token, learned absolute positions, LayerNorm or RMSNorm, optional QK norm, layer scale) and the
projector (pixel shuffle by ``1 / downsample_ratio``, LayerNorm, two linears)."""

from __future__ import annotations

from dataclasses import dataclass

from max.pipelines.architectures.common import DecoderConfig
from max.pipelines.architectures.common.siglip import SiglipConfig
from max.pipelines.architectures.common.vision_config import PixelShuffleTokens, hf_part, inverse_ratio, square_size

ARCHITECTURE = "InternVLForConditionalGeneration"


def _text(hf: dict) -> dict:
    return hf_part(hf, "text_config", ARCHITECTURE)


def config_from_hf(hf: dict) -> DecoderConfig:
    """The text decoder's config (its own family's translation), named after the multimodal architecture."""
    from max.pipelines.architectures.llama3.config import config_from_hf as llama
    from max.pipelines.architectures.qwen2.config import config_from_hf as qwen2
    from max.pipelines.architectures.qwen3.config import config_from_hf as qwen3

    text = _text(hf)
    families = {"qwen2": qwen2, "llama": llama, "qwen3": qwen3}
    kind = text.get("model_type", "qwen2")
    if kind not in families:
        raise NotImplementedError(f"{ARCHITECTURE}: text model type {kind!r} is not supported "
                                  f"(supported: {sorted(families)})")
    cfg = families[kind](text)
    cfg.architecture = ARCHITECTURE
    cfg.tie_word_embeddings = bool(hf.get("tie_word_embeddings", True))  # the composite model's setting rules
    return cfg


@dataclass(frozen=True)
class VisionConfig(PixelShuffleTokens, SiglipConfig):
    """InternViT and the projector."""

    norm_type: str = "layer_norm"
    use_qk_norm: bool = False
    attention_bias: bool = False
    use_mean_pooling: bool = True
    use_absolute_position_embeddings: bool = True
    num_layers_used: int = 0
    """How many encoder layers run (``vision_feature_layer`` k >= 0: k, k < 0: all but -k - 1)."""
    final_norm: bool = False
    """Whether the final LayerNorm applies: no mean pooling and ``vision_feature_layer`` -1 (the tower's last
    hidden state; any other index takes a layer's raw output)."""
    scale_factor: int = 2
    projector_hidden_act: str = "gelu"
    text_hidden_size: int = 0


def vision_config_from_hf(hf: dict) -> VisionConfig:
    v = hf_part(hf, "vision_config", ARCHITECTURE)
    if hf.get("vision_feature_select_strategy", "default") != "default":
        raise NotImplementedError(f"{ARCHITECTURE}: vision_feature_select_strategy "
                                  f"{hf.get('vision_feature_select_strategy')!r} is not supported (only 'default')")
    n_layers = int(v["num_hidden_layers"])
    layer = hf.get("vision_feature_layer", -1)
    if not isinstance(layer, int) or not -n_layers - 1 <= layer <= n_layers:
        raise NotImplementedError(f"{ARCHITECTURE}: vision_feature_layer {layer!r} is not supported (one layer index)")
    scale = inverse_ratio(float(hf.get("downsample_ratio", 0.5)), "downsample_ratio", ARCHITECTURE)
    norm = str(v.get("norm_type", "layer_norm"))
    if norm not in ("layer_norm", "rms_norm"):
        raise NotImplementedError(f"{ARCHITECTURE}: vision norm_type {norm!r} is not supported")
    c = VisionConfig(
        hidden_size=int(v["hidden_size"]), intermediate_size=int(v["intermediate_size"]), num_hidden_layers=n_layers,
        num_attention_heads=int(v["num_attention_heads"]), image_size=square_size(v.get("image_size", 448), "image size", ARCHITECTURE),
        patch_size=square_size(v.get("patch_size", 14), "patch", ARCHITECTURE), num_channels=int(v.get("num_channels", 3)),
        layer_norm_eps=float(v.get("layer_norm_eps", 1e-6)), hidden_act=str(v.get("hidden_act", "gelu")),
        norm_type=norm, use_qk_norm=bool(v.get("use_qk_norm", False)),
        attention_bias=bool(v.get("attention_bias", False)), use_mean_pooling=bool(v.get("use_mean_pooling", True)),
        use_absolute_position_embeddings=bool(v.get("use_absolute_position_embeddings", True)),
        num_layers_used=n_layers if layer == -1 else layer % (n_layers + 1), scale_factor=scale,
        final_norm=layer == -1 and not bool(v.get("use_mean_pooling", True)),
        projector_hidden_act=str(hf.get("projector_hidden_act", "gelu")),
        text_hidden_size=int(_text(hf)["hidden_size"]))
    if c.patches_per_side % c.scale_factor:
        raise ValueError(f"{ARCHITECTURE}: 1 / downsample_ratio = {c.scale_factor} must divide the patch grid side "
                         f"{c.patches_per_side}")
    return c
