"""The NVIDIA driver's build inputs (image_builder/nvidia.py), on small trees: the pin, the image's one
kernel with its headers, the DKMS source. Each refusal is one line saying what to do, before any compile.
The real build, debootstrap and DKMS included, is test_nvidia_image.py (`make test-nvidia`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from image_builder import nvidia, rootfs
from image_builder.errors import BuildError

KVER = "6.1.0-50-amd64"


def _tree(
    root: Path, versions: dict[str, str], kernels: tuple[str, ...] = (KVER,), headers: bool = True
) -> Path:
    status = "\n\n".join(
        f"Package: {name}\nStatus: install ok installed\nVersion: {version}"
        for name, version in versions.items()
    )
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(status + "\n")
    for kver in kernels:
        (root / "lib/modules" / kver).mkdir(parents=True)
        (root / "lib/modules" / kver / "modules.dep").write_text("")
    if headers:
        (root / "usr/src" / f"linux-headers-{KVER}").mkdir(parents=True)
        (root / "usr/src" / f"linux-headers-{KVER}" / "Makefile").write_text("")
    (root / "usr/src/nvidia-current-535.261.03").mkdir(parents=True)
    return root


PINNED = {"nvidia-driver": nvidia.DRIVER_VERSION, "nvidia-kernel-dkms": nvidia.DRIVER_VERSION}


def _refused(root: Path) -> str:
    with pytest.raises(BuildError) as refused:
        nvidia.compile_modules(root, run=lambda *a, **k: pytest.fail("nothing may run"))
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_a_mirror_that_moved_past_the_pin_is_refused(tmp_path: Path) -> None:
    moved = _tree(tmp_path, PINNED | {"nvidia-driver": "550.163.01-1"})
    message = _refused(moved)
    assert f"the mirror has nvidia-driver 550.163.01-1, the build pins {nvidia.DRIVER_VERSION}" in message
    assert "--mirror" in message and "DRIVER_VERSION" in message


def test_a_missing_driver_package_or_headers_or_a_second_kernel_is_refused(tmp_path: Path) -> None:
    assert "nvidia-kernel-dkms did not install" in _refused(
        _tree(tmp_path / "a", {"nvidia-driver": nvidia.DRIVER_VERSION})
    )
    assert f"no headers for the image's kernel {KVER}" in _refused(
        _tree(tmp_path / "b", PINNED, headers=False)
    )
    two = _refused(_tree(tmp_path / "c", PINNED, kernels=(KVER, "6.1.0-49-amd64")))
    assert "exactly one must boot the image" in two


def test_the_inputs_pin_the_driver_and_key_the_cache_by_it() -> None:
    plain, with_driver = (
        rootfs.inputs_for(False, "http://mirror.test/debian"),
        rootfs.inputs_for(True, "http://mirror.test/debian"),
    )
    assert plain.nvidia_driver is None and with_driver.nvidia_driver == nvidia.DRIVER_VERSION
    assert set(nvidia.PACKAGES) <= set(with_driver.packages) and "non-free" in with_driver.components
    assert plain.key() != with_driver.key()


def test_the_driver_read_back_from_a_tree(tmp_path: Path) -> None:
    root = _tree(tmp_path, PINNED)
    assert nvidia.facts_of(_tree(tmp_path / "none", {"linux-image-amd64": "6.1.176-1"})) is None
    dkms = root / "lib/modules" / KVER / "updates/dkms"
    dkms.mkdir(parents=True)
    for name in ("nvidia-current.ko", "nvidia-current-uvm.ko", "nvidia-current-modeset.ko"):
        (dkms / name).write_bytes(b"")
    facts = nvidia.facts_of(root)
    assert facts is not None and facts.manifest() == {
        "driver": nvidia.DRIVER_VERSION,
        "kernel": KVER,
        "modules": [
            "updates/dkms/nvidia-current-modeset.ko",
            "updates/dkms/nvidia-current-uvm.ko",
            "updates/dkms/nvidia-current.ko",
        ],
    }
