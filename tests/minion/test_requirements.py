"""Requirement rules: every profile's verdicts through `minion check` under umockdev, the rule table's
applicability, decimal storage units, and the CLI's exit codes and JSON shape."""

from __future__ import annotations

import itertools
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from minion.hardware.model import Cpu, Drive, DriveKind, FormFactor, Gpu, Inventory, Nic, PcieLink, Tpm
from minion.hardware.requirements import RULES, Applies, check, required_nvme_bytes
from tests.fixtures.umockdev import Testbed, load_profile, minion_executable, profile_names

Make = Callable[[Any], Testbed]
GIB = 2**30
BASE_RULES = ["gpu-single-model", "nvme-count", "nvme-capacity", "tpm2"]
PUBLIC_RULES = ["memory-vs-vram", "pcie-lanes", "cpu-cores-per-gpu"]
CHECK_KEYS = {"ok", "rules", "inventory"}
RULE_KEYS = {"rule", "ok", "required", "found", "detail"}


def _storage_mode_for(profile: dict[str, Any]) -> str:
    return "central" if profile["name"].startswith("central") else "local"


@pytest.mark.parametrize("name", profile_names())
def test_profile_verdicts(umockdev_testbed: Make, name: str) -> None:
    profile = load_profile(name)
    expect: dict[str, bool] = profile["expect"]["rules"]
    mode = _storage_mode_for(profile)
    result = umockdev_testbed(name).run("check", "--json", "--public-jobs", "--storage-mode", mode)
    document = json.loads(result.stdout)
    assert set(document) == CHECK_KEYS
    assert all(set(rule) == RULE_KEYS for rule in document["rules"])
    storage_rule = "sata-drives" if mode == "local" else "network-10gbe"
    assert [r["rule"] for r in document["rules"]] == BASE_RULES + PUBLIC_RULES + [storage_rule]
    assert {r["rule"]: r["ok"] for r in document["rules"]} == {
        rule: expect[rule] for rule in BASE_RULES + PUBLIC_RULES + [storage_rule]
    }
    assert document["ok"] is all(r["ok"] for r in document["rules"])
    assert result.returncode == (0 if document["ok"] else 1), result.stderr
    for field in ("found", "required"):
        shown = {r["rule"]: r[field] for r in document["rules"]}
        for rule, text in profile["expect"].get(field, {}).items():
            if rule in shown:
                assert text in shown[rule], (rule, shown[rule])
    # Every other region kind, from the same inventory: only applicable rules, same verdicts.
    inventory = Inventory.from_json(document["inventory"])
    for storage_mode, public_jobs in itertools.product([None, "local", "central"], [False, True]):
        report = check(inventory, storage_mode, public_jobs)
        wanted = (
            BASE_RULES
            + (PUBLIC_RULES if public_jobs else [])
            + {None: [], "local": ["sata-drives"], "central": ["network-10gbe"]}[storage_mode]
        )
        assert [r.rule for r in report.rules] == wanted
        assert all(r.ok == expect[r.rule] for r in report.rules), (storage_mode, public_jobs)
        assert report.ok == all(expect[rule] for rule in wanted)


def test_rule_table_is_the_issue_list() -> None:
    assert [(r.id, r.applies) for r in RULES] == [
        ("gpu-single-model", Applies.ALWAYS),
        ("nvme-count", Applies.ALWAYS),
        ("nvme-capacity", Applies.ALWAYS),
        ("tpm2", Applies.ALWAYS),
        ("memory-vs-vram", Applies.PUBLIC_JOBS),
        ("pcie-lanes", Applies.PUBLIC_JOBS),
        ("cpu-cores-per-gpu", Applies.PUBLIC_JOBS),
        ("sata-drives", Applies.LOCAL_STORAGE),
        ("network-10gbe", Applies.CENTRAL_STORAGE),
    ]


def _gpu(
    model: str = "A100 40GB",
    vram_gib: int = 40,
    gen: int = 4,
    width: int = 16,
    form: FormFactor = FormFactor.PCIE,
    index: int = 0,
) -> Gpu:
    speed = {3: 8.0, 4: 16.0, 5: 32.0}[gen]
    return Gpu(
        pci_address=f"0000:{index + 1:02x}:00.0",
        vendor_id="10de",
        device_id="20f1",
        vendor="NVIDIA",
        name=model,
        model=model,
        vram_bytes=vram_gib * GIB,
        form_factor=form,
        link=PcieLink(current_speed_gts=speed, current_width=width, max_speed_gts=speed, max_width=16),
    )


