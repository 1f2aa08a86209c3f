"""The console banner: fits 80x25 in ASCII, marks failures, reads the bundle and the TPM (a real swtpm)."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from minion.banner import banner_enrollment, read_bundle, read_minion_id, render
from minion.hardware.model import Inventory
from minion.hardware.requirements import check
from tests.fixtures.umockdev import Testbed, minion_executable

Make = Callable[[Any], Testbed]
Cached = Callable[[str], dict[str, Any]]
MINION_ID = "0123456789abcdef0123456789abcdef"


def _bundle(path: Path, **overrides: Any) -> Path:
    data = {
        "version": 1,
        "control_plane_url": "http://127.0.0.1:8470",
        "ca_certificate": None,
        "region": "lab-east",
        "region_id": "reg_1",
        "provider": "physical",
        "join_token": "secret",
        "expires_at": None,
        **overrides,
    }
    path.write_text(json.dumps(data))
    return path


def _assert_fits(text: str) -> list[str]:
    lines = text.splitlines()
    assert len(lines) <= 25
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    assert text.isascii()
    return lines


def test_worst_case_banner_fits_80x25(profile_inventory: Cached, tmp_path: Path) -> None:
    inventory = Inventory.from_json(profile_inventory("pcie3-x4-few-cores"))
    report = check(inventory, "local", public_jobs=True)
    addresses = [(f"enp{i}s0f{i}", f"2001:db8:{i:x}::{i:x}:1234:5678") for i in range(10)]
    text = render(
        minion_id=None,
        tpm_problem="x" * 300,
        enrollment=read_bundle(tmp_path / "none.json"),
        addresses=addresses,
        report=report,
        inventory=inventory,
        version="9.9.9",
    )
    lines = _assert_fits(text)
    assert lines[0].startswith("rigbase minion 9.9.9") and lines[0].endswith("riser-rig")
    assert "TPM missing or unreadable: xxx" in text
    assert sum(line.startswith("[FAIL]") for line in lines) == 2
    assert sum(line.startswith("[ ok ]") for line in lines) == 6
    assert "pcie-lanes" in next(line for line in lines if line.startswith("[FAIL]"))
    assert "..." in text  # the long address list was cut, not spilled past 25 lines


def test_ready_node_says_where_to_add_it(profile_inventory: Cached, tmp_path: Path) -> None:
    inventory = Inventory.from_json(profile_inventory("h100-sxm-server"))
    enrollment = read_bundle(_bundle(tmp_path / "bundle.json"))
    text = render(
        minion_id=MINION_ID,
        tpm_problem=None,
        enrollment=enrollment,
        addresses=[("eno1", "192.168.1.20")],
        report=check(inventory),
        inventory=inventory,
    )
    lines = _assert_fits(text)
    assert f"minion_id  {MINION_ID}" in lines
    assert any(line.startswith("region     lab-east (physical)") for line in lines)
    assert "addresses  eno1 192.168.1.20" in lines
    assert "8 x H100 80GB" in text and "FAIL" not in text
    assert "add a node with it to region 'lab-east'" in " ".join(lines)


def test_bundle_problems_are_one_line_each(tmp_path: Path) -> None:
    assert read_bundle(tmp_path / "absent.json").problem == f"no enrollment bundle at {tmp_path}/absent.json"
    (tmp_path / "bad.json").write_text("{")
    assert "unreadable bundle" in (read_bundle(tmp_path / "bad.json").problem or "")
    assert "unsupported version 2" in (read_bundle(_bundle(tmp_path / "v2.json", version=2)).problem or "")
    kind = read_bundle(_bundle(tmp_path / "kind.json", storage_mode="central", public_jobs=True))
    assert (kind.region, kind.storage_mode and kind.storage_mode.value, kind.public_jobs) == (
        "lab-east",
        "central",
        True,
    )


def test_unreachable_tpm_gives_a_reason() -> None:
    minion_id, problem = read_minion_id("swtpm:path=/nonexistent/rigbase.sock")
    assert minion_id is None and problem


def test_banner_command_with_a_real_swtpm(umockdev_testbed: Make, swtpm: Any, tmp_path: Path) -> None:
    """`minion banner` under a umockdev testbed, its TPM a real swtpm reached through RIGBASE_TCTI."""
    from minion.tpm.identity import minion_id

    bundle = _bundle(tmp_path / "bundle.json")
    result = umockdev_testbed("h100-sxm-server").run(
        "banner", env={"RIGBASE_BUNDLE": str(bundle), "RIGBASE_TCTI": swtpm.tcti}
    )
    assert result.returncode == 0, result.stderr
    lines = _assert_fits(result.stdout)
    expected = minion_id(swtpm.tcti)
    assert re.fullmatch(r"[0-9a-f]{32}", expected)
    assert f"minion_id  {expected}" in lines
    assert any(line.startswith("region     lab-east") for line in lines)
    assert "add a node with it to region 'lab-east'" in result.stdout.replace("\n           ", " ")


def test_banner_command_flags_and_missing_tpm(umockdev_testbed: Make, tmp_path: Path) -> None:
    bundle = _bundle(tmp_path / "bundle.json")
    result = umockdev_testbed("central-1gbe").run(
        "banner",
        "--bundle",
        str(bundle),
        "--tcti",
        "swtpm:path=/nonexistent/rigbase.sock",
        "--storage-mode",
        "central",
    )
    assert result.returncode == 0, result.stderr
    lines = _assert_fits(result.stdout)
    assert any(line.startswith("minion_id  TPM missing or unreadable: ") for line in lines)
    assert any(line.startswith("[FAIL] network-10gbe") for line in lines)
    # sysfs shows a TPM 2.0 but nothing answers on the TCTI: say so rather than "enable it"
    assert "The TPM 2.0 is installed but did not answer" in result.stdout


def test_next_step_without_a_tpm(profile_inventory: Cached, tmp_path: Path) -> None:
    inventory = Inventory.from_json(profile_inventory("no-tpm"))
    text = render(
        minion_id=None,
        tpm_problem="no TPM reachable",
        enrollment=read_bundle(_bundle(tmp_path / "b")),
        addresses=[],
        report=check(inventory),
        inventory=inventory,
    )
    lines = _assert_fits(text)
    assert "[FAIL] tpm2               no TPM; need TPM 2.0" in lines
    assert "addresses  none (no interface has an IP address)" in lines
    assert "next step  Enable the TPM 2.0 (or firmware TPM) in the firmware setup" in text


def test_banner_on_this_machine() -> None:
    result = subprocess.run(
        [str(minion_executable()), "banner", "--bundle", "/nonexistent/bundle.json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = _assert_fits(result.stdout)
    assert any(line.startswith("region     unknown: no enrollment bundle at /nonexistent") for line in lines)
    assert any(line.startswith(("[ ok ] tpm2", "[FAIL] tpm2")) for line in lines)


def test_addresses_match_the_kernel() -> None:
    """Cross-check the stdlib address reader against iproute2 on this machine."""
    from minion.hardware.addresses import local_addresses

    shown = json.loads(
        subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True).stdout
    )
    expected_v4 = {
        (i["ifname"], a["local"])
        for i in shown
        for a in i.get("addr_info", [])
        if a["family"] == "inet" and i["ifname"] != "lo"
    }
    found = set(local_addresses())
    # SIOCGIFADDR gives the primary IPv4 address of each interface
    assert {name for name, _ in expected_v4} == {n for n, a in found if "." in a}
    assert {(n, a) for n, a in found if "." in a} <= expected_v4
    expected_v6 = {
        (i["ifname"], a["local"])
        for i in shown
        for a in i.get("addr_info", [])
        if a["family"] == "inet6" and a.get("scope") == "global"
    }
    assert {(n, a) for n, a in found if ":" in a} == expected_v6


def test_banner_of_a_device_without_a_tpm_shows_its_device_key_id(
    umockdev_testbed: Make, tmp_path: Path
) -> None:
    """`minion banner --device-key` (a Xavier): the minion_id of the key in the state dir, made once."""
    from minion.device_key import DeviceKey

    bundle = _bundle(tmp_path / "bundle.json")
    state = tmp_path / "state"
    env = {"RIGBASE_BUNDLE": str(bundle), "RIGBASE_STATE_DIR": str(state)}
    result = umockdev_testbed("central-1gbe").run("banner", "--device-key", env=env)
    assert result.returncode == 0, result.stderr
    expected = DeviceKey.load_or_create(state).minion_id  # the key the banner created, read back
    assert f"minion_id  {expected}" in _assert_fits(result.stdout)
    again = umockdev_testbed("central-1gbe").run("banner", "--device-key", env=env)
    assert f"minion_id  {expected}" in again.stdout  # the same identity at every boot


def test_a_gce_vm_without_its_bundle_yet_is_told_it_comes_from_the_metadata_server(
    profile_inventory: Cached, tmp_path: Path
) -> None:
    gce, metal = tmp_path / "gce_product", tmp_path / "metal_product"
    gce.write_text("Google Compute Engine\n")
    metal.write_text("PowerEdge R750\n")
    state = tmp_path / "state"
    state.mkdir()
    inventory = Inventory.from_json(profile_inventory("h100-sxm-server"))

    def step(product: Path) -> str:
        enrollment = banner_enrollment(None, state, product)
        text = render(
            minion_id=MINION_ID,
            tpm_problem=None,
            enrollment=enrollment,
            addresses=[],
            report=check(inventory),
            inventory=inventory,
        )
        return " ".join(text.split())

    waiting = step(gce)
    assert "region unknown: not read yet from the GCE metadata server" in waiting
    assert "journalctl -u rigbase-gce-bundle" in waiting and "no valid enrollment bundle" not in waiting
    assert "no valid enrollment bundle" in step(metal)  # a server booted without its USB bundle
    _bundle(state / "bundle.json", provider="gcp")  # what `minion gce-bundle` wrote
    assert "region lab-east (gcp)" in step(gce) and "Write down the minion_id" in step(gce)
