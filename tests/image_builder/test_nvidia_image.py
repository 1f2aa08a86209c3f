"""`image-builder build --with-nvidia` for real (docs/image-builder.md, "The NVIDIA driver"): Debian's
non-free driver at the pinned version, its kernel modules compiled by DKMS at build time for the image's
own kernel, carried on the verity root and named in the signed manifest. `modinfo` reads the modules
from the image's tree: built for that kernel, of that driver.

Slow (debootstrap of the driver's stack, about 600 MB from the Debian mirror, and the compile): its own
target, `make test-nvidia` (docs/testing.md gives its time)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from image_builder import build, manifest, nvidia, rootfs
from image_builder.plan import BuildConfig
from tests.image_builder.conftest import BUNDLE, EPOCH, _cache_dir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]


def _modinfo(tree: Path, field: str, module: str) -> str:
    """The image's own modinfo (kmod in its tree) on one of its modules."""
    return subprocess.run(
        ["chroot", str(tree), "/sbin/modinfo", "-F", field, module],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def test_an_image_with_nvidia_carries_modules_built_for_its_own_kernel(
    tmp_path: Path, source_snapshot: Path
) -> None:
    priv, pub = manifest.keygen(tmp_path / "builder.pem")
    (tmp_path / "bundle.json").write_text(json.dumps(BUNDLE))
    cfg = BuildConfig(
        bundle=tmp_path / "bundle.json", output=tmp_path / "out", cache=_cache_dir(), key=priv,
        source_date_epoch=EPOCH, repo=source_snapshot, targets=("usb",), with_nvidia=True,
    )  # fmt: skip
    started = time.monotonic()
    doc = build.build(cfg, log=print)
    print(f"build --with-nvidia: {time.monotonic() - started:.0f} s")

    tree = rootfs.base_tree(cfg.cache, rootfs.inputs_for(True, cfg.mirror))  # the cached tree the build used
    entry = tree.parent
    print(f"base tree (debootstrap, DKMS building during it) {(entry / 'seconds').read_text().strip()} s; "
          f"the build's own DKMS step {(entry / 'nvidia-seconds').read_text().strip()} s")  # fmt: skip
    driver = doc["nvidia"]
    assert driver["driver"] == nvidia.DRIVER_VERSION == doc["inputs"]["nvidia_driver"]
    kver = driver["kernel"]
    assert kver == nvidia.image_kernel(tree)
    modules = {Path(m).name.split(".ko")[0]: f"/lib/modules/{kver}/{m}" for m in driver["modules"]}
    print("modules:", sorted(modules))
    assert {"nvidia-current", "nvidia-current-uvm", "nvidia-current-modeset"} <= set(modules), modules
    for module in modules.values():
        assert _modinfo(tree, "vermagic", module).split()[0] == kver, module  # built for the image's kernel
    upstream = nvidia.DRIVER_VERSION.split("-")[0]
    assert _modinfo(tree, "version", modules["nvidia-current"]) == upstream
    installed = {p["name"]: p["version"] for p in doc["packages"]}
    assert installed["nvidia-driver"] == installed["nvidia-kernel-dkms"] == nvidia.DRIVER_VERSION
    assert "firmware-nvidia-gsp" in installed and "nvidia-modprobe" in installed  # GSP firmware, /dev nodes
    # signed like any image: the manifest's signature verifies with the builder's key
    signed = manifest.verify(
        (cfg.output / "manifest.json").read_bytes(),
        (cfg.output / "manifest.json.sig").read_bytes(),
        pub.read_bytes(),
    )
    assert signed["nvidia"] == driver and signed["verity"]["root_hash"] in signed["kernel"]["cmdline"]
