"""Built-in architectures, one folder each; ``register_all_models()`` registers them.

Every sub-package that exports ``ARCHITECTURES`` (a list of ``SupportedArchitecture``) is
registered: adding a family is adding its folder.  ``common`` holds the code families share.
"""

from __future__ import annotations

import importlib
import pkgutil

_DONE = False


def register_all_models() -> None:
    global _DONE
    if _DONE:
        return
    from max.pipelines.lib.registry import PIPELINE_REGISTRY

    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not info.ispkg or info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        for arch in getattr(mod, "ARCHITECTURES", ()):
            PIPELINE_REGISTRY.register(arch, allow_override=True)
    _DONE = True
