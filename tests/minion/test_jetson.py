"""Jetson recognition from a host root built per model (tests/minion/profiles/jetson/*.yaml), the
inventory's `device` section, the catalogue against the contract, and the sticker QR code."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
import zxingcpp
from typer.testing import CliRunner

from contracts.catalogue import device_models
from contracts.device import DeviceReport, DeviceTpm
from minion.cli import app
from minion.hardware import jetson, jetson_catalogue
from minion.hardware.inventory import collect
from minion.hardware.model import Inventory
from minion.sticker import QUIET_ZONE, qr_text
from minion.tpm.identity import minion_id
from provisioner.lab.swtpm import Swtpm

PROFILES = Path(__file__).resolve().parent / "profiles" / "jetson"
_QR = zxingcpp.BarcodeFormats(zxingcpp.BarcodeFormat.QRCode)
CATALOGUE = Path(__file__).resolve().parents[2] / "regions" / "jetson.yaml"
Profile = dict[str, Any]
MakeHost = Callable[..., Path]


def _profile(name: str) -> Profile:
    profile: Profile = yaml.safe_load((PROFILES / f"{name}.yaml").read_text())
    return profile


@pytest.fixture
def make_host(tmp_path: Path) -> MakeHost:
    """A host root as a Jetson's kernel shows it: device tree, fuse chip id, L4T release, meminfo, /dev."""

    def make(profile: Profile, name: str = "host") -> Path:
        root = tmp_path / name
        tree = root / "proc" / "device-tree"
        tree.mkdir(parents=True)
        dt = profile.get("device_tree") or {}
        if "model" in dt:
            (tree / "model").write_bytes(dt["model"].encode() + b"\0")
        if "compatible" in dt:
            (tree / "compatible").write_bytes(b"".join(c.encode() + b"\0" for c in dt["compatible"]))
        if "tegra_chip_id" in profile:
            fuse = root / "sys" / "module" / "tegra_fuse" / "parameters"
            fuse.mkdir(parents=True)
            (fuse / "tegra_chip_id").write_text(profile["tegra_chip_id"] + "\n")
        if "nv_tegra_release" in profile:
            (root / "etc").mkdir()
            (root / "etc" / "nv_tegra_release").write_text(profile["nv_tegra_release"] + "\n")
        (root / "proc" / "meminfo").write_text(
            f"MemTotal:       {profile.get('memtotal_kb', 7802216)} kB\nMemFree:         123456 kB\n"
        )
        (root / "proc" / "cpuinfo").write_text("processor\t: 0\n\nprocessor\t: 1\n")
        (root / "proc" / "sys" / "kernel").mkdir(parents=True)
        (root / "proc" / "sys" / "kernel" / "hostname").write_text("edge-1\n")
        (root / "dev").mkdir()
        for node in profile.get("dev", []):
            (root / "dev" / node).touch()
        return root

    return make


@pytest.mark.parametrize("name", sorted(p.stem for p in PROFILES.glob("*.yaml")))
def test_each_model_is_recognised_with_its_facts(make_host: MakeHost, name: str) -> None:
    profile = _profile(name)
    notes: list[str] = []
    report = jetson.recognise(make_host(profile), notes=notes)
    assert report is not None
    expect = profile["expect"]
    found = report.model_dump(mode="json")
    assert {key: found[key] for key in expect} == expect
    assert report.compatible == profile["device_tree"]["compatible"]
    assert report.device_tree_model == profile["device_tree"]["model"]
    assert notes == []


def test_every_model_has_a_profile() -> None:
    assert sorted(p.stem for p in PROFILES.glob("*.yaml")) == sorted(device_models())


