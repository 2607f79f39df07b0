"""Registration of the Olmo3ForCausalLM architecture."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.olmo3.model import Olmo3Model

olmo3_arch = decoder_architecture("Olmo3ForCausalLM", ["allenai/Olmo-3-7B-Instruct"], Olmo3Model)
