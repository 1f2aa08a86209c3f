"""playbooks/storage-node.yml parses as a playbook (a real run needs a GCP VM with local SSDs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

PLAYBOOK = Path(__file__).resolve().parents[3] / "playbooks" / "storage-node.yml"


def test_syntax_check() -> None:
    ansible_playbook = Path(sys.executable).parent / "ansible-playbook"
    proc = subprocess.run(
        [str(ansible_playbook), "--syntax-check", "-i", "localhost,", str(PLAYBOOK)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_play_builds_raid0_mounts_and_exports() -> None:
    (play,) = yaml.safe_load(PLAYBOOK.read_text())
    commands = " ".join(str(t.get("ansible.builtin.command", "")) for t in play["tasks"])
    assert "mdadm --create" in commands and "--level=0" in commands
    assert "mkfs.ext4" in commands
    exports = next(t for t in play["tasks"] if "ansible.builtin.copy" in t and "exports.d" in t["ansible.builtin.copy"]["dest"])
    assert "rigbase_nfs_clients" in exports["ansible.builtin.copy"]["content"]
