"""The debootstrap stage: a Debian bookworm tree, cached under --cache by the inputs that shape it.

Why a cache keyed by inputs: debootstrap plus the kernel's postinst takes minutes, while everything
rigbase adds on top (the minion wheel, units, the installer) changes on every commit. Keying the base
tree by (suite, mirror, package set, debootstrap version) lets a rebuild after a minion change skip it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from image_builder import nvidia
from image_builder.dpkg import package_versions
from image_builder.errors import BuildError

#: Bump when the way the base tree is prepared changes (so old cache entries are not reused).
STAGE_VERSION = 3

DEFAULT_MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"

#: minbase plus what a rigbase node needs at boot; every package is here for a reason.
BASE_PACKAGES: tuple[str, ...] = (
    "linux-image-amd64",  # the kernel that goes into the UKI, and its modules
    "systemd",
    "systemd-sysv",
    "udev",  # init, and the systemd-pcrphase units that extend PCR 11
    "kmod",  # modprobe for udev's coldplug
    "busybox-static",  # the initramfs's shell and tools
    "cryptsetup-bin",  # veritysetup, in the initramfs and for the installer
    "fdisk",
    "e2fsprogs",
    "util-linux",  # the installer lays out NVMe drives
    "tpm2-tools",
    "libtss2-tcti-device0",
    "libtss2-rc0",
    "libtss2-esys-3.0.2-0",  # TPM access
    "python3",
    "python3-cryptography",
    "python3-tpm2-pytss",
    "python3-yaml",  # the minion's runtime
    "python3-ply",  # provides python3-ply-lex-3.10, which debootstrap cannot resolve as a virtual package
    "openssl",  # the banner placeholder derives minion_id from the EK certificate
    "ca-certificates",
    "systemd-resolved",  # DNS from DHCP (networkd), so a bundle's control-plane URL may be a host name
    "dbus",  # systemd-resolved depends on a system bus (a virtual package debootstrap cannot resolve)
    # What the node's own finalize playbook (run locally by the minion; no apt on a node) calls:
    "parted",  # community.general.parted
    "mdadm",  # the scratch RAID0
    "nfs-kernel-server",
    "nfs-common",  # the storage node's region cache export, and NFS mounts of it
    "cifs-utils",  # SMB datastores
    # What the minion runs jobs and inference containers with (minion/jobs/podman.py). debootstrap resolves
    # neither virtual packages nor alternatives, so podman's runtime, monitor, init and network stack are
    # named: crun (the OCI runtime), conmon, catatonit (--init), CNI plugins and iptables for the bridge.
    "podman",
    "crun",
    "conmon",
    "catatonit",
    "golang-github-containers-common",
    "containernetworking-plugins",
    "iptables",
    "nftables",  # the jobs network's narrowing (minion/jobs/network.py)
)

#: Debian's non-free NVIDIA driver stack for real GPU nodes (--with-nvidia; image_builder/nvidia.py).
NVIDIA_PACKAGES: tuple[str, ...] = nvidia.PACKAGES
NVIDIA_COMPONENTS: tuple[str, ...] = nvidia.COMPONENTS


@dataclass(frozen=True)
class RootfsInputs:
    """Everything that determines the base tree's bytes; its hash is the cache key."""

    suite: str = SUITE
    mirror: str = DEFAULT_MIRROR
    packages: tuple[str, ...] = BASE_PACKAGES
    components: tuple[str, ...] = ("main",)
    with_nvidia: bool = False
    nvidia_driver: str | None = None  # the pinned driver version, with --with-nvidia
    debootstrap_version: str = field(default_factory=lambda: debootstrap_version())
    stage_version: int = STAGE_VERSION

    def key(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:24]