def test_catalogue_matches_the_contract_and_is_consistent() -> None:
    catalogue = jetson_catalogue.load(CATALOGUE)
    assert tuple(catalogue.models) == device_models()
    modules = [m for model in catalogue.models.values() for v in model.variants for m in v.modules]
    assert len(modules) == len(set(modules)), "a module part number may name one variant only"
    assert {s.key: s.chip_id for s in catalogue.socs.values()} == {"tegra194": 0x19, "tegra234": 0x23}
    tpm = {key: model.tpm for key, model in catalogue.models.items()}
    assert tpm == {
        "agx-xavier": DeviceTpm.NONE,
        "xavier-nx": DeviceTpm.NONE,
        "agx-orin": DeviceTpm.FIRMWARE,
        "orin-nx": DeviceTpm.FIRMWARE,
        "orin-nano": DeviceTpm.FIRMWARE,
    }
    for model in catalogue.models.values():
        # each developer kit's own tree is recognised as its model (the lab builds its devices from these)
        assert model.soc.compatible in model.devkit_compatible
        assert model.devkit_model in model.model_strings


def test_agx_orin_devkit_module_with_64_gib_is_the_64_gib_variant(make_host: MakeHost) -> None:
    """The first AGX Orin kits had 32 GB on module p3701-0000; later kits report the same number."""
    profile = _profile("agx-orin")
    profile["device_tree"]["compatible"] = [
        "nvidia,p3737-0000+p3701-0000",
        "nvidia,p3701-0000",
        "nvidia,tegra234",
    ]
    notes: list[str] = []
    report = jetson.recognise(make_host(profile), notes=notes)
    assert report is not None and (report.module, report.memory_gib, report.gpu_cores) == (
        "p3701-0000",
        64,
        2048,
    )
    assert len(notes) == 1 and "MemTotal" in notes[0]
    profile["memtotal_kb"] = 30_536_000  # the 32 GB kit
    report = jetson.recognise(make_host(profile, "kit32"))
    assert report is not None and (report.memory_gib, report.gpu_cores) == (32, 2048)


@pytest.mark.parametrize(
    ("model", "compatible", "chip_id"),
    [
        (
            "NVIDIA Jetson Nano Developer Kit",
            ["nvidia,p3450-0000", "nvidia,jetson-nano", "nvidia,tegra210"],
            "33",
        ),
        ("Acme Orin Box", ["acme,box", "nvidia,p3999-0000+p3767-0099", "nvidia,tegra234"], "35"),
    ],
)
def test_unknown_jetson_is_refused_by_name(
    make_host: MakeHost, model: str, compatible: list[str], chip_id: str
) -> None:
    host = make_host({"device_tree": {"model": model, "compatible": compatible}, "tegra_chip_id": chip_id})
    with pytest.raises(jetson.UnsupportedJetson, match=f"unsupported Jetson model '{model}'") as info:
        jetson.recognise(host)
    assert "orin-nano" in str(info.value)  # it lists what is supported


def test_chip_id_contradicting_the_device_tree_is_refused(make_host: MakeHost) -> None:
    profile = _profile("orin-nx") | {"tegra_chip_id": "25"}
    with pytest.raises(jetson.UnsupportedJetson, match="fused Tegra chip id is 0x19"):
        jetson.recognise(make_host(profile))


def test_missing_release_and_chip_id_are_noted_not_fatal(make_host: MakeHost) -> None:
    profile = {
        k: v for k, v in _profile("xavier-nx").items() if k not in ("nv_tegra_release", "tegra_chip_id")
    }
    notes: list[str] = []
    report = jetson.recognise(make_host(profile), notes=notes)
    assert report is not None and (report.l4t_release, report.jetpack, report.chip_id) == (None, None, 0x19)
    assert len(notes) == 2


@pytest.mark.parametrize(
    "device_tree",
    [
        None,  # an x86 server: no device tree at all
        {"model": "Raspberry Pi 5 Model B Rev 1.0", "compatible": ["raspberrypi,5-model-b", "brcm,bcm2712"]},
    ],
)
def test_a_machine_that_is_no_jetson_is_none(make_host: MakeHost, device_tree: dict[str, Any] | None) -> None:
    assert jetson.recognise(make_host({"device_tree": device_tree})) is None


