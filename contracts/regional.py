"""Regional shapes both sides of the heartbeat use: storage modes, reservation protocols, datastore types
and the state a node reports for a reservation it serves (docs/reservations.md, docs/datastores.md), and the
string rules of datastore roots, which the control plane checks when an operator adds a datastore and
the node applies again before it mounts one."""

from __future__ import annotations

from enum import StrEnum
from pathlib import PurePosixPath

from contracts.errors import InvalidInput


class StorageMode(StrEnum):
    LOCAL = "local"  # each compute node keeps job data on its own SATA drives
    CENTRAL = "central"  # one storage node serves the region over >= 10 GbE


class Protocol(StrEnum):
    TCP = "tcp"
    UDP = "udp"


class DatastoreType(StrEnum):
    NFS = "nfs"
    SMB = "smb"


class ReportedState(StrEnum):
    """The node's observed state of one reservation (an observation, recomputed on every apply)."""

    PUBLISHED = "published"  # HOST.local answers with the node's LAN address; UPnP off or not needed
    MAPPED = "mapped"  # published, and the router forwards external PORT to node:PORT
    CONFLICT = "conflict"  # another host already answers for HOST.local; we stay silent
    ERROR = "error"  # something failed; `reason` says what (UPnP 718/606, no IGD, bad address…)


# ---- datastore roots and paths: the string rules the control plane and the node both apply
# (docs/datastores.md)

MAX_PATH = 4096
EXAMPLE = "give it from the datastore root, e.g. /subdir2"


def requested_parts(requested: str) -> list[str]:
    """The components of a job's requested path, validated; `/`, `` and `.` all mean the root."""
    if "\x00" in requested:
        raise InvalidInput(f"the datastore path contains a NUL byte; {EXAMPLE}")
    if len(requested.encode()) > MAX_PATH:
        raise InvalidInput(f"the datastore path is longer than {MAX_PATH} bytes; use a shorter path")
    parts = [p for p in requested.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidInput(f"the datastore path {requested!r} contains '..'; {EXAMPLE}")
    return parts


def check_one_line(what: str, value: str) -> str:
    """No control characters (newline, tab, escape…) in a root or an address: they would end up in
    mount options, fstab-like files and one-line listings, where a newline forges a second line."""
    if not value.isprintable():
        raise InvalidInput(
            f"the {what} {value!r} contains a control character: remove it", code="invalid_text"
        )
    return value


def normalize_root(root: str) -> PurePosixPath:
    """A datastore root as configured: absolute, printable, no `..` (`/` exposes the whole share)."""
    check_one_line("datastore root", root)
    if not root.startswith("/"):
        raise InvalidInput(f"the datastore root {root!r} must be an absolute path such as /dir2 or /")
    return PurePosixPath("/", *requested_parts(root))


def join_under_root(root: str, requested: str) -> PurePosixPath:
    """ROOT + requested, as the server sees it: `/dir2` + `/subdir2` → `/dir2/subdir2`."""
    return normalize_root(root).joinpath(*requested_parts(requested))


def check_datastore(
    name: str, kind: DatastoreType, root: str, username: str | None, password: str | None
) -> None:
    """The rules a datastore must pass before a node can mount it, applied verbatim by the control plane
    when an operator adds one and by the node when it receives one: root absolute without `..`, SMB
    needs credentials and a share name, NFS takes none, credentials are one line each."""
    normalize_root(root)
    if kind is DatastoreType.SMB and not (username and password is not None):
        raise InvalidInput(f"datastore {name}: SMB needs --username and --password-file")
    if kind is DatastoreType.NFS and (username or password):
        raise InvalidInput(f"datastore {name}: NFS takes no credentials; drop --username/--password-file")
    if any("\n" in (v or "") for v in (username, password)):
        raise InvalidInput(f"datastore {name}: username and password must be one line each")
    if kind is DatastoreType.SMB and normalize_root(root) == PurePosixPath("/"):
        raise InvalidInput(
            f"datastore {name}: an SMB root starts with the share name, e.g. /share or /share/dir"
        )
