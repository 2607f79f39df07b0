"""The Glm4ForCausalLM pipeline model (see the package docstring).  GGUF: llama.cpp's names (``ffn_up`` is
the fused gate/up projection, ``post_attention_norm`` / ``post_ffw_norm`` the norms after attention and
MLP); q/k rows as in the Hugging Face checkpoint (GLM rotates adjacent pairs, which llama.cpp's ``glm4``
also does, so its converter permutes nothing)."""

from __future__ import annotations

from max.pipelines.architectures.common.model import DecoderPipelineModel
from max.pipelines.architectures.common.weights import GGUF_LAYER_NAMES, standard_adapters
from max.pipelines.architectures.glm4.config import config_from_hf

GGUF_NAMES = {**GGUF_LAYER_NAMES, "ffn_up": "mlp.gate_up_proj", "post_attention_norm": "post_self_attn_layernorm",
              "post_ffw_norm": "post_mlp_layernorm"}


class Glm4Model(DecoderPipelineModel):
    config_from_hf = staticmethod(config_from_hf)
    weight_adapters = standard_adapters(GGUF_NAMES)
