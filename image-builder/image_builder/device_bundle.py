"""`image-builder device-bundle`: the minion for a Jetson already flashed with JetPack (docs/devices.md
"Installing the minion on JetPack").

A Jetson is not booted from rigbase media: NVIDIA's flashing tools own its boot chain. So the minion
comes as one tar.gz an operator copies to the device and installs with `sudo ./install.sh`:

    rigbase-device/
      install.sh  rigbase-minion.service  bundle.json  jetson.yaml  manifest.json  SHA256SUMS
      opt/rigbase/bin/minion, ansible-*        launchers for /usr/bin/python3.11
      opt/rigbase/lib/python/                  the minion (this repository's wheel, the node packages
                                               only) and its pinned dependencies as aarch64 CPython 3.11
                                               wheels from PyPI, unpacked

CPython 3.11 because rigbase needs 3.11 and its compiled dependencies are built per minor version;
JetPack 6 (Ubuntu 22.04) has python3.11 in its archive, JetPack 5 (Ubuntu 20.04) gets it from the
deadsnakes PPA. tpm2-pytss has no aarch64 wheel: it is left out, so the bundle serves devices that join
with a device key (Xavier); an Orin that attests with its firmware TPM needs tpm2-pytss built on the
device (install.sh says how). The archive is reproducible: the same source, wheels and bundle give the
same bytes (sorted members, SOURCE_DATE_EPOCH times, root ownership)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from image_builder import node_ansible, wheel
from image_builder.errors import BuildError

TOP = "rigbase-device"
PREFIX = "/opt/rigbase"
SITE = f"{PREFIX}/lib/python"
PYTHON = "/usr/bin/python3.11"
PYTHON_VERSION = "3.11"
#: manylinux tags a JetPack 5 (glibc 2.31) and 6 (glibc 2.35) can load, newest first
PLATFORMS = ("manylinux_2_28_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64")
#: not on PyPI as an aarch64 wheel; only a device that attests with a TPM needs it (install.sh says so)
LEFT_OUT = ("tpm2-pytss",)
ELF_AARCH64 = 183  # e_machine

UNIT = f"""[Unit]
Description=rigbase minion (device agent: join, heartbeat, inference containers)
Documentation=https://github.com/rigbase/rigbase/blob/main/docs/devices.md
Wants=network-online.target
After=network-online.target

[Service]
# RIGBASE_DEVICE_KEY=1 (no TPM: a device key in the state dir) or RIGBASE_TCTI=device:/dev/tpmrm0,
# written by install.sh from what the device has
EnvironmentFile=/etc/rigbase/minion.env
Environment=RIGBASE_STATE_DIR=/var/lib/rigbase/minion
ExecStart={PREFIX}/bin/minion run --bundle /etc/rigbase/bundle.json
Restart=on-failure
RestartSec=30s
# pinged on every join attempt and heartbeat (minion/watchdog.py): a stuck loop is aborted and restarted
WatchdogSec=5min

[Install]
WantedBy=multi-user.target
"""

INSTALL_SH = f"""#!/bin/sh
# Install the rigbase minion on an NVIDIA Jetson running JetPack 5 or 6 (aarch64). docs/devices.md.
#   sudo ./install.sh [--no-start]      install, enable and start rigbase-minion.service; print the minion_id
#   ./install.sh --root DIR --no-start  install into the tree DIR instead of / (an image being prepared)
set -eu
ROOT=""
START=1
while [ $# -gt 0 ]; do
  case "$1" in
    --root) ROOT="${{2:?--root needs a directory}}"; shift 2 ;;
    --no-start) START=0; shift ;;
    *) echo "install.sh: unknown argument $1 (use --root DIR, --no-start)" >&2; exit 2 ;;
  esac
