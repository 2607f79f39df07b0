"""Fast GGUF metadata reading: re-exported from :mod:`max.graph.weights.gguf_meta` (the format reader lives
with the other checkpoint readers)."""

from max.graph.weights.gguf_meta import *  # noqa: F401,F403
from max.graph.weights.gguf_meta import (  # noqa: F401
    _read_cached,
    FILE_TYPE_TO_GGML,
    GGML_TYPE_NAMES,
    GGUF_MAGIC,
    GGUFFormatError,
    GGUFMetadata,
    GGUFStringArray,
    GGUFTensorInfo,
    is_gguf_file,
    read_gguf_metadata,
)
