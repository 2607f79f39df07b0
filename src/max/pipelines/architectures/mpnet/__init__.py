"""MPNet encoders for embeddings (``MPNetModel``: all-mpnet-base-v2 ...)."""

from max.pipelines.architectures.mpnet.arch import mpnet_arch

ARCHITECTURES = [mpnet_arch]
