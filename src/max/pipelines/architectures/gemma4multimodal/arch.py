"""Registration of Gemma 4's multimodal checkpoints, run for text."""

from max.pipelines.architectures.common.arch import decoder_architecture
from max.pipelines.architectures.gemma4multimodal.config import ARCHITECTURE
from max.pipelines.architectures.gemma4multimodal.model import Gemma4TextOnlyModel
from max.pipelines.architectures.gemma4multimodal.tokenizer import Gemma4TextOnlyTokenizer

gemma4multimodal_arch = decoder_architecture(
    ARCHITECTURE, ["google/gemma-4-E2B-it", "google/gemma-4-E4B-it", "google/gemma-4-26B-A4B-it",
                   "google/gemma-4-31B-it"], Gemma4TextOnlyModel, tokenizer=Gemma4TextOnlyTokenizer)
