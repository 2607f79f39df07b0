"""Every program under examples/ runs and exits 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(path: Path) -> None:
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, f"{path.name} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
