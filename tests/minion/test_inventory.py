"""Inventory collection: the real pyudev reading umockdev testbeds, plus this machine itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contracts.catalogue import GpuClass
from minion.hardware import catalogue, hostfiles
from minion.hardware.model import FormFactor, InvalidInventory, Inventory
from minion.hardware.units import parse_link_speed, pcie_generation
from tests.fixtures.umockdev import Testbed, load_profile, minion_executable, profile_names

Make = Callable[[Any], Testbed]
Cached = Callable[[str], dict[str, Any]]


def _inventory(testbed: Testbed) -> dict[str, Any]:
    result = testbed.run("inventory", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("name", profile_names())
def test_profile_inventory_matches_the_mocked_hardware(profile_inventory: Cached, name: str) -> None:
    data = profile_inventory(name)
    expect = load_profile(name)["expect"]["inventory"]
    inv = Inventory.from_json(data)
    assert len(inv.gpus) == expect["gpus"]
    assert sorted({g.model for g in inv.gpus}) == expect["models"]
    if "form_factor" in expect:
        assert {g.form_factor for g in inv.gpus} == {FormFactor(expect["form_factor"])}
    if "pcie_gen" in expect:
        assert {g.pcie_gen for g in inv.gpus} == {expect["pcie_gen"]}
    assert len(inv.nvme_drives) == expect["nvme"]
    assert len(inv.sata_drives) == expect["sata"]
    assert (inv.tpm.major_version if inv.tpm.present else None) == expect["tpm"]
    assert (inv.cpu.physical_cores, inv.cpu.threads) == (expect["cores"], expect["threads"])
    assert len(inv.nics) == expect["nics"]
    # The JSON contract: what `minion inventory --json` prints reads back losslessly.
    assert inv.to_json() == data


def test_server_details_come_from_sysfs_catalogue_and_proc(profile_inventory: Cached) -> None:
    inv = Inventory.from_json(profile_inventory("h100-sxm-server"))
    gpu = inv.gpus[0]
    assert (gpu.pci_address, gpu.vendor, gpu.device_id, gpu.driver) == (
        "0000:01:00.0",
        "NVIDIA",
        "2330",
        "nvidia",
    )
    assert gpu.name == "H100 SXM5 80GB" and gpu.vram_bytes == 80 * 2**30
    assert gpu.link.current_width == 16 and gpu.link.max_speed_gts == 32.0
    assert gpu.sources["vram"] == "catalogue" and gpu.sources["link"] == "sysfs"
    # The driver is bound but this machine has no libnvidia-ml: NVML is skipped with a note, not a crash.
    assert any(note.startswith("NVML unavailable") for note in inv.notes)
    nvme = inv.nvme_drives[0]
    assert (nvme.name, nvme.size_bytes, nvme.rotational, nvme.model) == (
        "nvme0n1",
        3840755982336,
        False,
        "SAMSUNG MZQL23T8HCLS",
    )
    assert inv.memory_total_bytes == int(2015.3 * 1024 * 1024) * 1024
    assert inv.hostname == "dgx-h100-01" and inv.cpu.sockets == 2
    assert [n.name for n in inv.nics] == ["eno1", "ens1f0np0", "ens1f1np1"]  # no lo, no br0
    assert all(d.name != "sdd" for d in inv.drives)  # the USB boot stick is not storage


def test_rotation_rate_and_down_links_are_reported(profile_inventory: Cached) -> None:
    inv = Inventory.from_json(profile_inventory("local-two-sata"))
    assert [(d.size_bytes, d.rotational, d.rpm) for d in inv.sata_drives] == [
        (4000787030016, True, 7200),
        (4000787030016, True, 7200),
        (500107862016, False, None),
        (4000787030016, True, 5400),
    ]
    central = Inventory.from_json(profile_inventory("central-1gbe"))
    assert [(n.name, n.speed_mbps, n.link_up) for n in central.nics] == [
        ("eno1", 1000, True),
        ("ens2f0", None, False),
    ]


def test_tpm_version_from_each_kernel_interface(profile_inventory: Cached) -> None:
    sources = {
        name: Inventory.from_json(profile_inventory(name)).tpm
        for name in ("h100-sxm-server", "rtx3090-workstation", "tpm12", "no-tpm")
    }
    assert (sources["h100-sxm-server"].major_version, sources["h100-sxm-server"].source) == (
        2,
        "sysfs tpm_version_major",
    )
    assert (sources["rtx3090-workstation"].major_version, sources["rtx3090-workstation"].source) == (
        2,
        "sysfs tpmrm device",
    )
    assert (sources["tpm12"].major_version, sources["tpm12"].source) == (1, "sysfs caps")
    assert not sources["no-tpm"].present


def _profile(name: str, gpus: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": name,
        "host": {"memory_gib": 64, "sockets": 1, "cores_per_socket": 8},
        "gpus": gpus,
        "nvme": [{"count": 2, "bytes": 1000204886016}],
        "tpm": {"version": 2},
        "nics": [{"name": "eno1", "speed": 10000}],
    }


def test_unknown_and_amd_gpus(umockdev_testbed: Make) -> None:
    inv = Inventory.from_json(
        _inventory(
            umockdev_testbed(
                _profile(
                    "odd-gpus",
                    [
                        {"id": "10de:ffff", "gen": 4, "width": 16},
                        {
                            "id": "1002:740f",
                            "gen": 4,
                            "width": 16,
                            "driver": "amdgpu",
                            "sysfs_vram_bytes": 68702699520,
                        },
                    ],
                )
            )
        )
    )
    unknown, amd = sorted(inv.gpus, key=lambda g: g.vendor, reverse=True)
    assert (unknown.vendor, unknown.name, unknown.model) == ("NVIDIA", "NVIDIA 10de:ffff", "10de:ffff")
    assert unknown.form_factor is FormFactor.UNKNOWN and unknown.vram_bytes is None
    assert any("10de:ffff" in note and "not in the GPU catalogue" in note for note in inv.notes)
    assert (amd.vendor, amd.vram_bytes, amd.sources["vram"], amd.driver) == (
        "AMD",
        68702699520,
        "sysfs",
        "amdgpu",
    )


def test_inventory_table_lists_the_hardware(umockdev_testbed: Make) -> None:
    result = umockdev_testbed("mixed-models").run("inventory")
    assert result.returncode == 0, result.stderr
    for text in (
        "GeForce RTX",
        "RTX A6000",
        "x16/x16",
        "nvme0n1",
        "4.00 TB",
        "HDD 7200 rpm",
        "enp65s0f0",
        "25 Gb/s",
        "tpm0, version 2",
    ):
        assert text in result.stdout


def _sysfs_gpu_count() -> int:
    count = 0
    for device in Path("/sys/bus/pci/devices").iterdir():
        pci_class = (device / "class").read_text().strip()
        vendor = (device / "vendor").read_text().strip()
        count += pci_class.startswith("0x03") and vendor in ("0x10de", "0x1002")
    return count


def test_this_machine_inventory_runs_and_reports_what_sysfs_shows() -> None:
    """No udevd, GPU, NVMe or TPM here: the inventory still runs and says so."""
    result = subprocess.run(
        [str(minion_executable()), "inventory", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    inv = Inventory.from_json(result.stdout)
    assert len(inv.gpus) == _sysfs_gpu_count()
    nvme_class = Path("/sys/class/nvme")
    assert len(inv.nvme_drives) == (len(list(nvme_class.iterdir())) if nvme_class.exists() else 0)
    tpm_class = Path("/sys/class/tpm")
    assert inv.tpm.present == (tpm_class.exists() and any(tpm_class.iterdir()))
    assert inv.cpu.threads == os.cpu_count()
    table = subprocess.run(
        [str(minion_executable()), "inventory"], capture_output=True, text=True, timeout=60, check=False
    )
    assert table.returncode == 0 and "Traceback" not in table.stderr
    assert f"{inv.cpu.threads} threads" in table.stdout


def test_host_root_without_proc_files_is_a_usage_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(minion_executable()), "inventory", "--host-root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--host-root" in result.stderr


def test_cpuinfo_without_topology_counts_threads_as_cores(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text(
        "processor\t: 0\nmodel name\t: vcpu\n\nprocessor\t: 1\nmodel name\t: vcpu\n"
    )
    cpu = hostfiles.cpu(tmp_path)
    assert (cpu.physical_cores, cpu.threads, cpu.sockets, cpu.model) == (2, 2, 1, "vcpu")


def test_from_json_rejects_bad_documents_with_one_sentence() -> None:
    with pytest.raises(InvalidInventory, match="not JSON"):
        Inventory.from_json("{")
    with pytest.raises(InvalidInventory, match="'cpu'"):
        Inventory.from_json({"hostname": "x", "memory_total_bytes": 1, "tpm": {"present": False}})
    with pytest.raises(InvalidInventory, match="kind"):
        Inventory.from_json(
            {
                "hostname": "x",
                "memory_total_bytes": 1,
                "tpm": {"present": False},
                "cpu": {"physical_cores": 1, "threads": 1},
                "drives": [{"name": "sda", "kind": "floppy", "size_bytes": 1}],
            }
        )


@pytest.mark.parametrize(
    ("text", "speed", "generation"),
    [
        ("8.0 GT/s PCIe", 8.0, 3),
        ("16 GT/s", 16.0, 4),
        ("32.0 GT/s PCIe", 32.0, 5),
        ("2.5 GT/s PCIe", 2.5, 1),
        ("Unknown", None, None),
        ("", None, None),
    ],
)
def test_link_speed_parsing(text: str, speed: float | None, generation: int | None) -> None:
    assert parse_link_speed(text) == speed
    assert pcie_generation(speed) == generation


TRAINML_GPU_TYPES = [
    "GTX 1060",
    "RTX 2060 Super",
    "RTX 2070 Super",
    "RTX 2080 Ti",
    "RTX 3090",
    "RTX A4000",
    "RTX A6000",
    "T4",
    "P100",
    "V100",
    "A100 40GB",
    "A100 80GB",
]


def test_catalogue_covers_the_required_gpus_with_sources() -> None:
    entries = catalogue.load()
    assert set(TRAINML_GPU_TYPES) <= {e.model for e in entries.values()}
    names = {e.name for e in entries.values()}
    assert {
        "L4",
        "H100 PCIe",
        "H100 SXM5 80GB",
        "H200 SXM 141GB",
        "A100 PCIe 80GB",
        "A100 SXM4 80GB",
    } <= names
    by_name = {e.name: e for e in entries.values()}
    assert by_name["H100 SXM5 80GB"].form_factor is FormFactor.SXM
    assert by_name["H100 PCIe"].form_factor is FormFactor.PCIE and by_name["H100 PCIe"].pcie_gen == 5
    for entry in entries.values():
        assert set(entry.sources) == {"id", "vram", "class", "form_factor", "pcie_gen"}, entry.name
        # every short reference resolved to a citation from the catalogue's sources table
        assert all(len(text) > 20 for text in entry.sources.values()), entry.name


def test_catalogue_has_current_gpus_with_pci_ids_and_fee_classes() -> None:
    entries = catalogue.load()
    expected = {
        ("10de", "2684"): ("RTX 4090", GpuClass.DEVELOPMENT, FormFactor.PCIE, 24),
        ("10de", "2704"): ("RTX 4080", GpuClass.DEVELOPMENT, FormFactor.PCIE, 16),
        ("10de", "2786"): ("RTX 4070", GpuClass.DEVELOPMENT, FormFactor.PCIE, 12),
        ("10de", "26b9"): ("L40S", GpuClass.DATACENTER, FormFactor.PCIE, 48),
        ("10de", "26b5"): ("L40", GpuClass.DATACENTER, FormFactor.PCIE, 48),
        ("10de", "2236"): ("A10", GpuClass.DATACENTER, FormFactor.PCIE, 24),
        ("10de", "2235"): ("A40", GpuClass.DATACENTER, FormFactor.PCIE, 48),
        ("10de", "26b1"): ("RTX 6000 Ada", GpuClass.PROFESSIONAL, FormFactor.PCIE, 48),
        ("10de", "2321"): ("H100 NVL", GpuClass.DATACENTER, FormFactor.PCIE, 94),
        ("10de", "2901"): ("B200", GpuClass.DATACENTER, FormFactor.SXM, 180),
        ("1002", "740f"): ("MI210", GpuClass.DATACENTER, FormFactor.PCIE, 64),
        ("1002", "740c"): ("MI250/MI250X", GpuClass.DATACENTER, FormFactor.SXM, 128),
        ("1002", "74a1"): ("MI300X", GpuClass.DATACENTER, FormFactor.SXM, 192),
        ("1002", "7448"): ("Radeon Pro W7900", GpuClass.PROFESSIONAL, FormFactor.PCIE, 48),
    }
    for key, (model, gpu_class, form_factor, vram_gib) in expected.items():
        entry = entries[key]
        assert (entry.model, entry.gpu_class, entry.form_factor, entry.vram_gib) == (
            model,
            gpu_class,
            form_factor,
            vram_gib,
        ), key
        assert "pciutils/pciids" in entry.sources["id"], key


def test_unknown_gpu_memory_shows_as_unknown_in_check_json(umockdev_testbed: Make) -> None:
    """Regression: `minion check --json` said ">= 0 GiB RAM (2 x 0 GiB VRAM)" for a GPU of unknown memory;
    the JSON shape stays the same (a string), the text says unknown."""
    testbed = umockdev_testbed(_profile("unknown-vram", [{"id": "10de:ffff", "gen": 4, "width": 16}]))
    result = testbed.run("check", "--json", "--public-jobs")
    rules = {r["rule"]: r for r in json.loads(result.stdout)["rules"]}
    memory = rules["memory-vs-vram"]
    assert (memory["ok"], memory["required"]) == (False, "unknown (2 x VRAM)")
    assert result.returncode == 1, result.stderr


@pytest.mark.parametrize(
    ("name", "model", "gpu_class", "form_factor"),
    [
        ("rtx4090-workstation", "RTX 4090", GpuClass.DEVELOPMENT, FormFactor.PCIE),
        ("mi300x-server", "MI300X", GpuClass.DATACENTER, FormFactor.SXM),
    ],
)
def test_current_gpus_classify_from_the_catalogue(
    profile_inventory: Cached, name: str, model: str, gpu_class: GpuClass, form_factor: FormFactor
) -> None:
    inv = Inventory.from_json(profile_inventory(name))
    assert {(g.model, g.gpu_class, g.form_factor) for g in inv.gpus} == {(model, gpu_class, form_factor)}
    assert all(g.sources["gpu_class"] == "catalogue" for g in inv.gpus)


_WITHOUT_CATALOGUE = """
import sys
from contracts import catalogue
catalogue.CATALOGUE_DIRS = ()  # no catalogue file anywhere, as on an image or a device that ships none
sys.argv = ["minion", *sys.argv[1:]]
from minion.cli import main
main()
"""


def test_the_minion_checks_its_hardware_with_no_catalogue_file_anywhere(umockdev_testbed: Make) -> None:
    """A node without regions/gpus.yaml (a device bundle ships only jetson.yaml) still reports every rule:
    nothing the minion imports reads the catalogue at import, and a missing one is a note, not a crash."""
    testbed = umockdev_testbed("mixed-models")
    argv = [
        sys.executable,
        "-c",
        _WITHOUT_CATALOGUE,
        "check",
        "--json",
        "--host-root",
        str(testbed.host_root),
    ]
    result = subprocess.run(testbed.command(*argv), capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode in (0, 1) and result.stdout, result.stderr
    report = json.loads(result.stdout)
    assert {r["rule"] for r in report["rules"]} >= {"gpu-single-model", "nvme-count", "tpm2"}, report
    assert "contracts.gpu_types" not in result.stderr


def _nvml_recording(path: Path, addresses: list[str], modules: list[int], **facts: Any) -> Path:
    """NVML's answers for GPUs at `addresses` (module ids `modules`), in `minion gpu health --record`'s
    form."""
    gpus = [
        {"index": i, "uuid": f"GPU-{i}", "name": "NVIDIA Future GPU", "pci_bus_id": f"0000{a.upper()}",
         "memory_total": 100 * 2**30, "pcie_gen": 1, "pcie_width": facts.get("width"),
         "pcie_max_gen": facts.get("max_gen"), "pcie_max_width": 16, "module_id": module}
        for i, (a, module) in enumerate(zip(addresses, modules, strict=True))
    ]  # fmt: skip
    path.write_text(json.dumps({"driver_version": "535.261.03", "gpus": gpus, "xids": {}}))
    return path


def test_the_rules_read_nvmls_link_and_form_factor_over_sysfs(umockdev_testbed: Make, tmp_path: Path) -> None:
    """Two GPUs the catalogue does not know, on x4 links as sysfs reads them (a riser's bridge, say):
    NVML's answers, recorded on the node, say x16 at PCIe 3 on PCIe cards, and then modules on a
    baseboard (SXM). The rules follow NVML, and say so in the sources."""
    testbed = umockdev_testbed(
        _profile("nvml-link", [{"id": "10de:ffff", "count": 2, "gen": 4, "width": 4, "driver": "nvidia"}])
    )
    plain = json.loads(testbed.run("check", "--json", "--public-jobs").stdout)
    rules = {r["rule"]: r for r in plain["rules"]}
    assert not rules["pcie-lanes"]["ok"] and rules["pcie-lanes"]["found"] == "2 at x4"
    addresses = [g["pci_address"] for g in plain["inventory"]["gpus"]]

    cards = _nvml_recording(tmp_path / "cards.json", addresses, [0, 0], width=16, max_gen=3)
    result = testbed.run("check", "--json", "--public-jobs", "--nvml-replay", str(cards))
    checked = json.loads(result.stdout)
    rules = {r["rule"]: r for r in checked["rules"]}
    assert rules["pcie-lanes"]["ok"] and rules["pcie-lanes"]["found"] == "2 at x16"
    assert rules["cpu-cores-per-gpu"]["required"] == ">= 4 physical cores (2 x PCIe 3.0)"  # 8 at PCIe 4
    gpu = checked["inventory"]["gpus"][0]
    assert (gpu["name"], gpu["form_factor"], gpu["link"]["max_generation"]) == (
        "NVIDIA Future GPU",
        "pcie",
        3,
    )
    assert gpu["sources"]["link"] == gpu["sources"]["form_factor"] == "nvml"

    modules = _nvml_recording(tmp_path / "sxm.json", addresses, [1, 2], width=16, max_gen=5)
    result = testbed.run("check", "--json", "--public-jobs", "--nvml-replay", str(modules))
    checked = json.loads(result.stdout)
    assert {g["form_factor"] for g in checked["inventory"]["gpus"]} == {"sxm"}
    lanes = {r["rule"]: r for r in checked["rules"]}["pcie-lanes"]
    assert lanes["ok"] and lanes["found"] == "2 SXM GPUs"

    refused = testbed.run("check", "--nvml-replay", str(tmp_path / "none.json"))
    assert refused.returncode == 2 and "minion gpu health --record" in refused.stderr
    assert refused.stderr.count("\n") == 1
    both = testbed.run("check", "--nvml-replay", str(cards), "--inventory", str(cards))
    assert both.returncode == 2 and "pass one of them" in both.stderr and both.stderr.count("\n") == 1