done
die() {{ echo "install.sh: $*" >&2; exit 1; }}
HERE=$(cd "$(dirname "$0")" && pwd)
PY={PYTHON}
[ -x "$ROOT$PY" ] || die "no Python {PYTHON_VERSION} at $PY: on JetPack 6 run 'apt-get install python3.11'; \\
on JetPack 5 add the deadsnakes PPA first (add-apt-repository ppa:deadsnakes/ppa), then the same"
[ "$(od -An -tu2 -j18 -N2 "$ROOT$PY" | tr -d ' ')" = {ELF_AARCH64} ] || \\
  die "$PY is not an aarch64 program: this bundle is for NVIDIA Jetson (aarch64) only"
(cd "$HERE" && sha256sum --quiet -c SHA256SUMS) || die "files differ from SHA256SUMS: copy the bundle again"
if [ -z "$ROOT" ] && [ "$(id -u)" != 0 ]; then die "run it as root: sudo $0"; fi
rm -rf "$ROOT{PREFIX}.new"
mkdir -p "$ROOT{PREFIX}.new"
cp -a "$HERE{PREFIX}/." "$ROOT{PREFIX}.new/"
rm -rf "$ROOT{PREFIX}.old"
[ ! -e "$ROOT{PREFIX}" ] || mv "$ROOT{PREFIX}" "$ROOT{PREFIX}.old"
mv "$ROOT{PREFIX}.new" "$ROOT{PREFIX}"
rm -rf "$ROOT{PREFIX}.old"
install -D -m 0644 "$HERE/jetson.yaml" "$ROOT/usr/share/rigbase/jetson.yaml"
install -D -m 0600 "$HERE/bundle.json" "$ROOT/etc/rigbase/bundle.json"
install -d -m 0700 "$ROOT/var/lib/rigbase/minion"
install -D -m 0644 "$HERE/rigbase-minion.service" "$ROOT/etc/systemd/system/rigbase-minion.service"
mkdir -p "$ROOT/usr/local/bin"
ln -sf {PREFIX}/bin/minion "$ROOT/usr/local/bin/minion"
if [ -e "$ROOT/dev/tpmrm0" ]; then
  echo "RIGBASE_TCTI=device:/dev/tpmrm0" > "$ROOT/etc/rigbase/minion.env"
  if ! "$ROOT$PY" -c "import sys; sys.path.insert(0, '{SITE}'); import tpm2_pytss" 2>/dev/null; then
    echo "install.sh: this device has a TPM; build tpm2-pytss for it before the minion can attest:" >&2
    echo "  apt-get install libtss2-dev python3.11-dev" >&2
    echo "  python3.11 -m pip install --target {SITE} tpm2-pytss" >&2
  fi
else
  echo "RIGBASE_DEVICE_KEY=1" > "$ROOT/etc/rigbase/minion.env"
