"""The package layering of docs/architecture.md: an import never goes to a higher floor.

Every ``import max.<pkg>`` / ``from max.<pkg> ...`` in ``src/max`` (module level or inside a
function) is checked against the floor table below; ``graph`` in particular never imports
``engine``."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "max"

FLOORS = {
    "dtype": 0, "driver": 1, "graph": 2, "engine": 3, "experimental": 4, "interfaces": 5, "torch": 7,
    "nn": 6, "pipelines": 7, "serve": 8, "entrypoints": 9,
}


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
    return [(ln, m) for ln, m in out if m == "max" or m.startswith("max.")]


def test_no_import_goes_up_a_floor():
    bad = []
    for pkg, floor in FLOORS.items():
        for path in sorted((SRC / pkg).rglob("*.py")):
            for ln, mod in _imports(path):
                parts = mod.split(".")
                if len(parts) < 2 or parts[1] not in FLOORS:
                    continue
                if FLOORS[parts[1]] > floor:
                    bad.append(f"{path.relative_to(SRC.parent)}:{ln} ({pkg}, floor {floor}) imports {mod}")
    assert not bad, "imports that go up a floor:\n" + "\n".join(bad)


def test_every_package_has_a_floor():
    pkgs = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert pkgs <= set(FLOORS), f"packages missing from FLOORS (and docs/architecture.md): {pkgs - set(FLOORS)}"
