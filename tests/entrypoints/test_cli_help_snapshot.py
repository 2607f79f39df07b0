"""``max <command> --help`` is pinned to the text captured before the configuration records existed
(tests/entrypoints/help_snapshots/): the flags generated from the config fields must list the same
options, defaults, choices and help as the hand-written ones did.  After adding a flag on purpose, rewrite
the snapshots with ``LIBREMAX_UPDATE_HELP_SNAPSHOTS=1 pytest tests/entrypoints/test_cli_help_snapshot.py`` and
review the diff (only the new flag may appear)."""

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from max.entrypoints.cli import main

SNAPSHOTS = Path(__file__).parent / "help_snapshots"
COMMANDS = ["main", "generate", "serve", "encode", "transcribe", "list", "benchmark"]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_matches_snapshot(command: str) -> None:
    args = ([] if command == "main" else [command]) + ["--help"]
    result = CliRunner().invoke(main, args, terminal_width=100, prog_name="max")
    assert result.exit_code == 0, result.output
    if os.environ.get("LIBREMAX_UPDATE_HELP_SNAPSHOTS"):
        (SNAPSHOTS / f"{command}.txt").write_text(result.output)
    expected = (SNAPSHOTS / f"{command}.txt").read_text()
    assert result.output == expected, f"`max {' '.join(args)}` changed; diff it against {SNAPSHOTS / command}.txt"


def test_snapshots_cover_every_command() -> None:
    assert sorted(main.commands) == sorted(c for c in COMMANDS if c != "main")
