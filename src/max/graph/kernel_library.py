"""Custom kernels: the registry behind ``ops.custom`` / ``ops.inplace_custom``.

libremax kernels are Python functions (torch, or Triton launched from torch on
GPUs).  A module registers them with :func:`max.engine.custom.custom_op`; a
path to that module (``.py`` file, package directory, or dotted module name)
is what ``custom_extensions=`` takes, in ``Graph``, ``InferenceSession`` or
``InferenceSession.load``.  Mojo sources and ``.mojopkg`` packages cannot be
compiled here and raise a clear error saying what to do instead.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

MOJO_HELP = (
    "libremax runs custom kernels written in Python, not Mojo. Write the kernel as a torch function "
    "(it may launch a Triton kernel on GPUs), decorate it with "
    "`@max.engine.custom.custom_op(\"<name>\")` in a .py module, and pass that module's path "
    "(or dotted name) in custom_extensions=[...]."
)


@dataclass
class CustomKernel:
    name: str
    fn: Callable[..., Any]
    inplace: bool = False
    source: str = "<python>"
    parameters: tuple = field(default_factory=tuple)


_REGISTRY: dict[str, CustomKernel] = {}


def registered() -> dict[str, CustomKernel]:
    return _REGISTRY


def _import_path(p: Path) -> Any:
    if p.is_dir():
        init = p / "__init__.py"
        if not init.exists():
            mods = sorted(p.glob("*.py"))
            if not mods:
                raise ValueError(f"custom extension {str(p)!r}: the directory holds no .py modules")
            return [_import_path(m) for m in mods]
        p = init
        modname = f"libremax_ext_{p.parent.name}_{abs(hash(str(p.resolve()))) % 10**8}"
    else:
        modname = f"libremax_ext_{p.stem}_{abs(hash(str(p.resolve()))) % 10**8}"
    if modname in sys.modules:
        return sys.modules[modname]
    spec = importlib.util.spec_from_file_location(modname, p, submodule_search_locations=None)
    if spec is None or spec.loader is None:
        raise ValueError(f"custom extension {str(p)!r} is not an importable Python file")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[modname]
        raise
    return mod


def load_extension(ext: Any) -> list[str]:
    """Import one custom extension; returns the names of kernels it registered."""
    before = set(_REGISTRY)
    if isinstance(ext, (str, Path)):
        s = str(ext)
        p = Path(s)
        if p.suffix in (".mojo", ".mojopkg", ".🔥") or (p.is_dir() and any(p.glob("*.mojo"))):
            raise ValueError(f"custom extension {s!r}: {MOJO_HELP}")
        if p.suffix == ".py" or p.is_dir():
            if not p.exists():
                raise ValueError(f"custom extension {s!r} does not exist")
            _import_path(p)
        elif p.exists():
            raise ValueError(f"custom extension {s!r}: expected a .py file, a package directory or a module name")
        else:
            try:
                importlib.import_module(s)
            except ModuleNotFoundError as e:
                raise ValueError(f"custom extension {s!r}: no such file or importable module ({e})") from None
    elif hasattr(ext, "__name__") and type(ext).__name__ == "module":
        pass  # already imported: its decorators ran
    else:
        raise TypeError(f"custom extension must be a path, module name or module, got {type(ext).__name__}")
    return sorted(set(_REGISTRY) - before)


class KernelLibrary:
    """The custom kernels available to a graph (and the extension paths they came from)."""

    def __init__(self, context: Any = None, paths: Iterable[Any] = ()) -> None:
        self._paths: list[Path] = []
        for p in paths:
            self.add_path(p)

    def add_path(self, path: Any) -> None:
        """Load a custom extension (a .py file, package directory or module name)."""
        load_extension(path)
        if isinstance(path, (str, Path)):
            self._paths.append(Path(path))

    def library_paths(self) -> list[Path]:
        return list(self._paths)

    def load_paths(self, context: Any, custom_extensions: Iterable[Any]) -> None:
        for p in custom_extensions:
            self.add_path(p)

    def verify_custom_op(self, custom_op: Any) -> None:
        """Raise ValueError (listing the registered names) when ``custom_op`` names no kernel."""
        name = custom_op if isinstance(custom_op, str) else getattr(custom_op, "name", None)
        if name not in _REGISTRY:
            raise ValueError(unknown_kernel_message(str(name)))

    def __contains__(self, name: str) -> bool:
        return name in _REGISTRY

    def __iter__(self):
        return iter(sorted(_REGISTRY))

    def __len__(self) -> int:
        return len(_REGISTRY)

    def __repr__(self) -> str:
        return f"KernelLibrary({sorted(_REGISTRY)})"


def unknown_kernel_message(name: str) -> str:
    have = sorted(_REGISTRY)
    listing = ", ".join(repr(n) for n in have) if have else "none"
    return (
        f"custom op {name!r} is not registered; registered custom kernels: {listing}. "
        "Register one with @max.engine.custom.custom_op and pass its module in custom_extensions."
    )
