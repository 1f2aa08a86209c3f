"""The `provision` console script.

httpcore imports trio when it is installed, at import time, for an async backend this synchronous CLI
never uses; trio comes with the test dependencies (selenium), and its import was a fifth of every
command's start (bench/bench_cli.py). The CLI's process marks it absent before anything imports httpx.
Only this process: the control plane and the tests import the packages as they are."""

from __future__ import annotations

import sys


def main() -> None:
    sys.modules.setdefault("trio", None)  # type: ignore[arg-type]  # None: "not installed", for the import system
    from provisioner.cli.main import app

    app()
