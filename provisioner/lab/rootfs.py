"""Debootstrap'd root filesystems for lab nodes: built once per set of inputs, cloned per node.

A lab node has no disk of its own; the finalize playbook runs into a directory through Ansible's
`community.general.chroot` connection. Building that directory with debootstrap costs ~35 s and a
few hundred requests to the Debian mirror, so the result is cached under
$RIGBASE_HOME/cache/rootfs/<key>/ where <key> hashes every input that changes the result (suite,
variant, extra packages, mirror, architecture, debootstrap's version). Changing an input builds a new
base; the old one stays until `prune` removes it.

Per node we clone the base. Where the filesystem can share blocks (btrfs, xfs: `cp --reflink=always`
works) the whole tree is a copy-on-write copy. Elsewhere (ext4) /usr — three quarters of the root — is
hardlinked and the rest copied: /usr is written only by package managers and Python's bytecode cache,
which all write a new file and rename it over the old name, so the clone's directory entry moves to a
new inode and the base is untouched. /etc, /var, /root and /tmp, where the playbook and services
edit files in place, are always real copies. (A hand-made in-place edit under a clone's /usr would
show through in the base: don't.)

Clones carry a marker file so `remove_root` refuses to delete a directory that isn't one of ours, and
it unmounts anything left mounted inside first (a lab may bind /proc or /dev into a root).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from contracts.errors import InvalidInput, RigbaseError, Unavailable
from provisioner.lab.state import default_home

# written into every clone; remove_root() deletes only directories that carry it
CLONE_MARKER = ".rigbase-lab-root"
# written into a finished base; a build interrupted half-way has none and is rebuilt
COMPLETE_MARKER = ".rigbase-complete"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
APT_SOURCES = (Path("/etc/apt/sources.list.d"), Path("/etc/apt/sources.list"))


@dataclass(frozen=True)
class RootfsSpec:
    """Every input that decides what debootstrap produces. Its hash is the cache key."""

    suite: str = "bookworm"
    variant: str = "minbase"
    # python3 (not python3-minimal): Ansible modules need the full standard library
    include: tuple[str, ...] = ("python3",)
    mirror: str = field(default_factory=lambda: apt_mirror())
    arch: str = field(default_factory=lambda: _dpkg_arch())

    def key(self) -> str:
        data = asdict(self) | {"debootstrap": _debootstrap_version()}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def apt_mirror(suite: str = "bookworm", sources: tuple[Path, ...] = APT_SOURCES) -> str:  # noqa: C901
    """The Debian mirror this machine's apt uses for `suite` (deb822 .sources or one-line .list).

    Labs behind a local mirror or proxy then build roots from the same place the host installs from."""
    files: list[Path] = []
    for src in sources:
        if src.is_dir():
            files += sorted(p for p in src.iterdir() if p.suffix in (".sources", ".list"))
        elif src.is_file():
            files.append(src)
    for path in files:
        text = path.read_text(errors="replace")
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = _deb822(stanza)
                if "deb" in fields.get("types", "").split() and suite in fields.get("suites", "").split():
                    uris = fields.get("uris", "").split()
                    if uris:
                        return uris[0]
        else:
            for line in text.splitlines():
                parts = re.sub(r"\[[^\]]*\]", "", line).split()
                if len(parts) >= 3 and parts[0] == "deb" and parts[2] == suite:
                    return parts[1]
    return DEFAULT_MIRROR


def _deb822(stanza: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in stanza.splitlines():
        if line.startswith("#") or ":" not in line or line[:1].isspace():
            continue
        name, value = line.split(":", 1)
        fields[name.strip().lower()] = value.strip()
    return fields


def _dpkg_arch() -> str:
    try:
        return subprocess.run(
            ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def _debootstrap_version() -> str:
    try:
        out = subprocess.run(["debootstrap", "--version"], capture_output=True, text=True).stdout
    except OSError:
        return "missing"
    return out.strip()


def cache_dir() -> Path:
    return default_home() / "cache" / "rootfs"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One builder per key at a time: a second `lab up` (or a parallel test) waits, then reuses."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_base(
    spec: RootfsSpec | None = None, *, cache: Path | None = None, log: Path | None = None
) -> Path:
    """The cached base root for `spec`, built with debootstrap when missing. Returns its path."""
    spec = spec or RootfsSpec()
    if shutil.which("debootstrap") is None:
        raise Unavailable("debootstrap is not installed; run scripts/install-deps.sh (it installs it).")
    cache = cache or cache_dir()
    key = spec.key()
    base = cache / key
    root = base / "root"
    with _locked(cache / f"{key}.lock"):
        if (base / COMPLETE_MARKER).exists():
            return root
        # a crash mid-build leaves a directory without the marker: start over, never reuse half a root
        if base.exists():
            shutil.rmtree(base)
        partial = cache / f"{key}.partial"
        if partial.exists():
            shutil.rmtree(partial)
        partial.mkdir(parents=True)
        cmd = ["debootstrap", f"--variant={spec.variant}", f"--arch={spec.arch}"]
        if spec.include:
            cmd.append("--include=" + ",".join(spec.include))
        cmd += [spec.suite, str(partial / "root"), spec.mirror]
        log_path = log or cache / f"{key}.log"
        started = time.monotonic()
        with open(log_path, "w") as out:
            proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
            raise Unavailable(
                f"debootstrap of {spec.suite} from {spec.mirror} failed "
                f"({' / '.join(tail)}); see {log_path} and check the mirror is reachable."
            )
        # downloaded .debs and package lists are a quarter of a minbase root and a node needs neither
        # (`apt-get update` restores the lists)
        for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
            shutil.rmtree(partial / "root" / sub, ignore_errors=True)
            (partial / "root" / sub / "partial").mkdir(parents=True, exist_ok=True)
        (partial / "spec.json").write_text(
            json.dumps(asdict(spec) | {"key": key, "build_seconds": round(time.monotonic() - started, 1)})
        )
        (partial / COMPLETE_MARKER).touch()
        partial.rename(base)
    return root


def clone(base: Path, dest: Path) -> Path:
    """A private copy of `base` at `dest` for one lab node (copy-on-write where the filesystem can)."""
    if dest.exists():
        raise RigbaseError(f"{dest} already exists; remove it with remove_root() or pick another node name.")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".cloning")
    if tmp.exists():
        remove_root(tmp, require_marker=False)
    for cmd in _clone_commands(base, tmp):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RigbaseError(
                f"copying the lab root to {dest} failed ({proc.stderr.strip()}); free disk space and retry."
            )
    shutil.copystat(base, tmp)
    (tmp / CLONE_MARKER).write_text(str(base) + "\n")
    tmp.rename(dest)
    return dest


def _clone_commands(base: Path, tmp: Path) -> list[list[str]]:
    """cp invocations that copy `base` to `tmp`: reflink the lot, else hardlink /usr and copy the rest."""
    if _can_reflink(base, tmp.parent):
        return [["cp", "--reflink=always", "-a", str(base), str(tmp)]]
    if os.stat(base).st_dev != os.stat(tmp.parent).st_dev:  # hardlinks can't cross filesystems
        return [["cp", "-a", str(base), str(tmp)]]
    tmp.mkdir()
    return [
        ["cp", "-al" if entry.name == "usr" else "-a", str(entry), str(tmp / entry.name)]
        for entry in sorted(base.iterdir())
    ]


def _can_reflink(base: Path, dest_dir: Path) -> bool:
    """Whether a copy from `base` into `dest_dir` can share blocks (same filesystem that supports it)."""
    probe = dest_dir / ".rigbase-reflink-probe"
    try:
        src = next(p for p in (base / "etc/debian_version", base / "etc/hostname") if p.is_file())
    except StopIteration:
        return False
    ok = subprocess.run(["cp", "--reflink=always", str(src), str(probe)], capture_output=True).returncode == 0
    probe.unlink(missing_ok=True)
    return ok


def node_root(node_name: str, *, home: Path | None = None) -> Path:
    """Where a lab node's root lives under the lab's home."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,62}", node_name):
        raise InvalidInput(f"{node_name!r} is not a valid node name; use lowercase letters, digits and '-'.")
    return (home or default_home()) / "lab" / "roots" / node_name


