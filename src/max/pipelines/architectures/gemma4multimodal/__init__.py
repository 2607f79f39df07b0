"""Gemma 4 as released (``Gemma4ForConditionalGeneration``: E2B/E4B/26B-A4B/31B), text only: the text
decoder is the gemma4 family's (``text_config``, weights under ``model.language_model.*``); the vision
tower (and E2B/E4B's audio tower) and their embedders are left out at load.  Requests with images, video
or audio are refused with a clear error (HTTP 400) naming the input.

Not supported yet: Gemma 4's vision tower (a variable-resolution ViT with 2-D RoPE and patch pooling, not
SigLIP as in gemma3multimodal) and audio tower."""

from max.pipelines.architectures.gemma4multimodal.arch import gemma4multimodal_arch

ARCHITECTURES = [gemma4multimodal_arch]