def _inventory(
    gpus: int = 1,
    nvme: tuple[int, ...] = (),
    sata: tuple[int, ...] = (),
    memory_gib: float = 512,
    cores: int = 64,
    nic_mbps: int | None = 25000,
) -> Inventory:
    drives = [Drive(f"nvme{i}n1", DriveKind.NVME, size) for i, size in enumerate(nvme)]
    drives += [
        Drive(f"sd{chr(97 + i)}", DriveKind.SATA, size, rotational=False) for i, size in enumerate(sata)
    ]
    return Inventory(
        hostname="t",
        cpu=Cpu(cores, cores * 2),
        memory_total_bytes=int(memory_gib * GIB),
        tpm=Tpm(True, 2, "tpm0"),
        gpus=[_gpu(index=i) for i in range(gpus)],
        drives=drives,
        nics=[Nic("eno1", nic_mbps, True)],
    )


def _rule(inventory: Inventory, rule: str, storage_mode: str | None = None, public_jobs: bool = True) -> Any:
    return next(r for r in check(inventory, storage_mode, public_jobs).rules if r.rule == rule)


@pytest.mark.parametrize(
    ("gpus", "terabytes"), [(0, 1), (1, 1), (2, 1), (3, 2), (4, 2), (5, 3), (8, 4), (16, 8)]
)
def test_nvme_capacity_is_one_tb_per_two_gpus_rounded_up(gpus: int, terabytes: int) -> None:
    assert required_nvme_bytes(gpus) == terabytes * 10**12


def test_storage_sizes_are_decimal_as_drives_are_sold() -> None:
    sold_as_1tb = _rule(_inventory(nvme=(1_000_204_886_016,)), "nvme-capacity")
    assert sold_as_1tb.ok and sold_as_1tb.found == "1.00 TB on 1 NVMe drive"
    assert "TB" in sold_as_1tb.required
    exactly = _rule(_inventory(nvme=(500_100_000_000, 500_100_000_000)), "nvme-capacity")  # 1.0002e12
    assert exactly.ok
    sold_as_960gb = _rule(_inventory(nvme=(960_197_124_096,)), "nvme-capacity")
    assert not sold_as_960gb.ok and sold_as_960gb.found == "960 GB on 1 NVMe drive"
    assert "Add at least 40 GB" in sold_as_960gb.detail
    sata_2tb = _rule(_inventory(sata=(2_000_398_934_016,) * 3), "sata-drives", "local")
    assert sata_2tb.ok and "2.00 TB" in sata_2tb.found
    sata_1_92tb = _rule(_inventory(sata=(1_920_383_410_176,) * 3), "sata-drives", "local")
    assert not sata_1_92tb.ok and sata_1_92tb.found.startswith("0 qualifying of 3")


def test_memory_rule_in_gib_with_the_memtotal_allowance() -> None:
    four_a100 = dict(gpus=4, nvme=(2 * 10**12,) * 2)  # 4 x 40 GiB VRAM -> 320 GiB RAM required
    assert _rule(_inventory(**four_a100, memory_gib=320), "memory-vs-vram").ok
    near = _rule(_inventory(**four_a100, memory_gib=314.2), "memory-vs-vram")  # 320 GiB of DIMMs
    assert near.ok and "few percent" in near.detail
    short = _rule(_inventory(**four_a100, memory_gib=256), "memory-vs-vram")
    assert not short.ok and short.required == ">= 320 GiB RAM (2 x 160 GiB VRAM)"
    assert short.found == "256 GiB RAM" and "64 GiB" in short.detail


def test_memory_rule_says_unknown_when_a_gpus_memory_is_unknown() -> None:
    """Regression: a GPU without catalogue entry or NVML once made the requirement read "0 GiB"."""
    inventory = _inventory(gpus=2, memory_gib=16)
    inventory.gpus[1].vram_bytes = None
    rule = _rule(inventory, "memory-vs-vram")
    assert not rule.ok and rule.required == "unknown (2 x VRAM)"
    assert "GiB" not in rule.required and "memory of 1 GPU is unknown" in rule.detail
    # the --json shape does not change: `required` stays a string
    assert rule.to_json()["required"] == "unknown (2 x VRAM)"