def root_for_node(
    node_name: str, spec: RootfsSpec | None = None, *, home: Path | None = None, cache: Path | None = None
) -> Path:
    """The node's root, cloned from the cached base the first time. Idempotent."""
    dest = node_root(node_name, home=home)
    if (dest / CLONE_MARKER).exists():
        return dest
    if dest.exists():  # a directory without the marker is a clone that never finished
        remove_root(dest, require_marker=False)
    return clone(ensure_base(spec, cache=cache), dest)


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve()).rstrip("/") + "/"
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        target = line.split()[1].replace("\\040", " ")
        if target.startswith(prefix) or target == prefix[:-1]:
            found.append(target)
    return sorted(found, key=len, reverse=True)  # deepest first


def unmount_under(path: Path) -> None:
    """Unmount everything mounted below `path` (deepest first); refuse when something stays mounted."""
    if not path.exists():
        return
    for target in _mounts_under(path):
        subprocess.run(["umount", "--lazy", target], check=False)
    if _mounts_under(path):
        raise RigbaseError(f"could not unmount everything under {path}; unmount it by hand and retry.")


def remove_root(path: Path, *, require_marker: bool = True) -> None:
    """Delete a lab root: unmount whatever is mounted inside it, then remove the tree."""
    if not path.exists():
        return
    if require_marker and not (path / CLONE_MARKER).exists():
        raise RigbaseError(f"{path} is not a rigbase lab root (no {CLONE_MARKER}); refusing to delete it.")
    unmount_under(path)
    shutil.rmtree(path)


def prune(keep: RootfsSpec | None = None, *, cache: Path | None = None) -> list[Path]:
    """Remove cached bases other than `keep`'s (old suites, an old mirror). Returns what was removed."""
    cache = cache or cache_dir()
    keep_key = (keep or RootfsSpec()).key()
    removed = []
    if cache.exists():
        for entry in sorted(cache.iterdir()):
            if entry.name.split(".")[0] != keep_key:
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
                removed.append(entry)
    return removed
