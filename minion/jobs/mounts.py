"""A worker's data mounts: datastore and cache paths confined to their roots, then given to podman.

The confinement is minion/datastores' own (docs/datastores.md): the datastore ROOT is mounted once per
node at ContainerSettings.datastore_dir/NAME (mount_root, from the DatastoreAccess the control plane sent;
a root an operator mounted there already is used as it is), the job's path is resolved inside it with
open_in_root (symlinks cannot climb out) and bind-mounted through the checked descriptor onto a directory
of the worker's own (WORKER_DIR/mounts/N). podman then binds that directory, never a path string of the
job's, so nothing outside the root can reach the container. `cache` mounts use the same two steps with
the region cache directory as the root."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from contracts.errors import RigbaseError
from contracts.jobs import OUTPUT_PATH, DatastoreAccess, Mount, MountSource, UserNamespace
from minion.datastores.mounts import DatastoreMount, bind_job_path, is_mountpoint, mount_root, umount
from minion.jobs.objects import ObjectCache, ObjectUnavailable, ObjectWait
from minion.settings import ContainerSettings


class MountRefused(Exception):
    """A mount cannot be made; the message says why and what to do."""


@dataclass(frozen=True)
class Bound:
    host: Path  # the worker's own directory with the confined path bound onto it
    target: str  # where the container sees it
    read_only: bool

    def volume(self) -> str:
        return f"{self.host}:{self.target}:{'ro' if self.read_only else 'rw'}"


def _object_root(mount: Mount, objects: ObjectCache | None, progress: Callable[[str], None] | None) -> Path:
    if objects is None:
        raise MountRefused("this minion has no object cache: run it with `minion run`")
    assert mount.object_id is not None and mount.digest is not None  # the contract's validator

    def show(done: int, total: int) -> None:
        if progress is not None:
            share = done * 100 // max(total, 1)
            progress(f"fetching {mount.name or mount.object_id}: {share} % of {total} bytes")

    try:
        return objects.ensure(mount.object_id, mount.digest, show, name=mount.name or "")
    except ObjectWait:
        raise  # the worker waits (Worker._bind_when_room)
    except ObjectUnavailable as exc:
        raise MountRefused(str(exc)) from None


def _root_of(
    mount: Mount,
    settings: ContainerSettings,
    access: dict[str, DatastoreAccess],
    objects: ObjectCache | None,
    progress: Callable[[str], None] | None,
) -> Path:
    if mount.source_kind is MountSource.OBJECT:
        return _object_root(mount, objects, progress)
    if mount.source_kind is MountSource.CACHE:
        if not settings.cache_dir.is_dir():
            raise MountRefused(f"the region cache {settings.cache_dir} does not exist on this node")
        return settings.cache_dir
    name = mount.datastore or ""
    staging = settings.datastore_dir / name
    ds = access.get(name)
    if ds is not None:
        datastore = DatastoreMount(ds.name, ds.type, ds.address, ds.root, ds.username, ds.password)
        mount_root(datastore, staging)
    elif not is_mountpoint(staging):
        raise MountRefused(
            f"datastore {name} is not mounted at {staging} and the control plane sent no access for it"
        )
    return staging


def _give_to(host: Path, userns: UserNamespace) -> None:
    """A writable path the node's root holds becomes the job's container root's, so a job in its user
    namespace can write its output there. Only the directory itself, never what is in it; a path another
    uid holds stays as it is (another account's output is not taken over: the job cannot write there)."""
    held = host.stat()
    if held.st_uid == 0:
        try:
            os.chown(host, userns.first, userns.first if held.st_gid == 0 else held.st_gid)
        except PermissionError:  # a root_squash NFS export: the node's root is the server's nobody there
            raise MountRefused(
                "the datastore server refuses to give this directory to the job's user; export it with "
                "all_squash,anonuid=UID,anongid=GID owned by that user (docs/datastores.md)"
            ) from None


def bind_all(
    mounts: list[Mount],
    worker_dir: Path,
    settings: ContainerSettings,
    access: dict[str, DatastoreAccess],
    userns: UserNamespace | None = None,
    objects: ObjectCache | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Bound]:
    """Every mount of a worker bound under WORKER_DIR/mounts; all or none (a failure undoes the rest).
    Without a mount at /opt/ml/output the worker gets its own empty directory there (WORKER_DIR/output),
    so a job can always write its results where the format says. `progress` is told how an object's
    fetch goes."""
    bound: list[Bound] = []
    if not any(m.target == OUTPUT_PATH for m in mounts):
        own = worker_dir / "output"
        own.mkdir(exist_ok=True, mode=0o755)
        if userns is not None:
            _give_to(own, userns)
        bound.append(Bound(own, OUTPUT_PATH, read_only=False))
    try:
        for number, mount in enumerate(mounts):
            root = _root_of(mount, settings, access, objects, progress)
            host = worker_dir / "mounts" / str(number)
            if not is_mountpoint(host):
                bind_job_path(root, mount.path, host, read_only=mount.read_only)
                if userns is not None and not mount.read_only:
                    _give_to(host, userns)
            bound.append(Bound(host, mount.target, mount.read_only))
    except ObjectWait:
        unbind_all(worker_dir)
        raise
    except (RigbaseError, OSError, MountRefused) as exc:
        unbind_all(worker_dir)
        what = (
            mount.name
            if mount.source_kind is MountSource.OBJECT
            else f"{mount.datastore or 'cache'}:{mount.path}"
        )
        raise MountRefused(f"mount {what} → {mount.target}: {exc}") from None
    return bound


def unbind_all(worker_dir: Path) -> None:
    """Undo bind_all (also after a restart: whatever is still mounted under WORKER_DIR/mounts)."""
    base = worker_dir / "mounts"
    if not base.is_dir():
        return
    for host in sorted(base.iterdir()):
        umount(host)
        try:  # rmdir, never rmtree: a directory that is still a mount must not lose the datastore's files
            host.rmdir()
        except OSError:
            pass
