"""Turn a datastore and a job's path into mounts on the node, and run them.

Two stages, so the root can never be left:
1. the datastore ROOT is mounted once per node at a staging directory (NFS v4 or SMB via cifs); the
   server itself then refuses anything above the root (for NFS: export only the root, see
   docs/datastores.md);
2. the job's path is resolved *inside* that mount with `open_in_root` (symlinks cannot climb out) and
   bind-mounted onto the job's target through the returned descriptor (/proc/self/fd/N).

SMB credentials go into a 0600 file that only `mount.cifs` reads (`credentials=`); the password is
never on a command line (visible in /proc/*/cmdline to every local user) and the file is removed as
soon as the mount call returns.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from contracts.errors import Unavailable
from contracts.regional import DatastoreType, check_datastore, normalize_root
from minion.datastores.paths import open_in_root

# vers=4 lets mount.nfs negotiate the highest 4.x the server offers (4.2 → 4.1 → 4.0); hard + long
# timeo keep a training job blocked (not corrupted) through a server restart; nosuid/nodev because the
# files belong to the datastore's owners, not to this node.
NFS_OPTIONS = ("vers=4", "proto=tcp", "hard", "timeo=600", "retrans=2", "noresvport", "nosuid", "nodev")
# SMB 3.1.1 (encryption and pre-auth integrity). The server decides who may do what, as the datastore's
# user: noperm, because a customer's container runs as its account's host uid (never 0), which the
# mount's uid=0 files would otherwise shut out on the node itself. Only the node's root reaches the
# staging directory; a job sees only the path bound into its container.
SMB_OPTIONS = (
    "vers=3.1.1", "uid=0", "gid=0", "file_mode=0660", "dir_mode=0770", "noperm", "nosuid", "nodev",
)  # fmt: skip
CREDENTIALS_DIR = Path("/run/rigbase/credentials")


@dataclass(frozen=True)
class DatastoreMount:
    """A regional datastore as the node receives it (password already unsealed, in memory only)."""

    name: str
    type: DatastoreType
    address: str
    root: str
    username: str | None = None
    password: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "type", DatastoreType(self.type))
        check_datastore(self.name, self.type, self.root, self.username, self.password)

    def __repr__(self) -> str:  # never print the password
        return (
            f"DatastoreMount(name={self.name!r}, type={self.type.value!r}, address={self.address!r}, "
            f"root={self.root!r})"
        )


@dataclass(frozen=True)
class MountSpec:
    """One `mount -t FSTYPE -o OPTIONS SOURCE TARGET`; `credentials` is written to a 0600 file, never argv."""

    source: str
    target: Path
    fstype: str
    options: tuple[str, ...]
    credentials: str | None = None

    def argv(self, credentials_file: Path | None = None) -> list[str]:
        options = list(self.options)
        if self.credentials is not None:
            if credentials_file is None:
                raise ValueError("this mount needs its credentials file")
            options.append(f"credentials={credentials_file}")
        return ["mount", "-t", self.fstype, "-o", ",".join(options), self.source, str(self.target)]


def root_mount_spec(ds: DatastoreMount, staging: Path) -> MountSpec:
    """The mount of the datastore's root at `staging` (stage 1)."""
    root = normalize_root(ds.root)
    if ds.type is DatastoreType.NFS:
        return MountSpec(f"{ds.address}:{root}", staging, "nfs4", NFS_OPTIONS)
    share_path = "/".join(root.parts[1:])  # "share/dir": cifs takes //server/share/dir
    credentials = f"username={ds.username}\npassword={ds.password}\n"
    return MountSpec(f"//{ds.address}/{share_path}", staging, "cifs", SMB_OPTIONS, credentials)


@contextmanager
def credentials_file(content: str, directory: Path = CREDENTIALS_DIR) -> Iterator[Path]:
    """A file only root can read, created 0600 from the start (no chmod window), removed afterwards."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / f"cred-{os.getpid()}-{os.urandom(4).hex()}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(content)
        yield path
    finally:
        path.unlink(missing_ok=True)


def _run(argv: list[str], what: str, **kwargs: object) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise Unavailable(
            f"{what} failed ({proc.stderr.strip() or proc.returncode}); "
            "check the datastore server and try again"
        )


def is_mountpoint(path: Path) -> bool:
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo") as info:
        return any(line.split()[4] == target for line in info)


def mount_root(ds: DatastoreMount, staging: Path, credentials_dir: Path = CREDENTIALS_DIR) -> MountSpec:
    """Stage 1: mount the datastore root at `staging` unless it already is."""
    spec = root_mount_spec(ds, staging)
    if is_mountpoint(staging):
        return spec
    staging.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # the node's root only (noperm above)
    staging.mkdir(exist_ok=True)
    if spec.credentials is None:
        _run(spec.argv(), f"mounting datastore {ds.name}")
    else:
        with credentials_file(spec.credentials, credentials_dir) as cred:
            _run(spec.argv(cred), f"mounting datastore {ds.name}")
    return spec


def bind_job_path(staging: Path, requested: str, target: Path, *, read_only: bool = False) -> PurePosixPath:
    """Stage 2: bind the job's path (resolved inside the mounted root) onto `target`; returns it.

    The bind source is the O_PATH descriptor from open_in_root, passed to mount(8) as /proc/self/fd/N,
    so what gets mounted is exactly what was checked.
    """
    fd, relative = open_in_root(staging, requested)
    try:
        target.mkdir(parents=True, exist_ok=True)
        _run(["mount", "--bind", f"/proc/self/fd/{fd}", str(target)], f"binding {relative}", pass_fds=(fd,))
        if read_only:
            _run(["mount", "-o", "remount,bind,ro", str(target)], f"making {target} read-only")
    finally:
        os.close(fd)
    return relative


def umount(target: Path) -> None:
    """Unmount a job's bind or a staging root; an already-unmounted path is fine (idempotent)."""
    if is_mountpoint(target):
        _run(["umount", str(target)], f"unmounting {target}")