def apt_mirror() -> str:
    """The Debian mirror apt uses on this host (deb822 or one-line sources), else deb.debian.org."""
    for path in sorted(Path("/etc/apt").glob("sources.list*")) + sorted(
        Path("/etc/apt/sources.list.d").glob("*")
    ):
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if "Suites: bookworm" in text or " bookworm " in text:
            for line in text.splitlines():
                line = line.strip()
                if line.startswith("URIs:") and line.split()[1].rstrip("/").endswith("/debian"):
                    return line.split()[1].rstrip("/")
                if line.startswith("deb ") and "bookworm " in line:
                    url = [w for w in line.split() if "://" in w]
                    if url and url[0].rstrip("/").endswith("/debian"):
                        return url[0].rstrip("/")
    return DEFAULT_MIRROR


def debootstrap_version() -> str:
    out = subprocess.run(["debootstrap", "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip() or "unknown"


def inputs_for(with_nvidia: bool = False, mirror: str | None = None) -> RootfsInputs:
    packages = BASE_PACKAGES + (NVIDIA_PACKAGES if with_nvidia else ())
    components = NVIDIA_COMPONENTS if with_nvidia else ("main",)
    return RootfsInputs(
        mirror=mirror or apt_mirror(),
        packages=packages,
        components=components,
        with_nvidia=with_nvidia,
        nvidia_driver=nvidia.DRIVER_VERSION if with_nvidia else None,
    )


def chroot(root: Path, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command inside the tree (plain chroot: systemd-nspawn does not work on this kernel)."""
    full_env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "LC_ALL": "C.UTF-8",
        "DEBIAN_FRONTEND": "noninteractive",
    }
    full_env.update(env or {})
    return subprocess.run(
        ["chroot", str(root), *argv], env=full_env, capture_output=True, text=True, check=True
    )


def _debootstrap(inputs: RootfsInputs, target: Path, log: Path, debs: Path) -> None:
    # The NVIDIA stack comes from non-free: debootstrap installs it like any other package.
    debs.mkdir(parents=True, exist_ok=True)
    argv = [
        "debootstrap",
        "--variant=minbase",
        f"--cache-dir={debs.resolve()}",
        f"--components={','.join(inputs.components)}",
        f"--include={','.join(inputs.packages)}",
        inputs.suite,
        str(target),
        inputs.mirror,
    ]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", LC_ALL="C.UTF-8")
    with log.open("w") as fh:
        proc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, check=False)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-5:]
        raise BuildError(
            f"debootstrap failed ({'; '.join(tail)}); check that {inputs.mirror} is reachable and see {log}."
        )


def _trim(root: Path) -> None:
    """Drop what a node never needs at run time: the initramfs-tools image (the UKI carries our own
    initramfs), apt's caches and lists, docs and man pages, and logs carrying build-time timestamps."""
    for pattern in (
        "boot/initrd.img*",
        "var/cache/apt/*.bin",
        "var/cache/apt/archives/*.deb",
        "var/lib/apt/lists/*_*",
        "var/log/*.log",
        "var/log/apt/*",
        "var/cache/debconf/*-old",
        "var/lib/dpkg/*-old",
    ):
        for p in root.glob(pattern):
            if p.is_file() or p.is_symlink():
                p.unlink()
    for d in ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale"):
        path = root / d
        if path.is_dir():
            shutil.rmtree(path)
            path.mkdir()
    for p in (
        root / "var/cache/ldconfig/aux-cache",
        root / "etc/machine-id",
        root / "var/lib/dbus/machine-id",
    ):
        if p.exists() or p.is_symlink():
            p.unlink()
    (root / "etc/machine-id").write_text("")  # systemd generates one per boot on a read-only root
    # __pycache__ from postinst byte-compiling carries timestamps; the stage compiles every tree again into
    # timestamp-free pycs (bytecode.py).
    for pyc in list(root.glob("usr/lib/python3*/**/__pycache__")):
        shutil.rmtree(pyc, ignore_errors=True)


def base_tree(cache: Path, inputs: RootfsInputs, log=print) -> Path:
    """Return the cached base tree for these inputs, making it with debootstrap when missing.

    Built in a temporary sibling and renamed into place, so an interrupted run leaves no half tree that a
    later run would trust.
    """
    entry = cache / "rootfs" / inputs.key()
    tree = entry / "tree"
    if (entry / "done").exists():
        return tree
    entry.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{inputs.key()}.", dir=entry.parent))
    try:
        log(f"debootstrap {inputs.suite} from {inputs.mirror} ({len(inputs.packages)} extra packages) ...")
        started = time.monotonic()
        _debootstrap(inputs, work / "tree", work / "debootstrap.log", cache / "debs")
        if inputs.with_nvidia:  # its modules for the image's kernel, before _trim drops apt's state
            t = time.monotonic()
            facts = nvidia.compile_modules(work / "tree", chroot, log)
            (work / "nvidia-seconds").write_text(f"{time.monotonic() - t:.1f}\n")  # for performance.md
            log(f"NVIDIA {facts.version}: {len(facts.modules)} modules for {facts.kernel}")
        _trim(work / "tree")
        (work / "inputs.json").write_text(json.dumps(asdict(inputs), indent=2, sort_keys=True))
        (work / "packages.txt").write_text(installed_packages(work / "tree"))
        (work / "seconds").write_text(f"{time.monotonic() - started:.1f}\n")  # for the benchmark
        (work / "done").write_text("")
        if entry.exists():
            shutil.rmtree(entry)
        work.rename(entry)
    except BaseException:
        _unmount_below(work)
        shutil.rmtree(work, ignore_errors=True)
        raise
    return tree


def _unmount_below(path: Path) -> None:
    """debootstrap mounts /proc and /sys in the tree; an interrupted run must not rmtree through them."""
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for m in sorted((m for m in mounts if m.startswith(str(path.resolve()) + "/")), reverse=True):
        subprocess.run(["umount", "-l", m], check=False)


def installed_packages(root: Path) -> str:
    """`name version` lines, sorted: read from dpkg's status file so no chroot is needed."""
    return "\n".join(sorted(f"{name} {version}" for name, version in package_versions(root).items())) + "\n"


def simulate_install(
    root: Path,
    packages: tuple[str, ...],
    mirror: str,
    suite: str = SUITE,
    components: tuple[str, ...] = NVIDIA_COMPONENTS,
) -> str:
    """Check that `packages` resolve against `root`'s dpkg state, with apt --simulate on a private apt
    configuration (nothing installed, the host's apt state untouched). Returns apt's plan."""
    with tempfile.TemporaryDirectory(prefix="rigbase-apt-") as tmp:
        t = Path(tmp)
        (t / "lists/partial").mkdir(parents=True)
        (t / "cache/archives/partial").mkdir(parents=True)
        (t / "sources.list").write_text(f"deb {mirror} {suite} {' '.join(components)}\n")
        opts = [
            "-o",
            f"Dir::Etc::SourceList={t / 'sources.list'}",
            "-o",
            "Dir::Etc::SourceParts=/nonexistent",
            "-o",
            f"Dir::State::Lists={t / 'lists'}",
            "-o",
            f"Dir::Cache={t / 'cache'}",
            "-o",
            f"Dir::State::status={root / 'var/lib/dpkg/status'}",
            "-o",
            "APT::Architecture=amd64",
            "-o",
            "Debug::NoLocking=1",
        ]
        up = subprocess.run(["apt-get", *opts, "update"], capture_output=True, text=True, check=False)
        if up.returncode != 0:
            raise BuildError(f"apt-get update against {mirror} failed: {up.stderr.strip()[-200:]}")
        sim = subprocess.run(
            ["apt-get", *opts, "--simulate", "--no-install-recommends", "install", *packages],
            capture_output=True,
            text=True,
            check=False,
        )
        if sim.returncode != 0:
            raise BuildError(
                f"the package set does not resolve: {sim.stdout.strip()[-300:]} {sim.stderr.strip()[-300:]}"
            )
        return sim.stdout