def test_inventory_carries_the_device_section(make_host: MakeHost) -> None:
    """collect() on a Jetson host root: `device` in the JSON the minion sends at join, read back whole."""
    inventory = collect(make_host(_profile("orin-nano")))
    assert inventory.device is not None and inventory.device.model == "orin-nano"
    document = inventory.to_json()
    assert document["device"]["tpm"] == "firmware" and document["device"]["jetpack"] == "6.2"
    assert Inventory.from_json(json.dumps(document)) == inventory
    # a compute node's inventory says so with null, and older documents without the key still read
    del document["device"]
    assert Inventory.from_json(document).device is None


def test_unknown_jetson_is_a_note_in_the_inventory(make_host: MakeHost) -> None:
    host = make_host({"device_tree": {"model": "Acme", "compatible": ["nvidia,p1-2", "nvidia,tegra234"]}})
    inventory = collect(host)
    assert inventory.device is None
    assert any(note.startswith("unsupported Jetson model 'Acme'") for note in inventory.notes)


def test_the_contract_refuses_what_it_does_not_know() -> None:
    fields = {
        "model": "agx-orin",
        "model_name": "NVIDIA Jetson AGX Orin",
        "device_tree_model": "x",
        "module": None,
        "compatible": ["nvidia,tegra234"],
        "chip_id": 0x23,
        "memory_gib": 64,
        "l4t_release": "R36.3.0",
        "jetpack": "6.0",
        "gpu_cores": 2048,
        "dla_count": 2,
        "tpm": "firmware",
    }
    assert DeviceReport.model_validate(fields).video_devices == []
    for bad in ({"model": "jetson-nano"}, {"l4t_release": "35.4"}, {"tpm": "discrete"}, {"extra": 1}):
        with pytest.raises(ValueError):
            DeviceReport.model_validate(fields | bad)
    with pytest.raises(ValueError, match="not a device node"):
        DeviceReport.model_validate(fields | {"video_devices": ["/etc/passwd"]})


def _decode(text: str) -> list[str]:
    """The text QR code as a grayscale image (4 pixels a module, ink black) through zxing-cpp's reader."""
    halves = {"\u2588": (True, True), "\u2580": (True, False), "\u2584": (False, True), " ": (False, False)}
    lines = text.rstrip("\n").split("\n")
    width = max(len(line) for line in lines)
    rows: list[list[bool]] = []
    for line in lines:
        pairs = [halves[c] for c in line.ljust(width)]
        rows += [[top for top, _ in pairs], [bottom for _, bottom in pairs]]
    scale = 4
    pixels = bytearray()
    for row in rows:
        line_pixels = b"".join((b"\x00" if dark else b"\xff") * scale for dark in row)
        pixels += line_pixels * scale
    image = memoryview(bytes(pixels)).cast("B", (len(rows) * scale, width * scale))
    return [barcode.text for barcode in zxingcpp.read_barcodes(image, formats=_QR)]


def test_qr_text_decodes_to_the_minion_id() -> None:
    value = "0123456789abcdef0123456789abcdef"
    text = qr_text(value)
    lines = text.rstrip("\n").split("\n")
    # version 2 or 3 (25 or 29 modules) plus the quiet zone on both sides, two module rows a line
    assert len(lines[0]) in (25 + 2 * QUIET_ZONE, 29 + 2 * QUIET_ZONE)
    assert len(lines) == (len(lines[0]) + 1) // 2
    assert set(text) <= {"\u2588", "\u2580", "\u2584", " ", "\n"}
    assert _decode(text) == [value]


def test_minion_id_qr_prints_the_id_and_its_code(swtpm: Swtpm) -> None:
    runner = CliRunner()
    plain = runner.invoke(app, ["id", "--qr", "--tcti", swtpm.tcti])
    assert plain.exit_code == 0, plain.output
    first, _, code = plain.output.partition("\n")
    assert first == minion_id(swtpm.tcti)
    assert _decode(code) == [first]
    as_json = runner.invoke(app, ["id", "--qr", "--json", "--tcti", swtpm.tcti])
    answer = json.loads(as_json.output)
    assert answer["minion_id"] == first and answer["qr"] == code
