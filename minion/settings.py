"""The minion's settings: every `RIGBASE_*` variable it reads, read once per `minion` command.

minion/cli.py's callback loads `MinionSettings.from_env()` into the command's context and each command
passes what it needs down (state directory, GPU catalogue, LAN address); no other module reads the
environment. `--bundle`, `--join-token` and `--tcti` take their defaults from RIGBASE_BUNDLE,
RIGBASE_JOIN_TOKEN and RIGBASE_TCTI through the CLI framework's own `envvar=` (shown in `--help`).
Standard library only: the minion ships onto nodes with pinned wheels. The table: docs/join-protocol.md,
"Settings"."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

_T = TypeVar("_T")

BUNDLE_ENV = "RIGBASE_BUNDLE"
JOIN_TOKEN_ENV = "RIGBASE_JOIN_TOKEN"
TCTI_ENV = "RIGBASE_TCTI"
STATE_DIR_ENV = "RIGBASE_STATE_DIR"
GPU_CATALOGUE_ENV = "RIGBASE_GPU_CATALOGUE"
LAN_ADDRESS_ENV = "RIGBASE_LAN_ADDRESS"
ANSIBLE_COLLECTIONS_ENV = "RIGBASE_ANSIBLE_COLLECTIONS"
EVENT_LOG_ENV = "RIGBASE_EVENT_LOG"

DEFAULT_STATE_DIR = Path("/var/lib/rigbase/minion")
# Where community.general (the chroot connection, parted, filesystem) is looked for, first hit wins: the
# venv's, unpacked by scripts/install-deps.sh (a development checkout, the lab), then the boot image's.
ANSIBLE_COLLECTIONS_SEARCH = (
    Path(sys.prefix) / "ansible-collections",
    Path("/usr/lib/rigbase/ansible-collections"),
)
# The firmware's TCG event log as the kernel exposes it; sent with every quote (docs/join-protocol.md,
# "Boot path (PCR 4)"). Absent on machines without a firmware TPM log (the lab's swtpm nodes).
DEFAULT_EVENT_LOG = Path("/sys/kernel/security/tpm0/binary_bios_measurements")


class CommandContext(Protocol):
    """The part of a Typer/Click context `MinionSettings.of` uses (no CLI import here)."""

    def find_object(self, object_type: type[_T]) -> _T | None: ...


@dataclass(frozen=True)
class MinionSettings:
    """What the environment decides for one `minion` command; the defaults are a node's."""

    # ak.json, node.json, status.json (minion/join/state.py); `--state-dir` wins
    state_dir: Path = DEFAULT_STATE_DIR
    # the GPU catalogue file; None: the source tree's, then the installed one (minion/hardware/catalogue.py)
    gpu_catalogue: Path | None = None
    # the address mDNS answers from; None: the one the kernel routes mDNS multicast out of
    lan_address: str | None = None
    # the TCG event log sent with each quote; a missing or unreadable file means none is sent
    event_log: Path = DEFAULT_EVENT_LOG
    # the Ansible collections finalize runs with (minion/finalize/runner.py); None: ANSIBLE_COLLECTIONS_SEARCH
    ansible_collections: Path | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> MinionSettings:
        """Unset and empty variables both mean the default."""
        state_dir = environ.get(STATE_DIR_ENV)
        catalogue = environ.get(GPU_CATALOGUE_ENV)
        event_log = environ.get(EVENT_LOG_ENV)
        return cls(
            state_dir=Path(state_dir) if state_dir else DEFAULT_STATE_DIR,
            gpu_catalogue=Path(catalogue) if catalogue else None,
            lan_address=environ.get(LAN_ADDRESS_ENV) or None,
            event_log=Path(event_log) if event_log else DEFAULT_EVENT_LOG,
            ansible_collections=Path(coll) if (coll := environ.get(ANSIBLE_COLLECTIONS_ENV)) else None,
        )

    @classmethod
    def of(cls, ctx: CommandContext) -> MinionSettings:
        """The settings the `minion` callback loaded for this command. A bare Typer app that registers
        a command module without that callback (tests) gets them from the environment here, once."""
        found = ctx.find_object(cls)
        return found if found is not None else cls.from_env()
