"""The minion, from this repository's own wheel (`pip wheel --no-deps`), unpacked into the root filesystem.

Built from a clean copy of the source files git knows about, so stale build/ output or editor droppings
never reach a node, and the wheel's contents depend only on the source."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from image_builder.errors import BuildError

#: Packages of the distribution that a node runs: the minion, the builder's node files, and the contract the
#: minion shares with the control plane (contracts/); nothing of the control plane.
NODE_PACKAGES = ("contracts/", "minion/", "image_builder/")

#: The minion's third-party imports, pinned to the versions this build host's venv runs its tests with
#: (Debian's python3-pydantic 1.10 / python3-tpm2-pytss 1.2 are too old for the minion).
NODE_REQUIREMENTS = (
    "typer",
    "rich",
    "PyYAML",
    "pydantic",
    "pyudev",
    "zeroconf",
    "miniupnpc",
    "httpx",
    "tpm2-pytss",
    "nvidia-ml-py",
    "cryptography",
    "segno",  # `minion id --qr`: the sticker an operator prints for a device or a server
    "websockets",  # the node's outbound tunnel for job URLs and `job connect` (minion/jobs/tunnel.py)
    # The node runs its own finalize playbook (node_ansible.py): ansible-core and ansible-runner, and their
    # dependencies pinned too, so the wheelhouse does not drift to whatever PyPI has on the build day.
    "ansible-core",
    "ansible-runner",
    "Jinja2",
    "MarkupSafe",
    "packaging",
    "resolvelib",
    "pexpect",
    "ptyprocess",
    "python-daemon",
    "lockfile",
)

#: Where the dependency wheels go on the node; /usr/local/bin/minion puts it first on sys.path.
NODE_SITE = "usr/lib/rigbase/python"


def source_files(repo: Path) -> list[str]:
    out = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        capture_output=True,
        check=False,
    )
    if out.returncode != 0:
        raise BuildError(f"{repo} is not a git checkout; run image-builder from the rigbase repository.")
    return sorted(f for f in out.stdout.decode().split("\0") if f and (repo / f).is_file())


def source_digest(repo: Path) -> str:
    md = hashlib.sha256()
    for f in source_files(repo):
        md.update(f.encode() + b"\0" + (repo / f).read_bytes() + b"\0")
    return md.hexdigest()


def build_wheel(repo: Path, out_dir: Path, epoch: int) -> Path:
    """SOURCE_DATE_EPOCH makes bdist_wheel stamp every zip entry alike, so the wheel's digest is stable."""
    with tempfile.TemporaryDirectory(prefix="rigbase-wheel-") as tmp:
        src = Path(tmp) / "src"
        for f in source_files(repo):
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / f, src / f)
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out_dir), str(src)],
            capture_output=True,
            text=True,
            check=False,
            env=dict(os.environ, SOURCE_DATE_EPOCH=str(max(epoch, 315532800))),
        )
        if proc.returncode != 0:
            raise BuildError(f"pip wheel failed: {proc.stderr.strip()[-300:]}")
    wheels = sorted(out_dir.glob("rigbase-*.whl"))
    if not wheels:
        raise BuildError("pip wheel produced no rigbase wheel.")
    return wheels[-1]


def unpack_node_packages(wheel: Path, site_packages: Path) -> list[str]:
    """Extract the node's packages and the dist-info; returns the extracted member names (sorted)."""
    names: list[str] = []
    with zipfile.ZipFile(wheel) as zf:
        for info in sorted(zf.infolist(), key=lambda i: i.filename):
            n = info.filename
            if info.is_dir() or not (n.startswith(NODE_PACKAGES) or ".dist-info/" in n):
                continue
            dest = site_packages / n
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(zf.read(info))
            names.append(n)
    return names


def pinned_requirements() -> list[str]:
    from importlib.metadata import version

    return [f"{name}=={version(name)}" for name in NODE_REQUIREMENTS]


def cached_wheelhouse(
    cache: Path, kind: str, key_text: str, fill: Callable[[Path], None], *, what: str, hint: str
) -> Path:
    """cache/KIND/KEY, made once by `fill(work_dir)` (pip's arguments end with the directory): a work
    directory renamed into place only when complete, so a failed or killed run never leaves half a
    wheelhouse that a later build would take for done."""
    key = hashlib.sha256(key_text.encode()).hexdigest()[:24]
    house = cache / kind / key
    if (house / "done").exists():
        return house
    house.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=house.parent))
    try:
        fill(work)
        (work / "done").write_text(key_text + "\n")
        shutil.rmtree(house, ignore_errors=True)
        work.rename(house)
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(work, ignore_errors=True)
        raise BuildError(f"{what} failed: {str(exc.stderr).strip()[-300:]}; {hint}") from None
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return house


def pip(*args: str) -> None:
    """`python -m pip ARGS` quietly; CalledProcessError (with stderr) when it fails."""
    subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, check=True)


def dependency_wheelhouse(cache: Path, log: Callable[[str], None] = print) -> Path:
    """Wheels of the minion's dependencies (and theirs), cached by the pinned set: downloaded from PyPI
    once, tpm2-pytss compiled once against this bookworm host's libtss2 (the node runs the same one)."""
    reqs = pinned_requirements()

    def fill(work: Path) -> None:
        log(f"pip wheel {len(reqs)} node dependencies ...")
        pip("wheel", "-q", "--only-binary=:all:", "--no-binary=tpm2-pytss", "-w", str(work), *reqs)

    return cached_wheelhouse(
        cache,
        "wheelhouse",
        "\n".join(reqs) + f"\n{sys.version_info[:2]}",
        fill,
        what="pip wheel of the node's dependencies",
        hint="check that PyPI is reachable and libtss2-dev is installed.",
    )


def unpack_dependencies(house: Path, site: Path) -> list[str]:
    """Unzip every wheel into one directory (a wheel is a zip; .data/purelib and platlib go to the top).
    Sorted, so the tree is the same for the same wheelhouse."""
    names: list[str] = []
    for whl in sorted(house.glob("*.whl")):
        with zipfile.ZipFile(whl) as zf:
            for info in sorted(zf.infolist(), key=lambda i: i.filename):
                n = info.filename
                if info.is_dir():
                    continue
                parts = n.split("/")
                if parts[0].endswith(".data"):
                    if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                        continue  # scripts and headers: the node does not need them
                    n = "/".join(parts[2:])
                dest = site / n
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(zf.read(info))
                if (info.external_attr >> 16) & 0o111:
                    dest.chmod(0o755)
                names.append(n)
    return names
