"""What `minion run` keeps in its state directory (`--state-dir`, else MinionSettings.state_dir:
$RIGBASE_STATE_DIR or /var/lib/rigbase/minion), every file 0600:

- `ak.json`: the AK created under the EK (its private part is wrapped by the EK, so only this TPM can
  load it); kept so continuous attestation quotes with the AK the control plane recorded at join.
- `node.json`: the node credential issued at a successful join, the node id and the control plane URL.
- `status.json`: the join state as last seen (joining, pending, refused, provisioning, maintenance, …)
  and the control plane's message — what the console banner shows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from minion.durable import write_atomic


def write_private(path: Path, data: Any) -> None:
    """Write JSON readable by the owner only, atomically (never world-readable in between) and durably."""
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True).encode())


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class StateDir:
    path: Path

    @property
    def ak_file(self) -> Path:
        return self.path / "ak.json"

    @property
    def node_file(self) -> Path:
        return self.path / "node.json"

    @property
    def status_file(self) -> Path:
        return self.path / "status.json"

    def node(self) -> dict[str, Any] | None:
        data = read_json(self.node_file)
        return data if data and data.get("node_credential") and data.get("node_id") else None

    def save_node(self, data: dict[str, Any]) -> None:
        write_private(self.node_file, data)

    def forget_node(self) -> None:
        self.node_file.unlink(missing_ok=True)

    def status(self) -> dict[str, Any] | None:
        return read_json(self.status_file)

    def save_status(self, state: str, message: str | None = None, **extra: Any) -> None:
        write_private(
            self.status_file,
            {"state": state, "message": message, "at": datetime.now(UTC).isoformat(), **extra},
        )
