"""Registration of the Llama 4 text architecture."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.llama4.model import Llama4Model

llama4_arch = decoder_architecture("Llama4ForCausalLM", ["meta-llama/Llama-4-Scout-17B-16E-Instruct"], Llama4Model)
