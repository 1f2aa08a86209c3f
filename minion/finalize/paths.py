"""Where finalize keeps its files, under the minion's state directory (the state partition on a node):

finalize/lock, finalize/playbook.pid   one run at a time; the play a killed minion left (process.py)
finalize/runner/                       ansible-runner's private data dir: artifacts of the last runs
finalize/bundles/<digest>/             an unpacked playbook bundle (the one being applied)
finalize/saved/work.json, bundle.tgz   the last work applied successfully and its bundle (saved.py)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FinalizePaths:
    state_dir: Path

    @property
    def root(self) -> Path:
        return self.state_dir / "finalize"

    @property
    def lock(self) -> Path:
        return self.root / "lock"

    @property
    def pid_file(self) -> Path:
        return self.root / "playbook.pid"

    @property
    def runner(self) -> Path:
        return self.root / "runner"

    def bundle_dir(self, digest: str) -> Path:
        return self.root / "bundles" / digest

    @property
    def saved_work(self) -> Path:
        return self.root / "saved" / "work.json"

    @property
    def saved_bundle(self) -> Path:
        return self.root / "saved" / "bundle.tgz"
