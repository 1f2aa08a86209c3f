"""The lab's state file ($RIGBASE_HOME/lab/state.json) and the processes it records.

`lab up` writes the file before it creates anything and again after every step, so a `lab up` killed
half-way leaves a record `lab down` can follow. Processes are recorded with their start time (field 22
of /proc/PID/stat): a pid reused by an unrelated process after a reboot or a crash is never signalled.

The lab's namespaces have fixed names, so one lab runs per machine; which home it belongs to is kept
in OWNER_PATH, on the same tmpfs as /run/netns (gone together after a reboot). A refusal can then name
the home to run `lab down` with, and a lab whose home was deleted (its state with it) is known for an
orphan that any home's `lab down` may clean.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from contracts.processes import process_start_time, terminate
from provisioner.settings import Settings

STATE_VERSION = 1
OWNER_PATH = Path("/run/rigbase/lab-home")


def default_home() -> Path:
    """The home of the settings this process runs with (the lab runs inside one `provision lab` command;
    its top-level calls get the command's home, see provisioner/cli/lab.py)."""
    return Settings.load().ensure_home()


def lab_dir(home: Path | None = None) -> Path:
    return (home or default_home()) / "lab"


def state_path(home: Path | None = None) -> Path:
    return lab_dir(home) / "state.json"


def claim_machine(home: Path) -> None:
    """Record `home` as the owner of the machine's lab, before the first namespace is made."""
    OWNER_PATH.parent.mkdir(parents=True, exist_ok=True)
    tmp = OWNER_PATH.with_suffix(".tmp")
    tmp.write_text(f"{home.resolve()}\n")  # absolute: read from other directories and other homes
    os.replace(tmp, OWNER_PATH)


def machine_owner() -> Path | None:
    """The home of the lab last brought up on this machine and not yet taken down, if any."""
    try:
        return Path(OWNER_PATH.read_text().strip())
    except FileNotFoundError:
        return None


def release_machine(home: Path) -> None:
    """Forget the owner once its lab is down; another home's record is left alone."""
    if machine_owner() == home.resolve():
        OWNER_PATH.unlink(missing_ok=True)


@dataclass
class Proc:
    """A process the lab started: `kind` (serve, swtpm, minion, miniupnpd, haproxy, postgres), pid and its
    start time."""

    kind: str
    pid: int
    start_time: int | None = None

    @classmethod
    def of(cls, kind: str, pid: int) -> Proc:
        return cls(kind, pid, process_start_time(pid))

    def alive(self) -> bool:
        now = process_start_time(self.pid)
        return now is not None and (self.start_time is None or now == self.start_time)

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM (a minion says goodbye on its way out), SIGKILL after `timeout`."""
        terminate(lambda sig: os.kill(self.pid, sig), self.alive, grace_s=timeout)


def spawn(
    kind: str,
    argv: Sequence[str],
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    pass_fds: Sequence[int] = (),
) -> tuple[Proc, subprocess.Popen[bytes]]:
    """Start one of the lab's processes in a session of its own (it outlives the `lab up` that started
    it), its output appended to `log`; the record to keep, and the process to watch while it starts."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            env=dict(env) if env is not None else None,
            pass_fds=tuple(pass_fds),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Proc.of(kind, proc.pid), proc


@dataclass
class LabNodeRecord:
    """What the lab remembers of one simulated node (its namespace, TPM identity, minion process, root and
    timings) in lab/state.json; the node's lifecycle state is the control plane's, not this."""

    k: int
    name: str
    netns: str
    address: str
    minion_id: str | None = None
    root: str | None = None
    minion: Proc | None = None
    started_at: float | None = None  # when its minion started (epoch seconds)
    added_at: float | None = None  # when the lab added it by minion_id
    ready_at: float | None = None  # when it reached maintenance (a device: active)
    service: str = "compute"  # compute, storage (node-1 of a lab with devices) or device
    profile: str | None = None  # its hardware profile (provisioner/lab/profiles/); None: the GPU node's


@dataclass
class LabState:
    home: str
    upnp: bool = False
    storage_mode: str = "local"  # of region `lab`, fixed when it is created: central for a lab with devices
    namespaces: list[str] = field(default_factory=list)
    lan_members: dict[str, str] = field(default_factory=dict)  # namespace -> LAN address
    host_url: str | None = None  # the control plane on the host's loopback (what `provision …` uses)
    lan_url: str | None = None  # the control plane on the lab LAN (what minions use)
    serve: Proc | None = None
    miniupnpd: Proc | None = None
    # `--control-planes N` > 1 (control_planes.py): a serve per host (host1 …) instead of `serve`, HAProxy
    # in front of them and the PostgreSQL they share
    control_planes: int = 1
    hosts: dict[str, Proc] = field(default_factory=dict)
    haproxy: Proc | None = None
    postgres: Proc | None = None
    # what $RIGBASE_HOME held before the first `lab up`; `lab down` removes every other entry (the
    # control plane's client config, its secret key, Ansible artifacts) except the rootfs cache
    home_entries_before: list[str] = field(default_factory=list)
    nodes: dict[str, LabNodeRecord] = field(default_factory=dict)
    version: int = STATE_VERSION

    def processes(self) -> list[Proc]:
        procs = [p for p in (self.serve, self.miniupnpd, self.haproxy, self.postgres) if p]
        return procs + list(self.hosts.values()) + [n.minion for n in self.nodes.values() if n.minion]

    def save(self) -> None:
        path = state_path(Path(self.home))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2, sort_keys=True))
        os.replace(tmp, path)

    @classmethod
    def load(cls, home: Path) -> LabState | None:
        try:
            data: dict[str, Any] = json.loads(state_path(home).read_text())
        except FileNotFoundError:
            return None
        except ValueError:
            return None  # a torn write: `lab down` still cleans by name
        proc = lambda d: Proc(**d) if d else None  # noqa: E731
        nodes = {
            name: LabNodeRecord(**(n | {"minion": proc(n.get("minion"))}))
            for name, n in data.pop("nodes", {}).items()
        }
        procs = {k: proc(data.get(k)) for k in ("serve", "miniupnpd", "haproxy", "postgres")}
        hosts = {name: Proc(**h) for name, h in data.pop("hosts", {}).items()}
        return cls(**(data | procs | {"hosts": hosts, "nodes": nodes}))
