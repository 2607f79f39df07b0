"""``max.pipelines``: Hugging Face models -> MAX text generation pipelines.

Configuration (``PipelineConfig``), the architecture registry (``PIPELINE_REGISTRY``,
``SupportedArchitecture``), tokenizers (``TextTokenizer``), contexts (``TextContext``
in :mod:`max.pipelines.core`), sampling and HF helpers live in :mod:`max.pipelines.lib`
and are re-exported here.  Names defined elsewhere in the package (the pipeline
classes in ``max.pipelines.lib.pipeline``) resolve lazily on first access.
"""

from __future__ import annotations

from typing import Any

from max.pipelines import lib as _lib
from max.pipelines.core import TextAndVisionContext, TextContext, TTSContext, get_request_payload_from_pipeline_task
from max.pipelines.lib import *  # noqa: F401,F403
from max.pipelines.lib import __all__ as _lib_all


def __getattr__(name: str) -> Any:
    return getattr(_lib, name)


__all__ = ["TTSContext", "TextAndVisionContext", "TextContext", "get_request_payload_from_pipeline_task", *_lib_all]
