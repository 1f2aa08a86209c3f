"""The three programs' help reads alike: plain text (no Rich boxes), `-h` beside `--help` on every
group, `--version`, and a first line per command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    "argv",
    [
        ["provision"],
        ["provision", "node"],
        ["image-builder"],
        ["minion"],
        ["minion", "gpu"],
        ["minion", "finalize"],
    ],
)
def test_help_is_plain_with_h_and_the_same_sections(argv: list[str]) -> None:
    out = subprocess.run(
        [str(BIN / argv[0]), *argv[1:], "-h"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "100"},
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.startswith(f"Usage: {' '.join(argv)} [OPTIONS] COMMAND [ARGS]...")
    assert "╭" not in text and "│" not in text and "<bool>" not in text  # Rich's panels and type hints
    assert "-h, --help" in text and "\nOptions:\n" in text and "\nCommands:\n" in text
    if len(argv) == 1:
        assert "--version" in text