fi
chmod 0644 "$ROOT/etc/rigbase/minion.env"
echo "installed {PREFIX} ($(cat "$ROOT/etc/rigbase/minion.env"))"
if [ -z "$ROOT" ]; then
  set -a; . /etc/rigbase/minion.env; set +a
  RIGBASE_STATE_DIR=/var/lib/rigbase/minion {PREFIX}/bin/minion id --qr || true
  if [ "$START" = 1 ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    systemctl enable --now rigbase-minion.service
    echo "rigbase-minion.service started: journalctl -u rigbase-minion -f"
  fi
fi
"""


def requirements() -> list[str]:
    return [r for r in wheel.pinned_requirements() if not r.lower().startswith(LEFT_OUT)]


def aarch64_wheelhouse(cache: Path, log: Callable[[str], None] = print) -> Path:
    """The pinned dependencies as aarch64 CPython 3.11 wheels from PyPI, cached by the pinned set."""
    reqs = requirements()

    def fill(work: Path) -> None:
        log(f"pip download {len(reqs)} aarch64 wheels ...")
        platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
        wheel.pip(
            "download",
            "-q",
            "--only-binary=:all:",
            *platforms,
            *("--python-version", PYTHON_VERSION, "--implementation", "cp", "-d", str(work)),
            *reqs,
        )

    return wheel.cached_wheelhouse(
        cache,
        "wheelhouse-aarch64",
        "\n".join(reqs) + "\naarch64-cp311",
        fill,
        what="pip download of the aarch64 wheels",
        hint="check that PyPI is reachable",
    )


def foreign_libraries(site: Path) -> list[str]:
    """Shared objects in `site` that are not aarch64 ELF files (must be none)."""
    bad = []
    for so in sorted(site.rglob("*.so*")):
        head = so.read_bytes()[:20]
        if head[:4] != b"\x7fELF" or int.from_bytes(head[18:20], "little") != ELF_AARCH64:
            bad.append(str(so.relative_to(site)))
    return bad


def _stage(
    stage: Path, whl: Path, house: Path, region_bundle: Path, catalogue: Path, epoch: int
) -> dict[str, Any]:
    site = stage / SITE.lstrip("/")
    wheel.unpack_node_packages(whl, site)
    wheel.unpack_dependencies(house, site)
    bad = foreign_libraries(site)
    if bad:
        raise BuildError(f"not aarch64: {', '.join(bad[:3])}; clear the aarch64 wheelhouse in the cache")
    bin_dir = stage / PREFIX.lstrip("/") / "bin"
    bin_dir.mkdir(parents=True)
    scripts = node_ansible.console_scripts(site, python=PYTHON, site_on_node=SITE)
    scripts["minion"] = node_ansible.launcher("minion.cli", "main", python=PYTHON, site=SITE)
    scripts.update(node_ansible.module_python(python=PYTHON, site=SITE))
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    shutil.copyfile(region_bundle, stage / "bundle.json")
    shutil.copyfile(catalogue, stage / "jetson.yaml")
    (stage / "rigbase-minion.service").write_text(UNIT)
    (stage / "install.sh").write_text(INSTALL_SH)
    (stage / "install.sh").chmod(0o755)
    manifest = {
        "target": {"arch": "aarch64", "python": PYTHON, "abi": "cp311", "platforms": list(PLATFORMS)},
        "wheel": {"file": whl.name, "sha256": _sha256(whl)},
        "python_requirements": requirements(),
        "left_out": list(LEFT_OUT),
        "python_wheels": {p.name: _sha256(p) for p in sorted(house.glob("*.whl"))},
        "source_date_epoch": epoch,
    }
    (stage / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    files = sorted(p for p in stage.rglob("*") if p.is_file() and p.name != "SHA256SUMS")
    sums = "".join(f"{_sha256(p)}  ./{p.relative_to(stage)}\n" for p in files)
    (stage / "SHA256SUMS").write_text(sums)
    return manifest


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _archive(stage: Path, output: Path, epoch: int) -> None:
    """A reproducible tar.gz of `stage` under TOP/: sorted, fixed times and owners, no gzip name/time."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in [stage, *sorted(stage.rglob("*"))]:
            info = tar.gettarinfo(str(path), arcname=str(Path(TOP) / path.relative_to(stage)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "root", "root"
            if path.is_file():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    with tmp.open("wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=epoch) as gz:
        gz.write(buffer.getvalue())
    tmp.replace(output)


def build(
    *,
    repo: Path,
    region_bundle: Path,
    output: Path,
    cache: Path,
    epoch: int,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Write the device bundle to `output` (a .tar.gz); its manifest, with the archive's digest."""
    from contracts.bundle import BundleError, read_bundle

    try:
        enrollment = read_bundle(region_bundle)
    except BundleError as exc:
        raise BuildError(exc.message) from None
    catalogue = repo / "regions" / "jetson.yaml"
    house = aarch64_wheelhouse(cache, log)
    with tempfile.TemporaryDirectory(prefix="rigbase-device-bundle-") as tmp:
        log("pip wheel of this repository ...")
        whl = wheel.build_wheel(repo, Path(tmp) / "wheel", epoch)
        stage = Path(tmp) / TOP
        stage.mkdir()
        manifest = _stage(stage, whl, house, region_bundle, catalogue, epoch)
        _archive(stage, output, epoch)
    return manifest | {
        "output": str(output),
        "sha256": _sha256(output),
        "bytes": output.stat().st_size,
        "region": enrollment.region,
    }
