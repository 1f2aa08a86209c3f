"""`recognise()`: is this machine an NVIDIA Jetson, and which one (the inventory's `device` section).

Everything is read under a host root, like hostfiles.py, so a test (or the lab's simulated device) hands
over a directory holding proc/device-tree/, sys/module/tegra_fuse/, etc/nv_tegra_release, proc/meminfo and
dev/. The decision follows regions/jetson.yaml: the module part number in `compatible` names model and
memory variant; a developer-kit board entry names only the model, and then MemTotal picks the variant;
the SoC entry and the fused chip id must agree with the model. The free-text `model` string is only shown.

A machine whose device tree names no Tegra SoC (every x86 server) is not a Jetson: None. A Tegra whose
model is not in the catalogue raises UnsupportedJetson, whose message names what was found.
"""

from __future__ import annotations

import re
from pathlib import Path

from contracts.catalogue import device_models
from contracts.device import DeviceReport
from minion.hardware import hostfiles, jetson_catalogue
from minion.hardware.jetson_catalogue import JetsonCatalogue, JetsonModel, Soc, Variant

GIB = 2**30
# /proc/device-tree is a link to /sys/firmware/devicetree/base; under a host root mounted elsewhere the
# absolute link dangles, so the link's target is tried too.
_DEVICE_TREE_DIRS = ("/proc/device-tree", "/sys/firmware/devicetree/base")
_CHIP_ID_FILE = "/sys/module/tegra_fuse/parameters/tegra_chip_id"
_RELEASE_FILE = "/etc/nv_tegra_release"
_TEGRA_ENTRY = re.compile(r"nvidia,tegra\d+")
_PART_NUMBER = re.compile(r"p\d{4}-\d{4}")  # "p3767-0005", also as "p3767-0005-super" or after "carrier+"
# "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64, DATE: …"
_RELEASE_LINE = re.compile(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*(\d+)\.(\d+)")


class UnsupportedJetson(ValueError):
    """A Tegra device tree the catalogue does not know, or whose facts contradict each other."""


def recognise(
    host_root: Path | None = None,
    catalogue: JetsonCatalogue | None = None,
    notes: list[str] | None = None,
) -> DeviceReport | None:
    """This machine's Jetson, None when it is not one. `notes` collects what was guessed and why.

    Raises UnsupportedJetson for an unknown or inconsistent Jetson, CatalogueMissing when the
    catalogue cannot be found (only asked for on a Tegra)."""
    notes = notes if notes is not None else []
    compatible = _device_tree_strings(host_root, "compatible")
    if not any(_TEGRA_ENTRY.fullmatch(entry) for entry in compatible):
        return None
    catalogue = catalogue or jetson_catalogue.load(jetson_catalogue.catalogue_path())
    shown = (_device_tree_strings(host_root, "model") or ["(no device-tree model)"])[0]
    soc = _soc(catalogue, compatible, shown)
    chip_id = _chip_id(host_root)
    if chip_id is None:
        chip_id = soc.chip_id
        notes.append(f"{_CHIP_ID_FILE} is unreadable: chip id taken from the device tree ({soc.key})")
    elif chip_id != soc.chip_id:
        raise UnsupportedJetson(
            f"unsupported Jetson model '{shown}': the device tree says {soc.key} (chip id {soc.chip_id:#x}) "
            f"but the fused Tegra chip id is {chip_id:#x}"
        )
    memory_total = hostfiles.memory_total_bytes(host_root)
    model, variant, module = _model_and_variant(catalogue, compatible, memory_total, shown, notes)
    if model.soc.key != soc.key:
        raise UnsupportedJetson(
            f"unsupported Jetson model '{shown}': {model.name} is a {model.soc.key} module but the device "
            f"tree names {soc.key}"
        )
    release = l4t_release(host_root)
    jetpack = catalogue.jetpack.get(release) if release else None
    if release is None:
        notes.append(f"{_RELEASE_FILE} is missing or unreadable: the L4T and JetPack releases are unknown")
    elif jetpack is None:
        notes.append(f"L4T {release} is not in the Jetson catalogue's JetPack table: JetPack unknown")
    return DeviceReport(
        model=model.key,
        model_name=model.name,
        device_tree_model=shown,
        module=module,
        compatible=compatible,
        chip_id=chip_id,
        memory_gib=variant.memory_gib,
        l4t_release=release,
        jetpack=jetpack,
        gpu_cores=variant.gpu_cores,
        dla_count=variant.dla_count,
        tpm=model.tpm,
        video_devices=_device_nodes(host_root, "video"),
        media_devices=_device_nodes(host_root, "media"),
    )


def l4t_release(host_root: Path | None) -> str | None:
    """'R35.4.1' from /etc/nv_tegra_release's first line; None when the file is missing or unlike it."""
    try:
        text = hostfiles.host_path(host_root, _RELEASE_FILE).read_text(errors="replace")
    except OSError:
        return None
    found = _RELEASE_LINE.search(text)
    return f"R{found[1]}.{found[2]}.{found[3]}" if found else None


def _unsupported(shown: str, compatible: list[str], why: str) -> UnsupportedJetson:
    return UnsupportedJetson(
        f"unsupported Jetson model '{shown}' ({why}; compatible: {', '.join(compatible)}); supported "
        f"models: {', '.join(device_models())} (regions/jetson.yaml)"
    )


def _soc(catalogue: JetsonCatalogue, compatible: list[str], shown: str) -> Soc:
    for soc in catalogue.socs.values():
        if soc.compatible in compatible:
            return soc
    raise _unsupported(shown, compatible, "its Tegra SoC is not one of " + ", ".join(catalogue.socs))


def _model_and_variant(
    catalogue: JetsonCatalogue, compatible: list[str], memory_total: int, shown: str, notes: list[str]
) -> tuple[JetsonModel, Variant, str | None]:
    by_module = catalogue.by_module()
    for part in _part_numbers(compatible):
        if part in by_module:
            model, variant = by_module[part]
            if memory_total > variant.memory_gib * GIB:
                # a developer-kit module number on a kit that shipped with more memory (AGX Orin 64 GB)
                bigger = model.variant_for_memory(memory_total)
                if bigger is None:
                    raise _unsupported(shown, compatible, f"{_gib(memory_total)} of memory on module {part}")
                notes.append(
                    f"module {part} is listed with {variant.memory_gib} GiB but MemTotal is "
                    f"{_gib(memory_total)}: recognised as the {bigger.memory_gib} GiB variant"
                )
                variant = bigger
            return model, variant, part
    for model in catalogue.models.values():
        if any(entry in compatible for entry in model.compatible):
            variant_or_none = model.variant_for_memory(memory_total)
            if variant_or_none is None:
                raise _unsupported(shown, compatible, f"no {model.name} variant has {_gib(memory_total)}")
            return model, variant_or_none, None
    raise _unsupported(shown, compatible, "no known module part number or board in its device tree")


def _part_numbers(compatible: list[str]) -> list[str]:
    """Module/board part numbers in the order the tree lists them: 'nvidia,p3768-0000+p3767-0005' gives
    p3768-0000 then p3767-0005 (carrier boards are simply not in the module table)."""
    parts: list[str] = []
    for entry in compatible:
        vendor, _, rest = entry.partition(",")
        if vendor != "nvidia":
            continue
        for piece in rest.split("+"):
            found = _PART_NUMBER.match(piece)
            if found:
                parts.append(found[0])
    return parts


def _device_tree_strings(host_root: Path | None, name: str) -> list[str]:
    """A device-tree string-list property (NUL-separated, NUL-terminated); [] when absent."""
    for directory in _DEVICE_TREE_DIRS:
        path = hostfiles.host_path(host_root, f"{directory}/{name}")
        try:
            raw = path.read_bytes()
        except OSError:
            continue
        return [s for s in raw.decode(errors="replace").split("\0") if s]
    return []


def _chip_id(host_root: Path | None) -> int | None:
    """tegra_fuse prints the id in decimal ("35"); a hex spelling ("0x23") is accepted as well."""
    try:
        text = hostfiles.host_path(host_root, _CHIP_ID_FILE).read_text().strip()
        return int(text, 16) if text.lower().startswith("0x") else int(text, 10)
    except (OSError, ValueError):
        return None


def _device_nodes(host_root: Path | None, prefix: str) -> list[str]:
    """/dev/<prefix>N as the device sees them (no host-root prefix), in numeric order."""
    directory = hostfiles.host_path(host_root, "/dev")
    pattern = re.compile(rf"{prefix}(\d+)")
    try:
        names = [p.name for p in directory.iterdir() if pattern.fullmatch(p.name)]
    except OSError:
        return []
    return [f"/dev/{name}" for name in sorted(names, key=lambda n: int(n[len(prefix) :]))]


def _gib(size: int) -> str:
    return f"{size / GIB:.1f} GiB"