def test_cores_per_gpu_by_generation_and_mixed() -> None:
    inventory = _inventory(gpus=0, cores=9)
    inventory.gpus = [_gpu(gen=3, index=0), _gpu(gen=3, index=1), _gpu(gen=4, index=2)]
    cores = _rule(inventory, "cpu-cores-per-gpu")
    assert cores.required == ">= 8 physical cores (2 x PCIe 3.0, 1 x PCIe 4.0)" and cores.ok
    inventory.cpu = Cpu(7, 14)
    assert not _rule(inventory, "cpu-cores-per-gpu").ok
    # A PCIe 4.0 GPU in a PCIe 3.0 slot runs at 3.0, so it needs 2 cores, not 4.
    slowed = _gpu(gen=4)
    slowed.link.port_max_speed_gts = 8.0
    assert slowed.pcie_gen == 3


def test_pcie_lanes_ignores_sxm_and_names_narrow_gpus() -> None:
    inventory = _inventory(gpus=0)
    inventory.gpus = [
        _gpu(form=FormFactor.SXM, width=2, index=0),
        _gpu(width=8, index=1),
        _gpu(width=4, index=2),
    ]
    lanes = _rule(inventory, "pcie-lanes")
    assert not lanes.ok and lanes.found == "1 at x4, 1 at x8" and "0000:03:00.0" in lanes.detail
    inventory.gpus[2].link.current_width = None
    assert "unreadable" in _rule(inventory, "pcie-lanes").detail


def test_network_rule_needs_a_linked_10g_nic() -> None:
    assert _rule(_inventory(nic_mbps=10000), "network-10gbe", "central").ok
    down = _rule(_inventory(nic_mbps=None), "network-10gbe", "central")
    assert not down.ok and down.found == "no NIC with link"
    assert _rule(_inventory(nic_mbps=1000), "network-10gbe", "central").found == "fastest eno1 at 1 Gb/s"


def _minion(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(minion_executable()), *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_cli_exit_codes_and_saved_inventory(umockdev_testbed: Make, tmp_path: Path) -> None:
    saved = tmp_path / "rig.json"
    result = umockdev_testbed("pcie3-x4-few-cores").run("inventory", "--json")
    saved.write_text(result.stdout)
    passing = _minion("check", "--inventory", str(saved), "--storage-mode", "local")
    assert passing.returncode == 0, passing.stderr
    assert "5 of 5 requirements pass." in passing.stdout
    failing = _minion("check", "--inventory", str(saved), "--public-jobs", "--json")
    assert failing.returncode == 1
    document = json.loads(failing.stdout)
    assert set(document) == CHECK_KEYS and document["ok"] is False
    assert [r["rule"] for r in document["rules"] if not r["ok"]] == ["pcie-lanes", "cpu-cores-per-gpu"]
    table = _minion("check", "--inventory", str(saved), "--public-jobs")
    assert table.returncode == 1 and "FAIL   | pcie-lanes" in table.stdout
    assert "FAIL cpu-cores-per-gpu: 2 more physical cores" in table.stdout


def test_cli_usage_errors_exit_2_with_one_line(tmp_path: Path) -> None:
    assert _minion("check", "--storage-mode", "ceph").returncode == 2
    missing = _minion("check", "--inventory", str(tmp_path / "absent.json"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "minion inventory --json" in missing.stderr
    garbage = tmp_path / "garbage.json"
    garbage.write_text("not json")
    bad = _minion("check", "--inventory", str(garbage))
    assert bad.returncode == 2 and "not JSON" in bad.stderr and bad.stderr.count("\n") == 1
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"hostname": "x"}))
    assert _minion("check", "--inventory", str(wrong)).returncode == 2


def test_this_machine_check_runs_and_reports() -> None:
    """No NVMe or TPM here: check answers (exit 1) instead of crashing, and says what it found."""
    result = _minion("check", "--json", "--public-jobs", "--storage-mode", "central")
    assert result.returncode in (0, 1) and "Traceback" not in result.stderr
    document = json.loads(result.stdout)
    assert set(document) == CHECK_KEYS
    verdicts = {r["rule"]: r for r in document["rules"]}
    assert list(verdicts) == BASE_RULES + PUBLIC_RULES + ["network-10gbe"]
    inventory = Inventory.from_json(document["inventory"])
    assert verdicts["nvme-count"]["ok"] == (len(inventory.nvme_drives) >= 2)
    assert verdicts["tpm2"]["ok"] == (inventory.tpm.present and inventory.tpm.major_version == 2)
    assert result.returncode == (0 if document["ok"] else 1)
    table = _minion("check")
    assert table.returncode == (0 if all(verdicts[rule]["ok"] for rule in BASE_RULES) else 1)
    assert "requirements pass" in table.stdout
