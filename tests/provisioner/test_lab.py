"""The local lab for real: `provision lab up` builds network namespaces, swtpms with EK certificates,
umockdev hardware, a control plane and minions that join over the lab LAN; `provision lab down` must
leave no namespace, process or file behind.

The debootstrap'd base root is shared with tests/provisioner/test_finalize.py through
RIGBASE_TEST_ROOTFS_CACHE (`make test` sets it; otherwise it is built once per session here).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from provisioner.lab import hardware, netns, rootfs
from provisioner.lab.state import (
    OWNER_PATH,
    LabNodeRecord,
    LabState,
    Proc,
    claim_machine,
    machine_owner,
    state_path,
)
from provisioner.lab.topology import NAME_PATTERN, NETNS_PREFIX, HostRole, LabPlan, address, netns_name
from tests.fixtures.leftovers import processes_naming
from tests.fixtures.rootfs import rootfs_cache_dir

PROVISION = Path(sys.executable).parent / "provision"
MINION = Path(sys.executable).parent / "minion"


def lab_namespaces() -> list[str]:
    return [n for n in netns.list_namespaces(NETNS_PREFIX) if NAME_PATTERN.match(n)]


def provision(home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RIGBASE_URL", "RIGBASE_TOKEN", "RIGBASE_DATABASE_URL")
    }
    return subprocess.run(
        [str(PROVISION), *args],
        env=env | {"RIGBASE_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture(scope="session")
def rootfs_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = rootfs_cache_dir(tmp_path_factory)
    rootfs.ensure_base(cache=cache)
    return cache


@pytest.fixture
def lab_home(tmp_path: Path) -> Path:
    """A fresh RIGBASE_HOME; refuses to run beside another lab; tears down whatever a failed test left.

    A lab whose home is gone is an orphan, e.g. of a test run killed mid-lab whose --basetemp this run
    deleted: its `lab down` is any home's, so it is cleaned here instead of failing every lab test."""
    owner = machine_owner()
    if lab_namespaces() and owner is not None and not state_path(owner).exists():
        cleaned = provision(tmp_path / "orphan-home", "lab", "down", "--yes", timeout=120)
        assert cleaned.returncode == 0, f"the orphaned lab of {owner} stays: {cleaned.stderr}"
    if lab_namespaces():
        pytest.fail(
            f"a lab is already up on this machine ({', '.join(lab_namespaces())}, home {owner}): "
            "run `provision lab down --yes` with its RIGBASE_HOME first"
        )
    home = tmp_path / "home"
    (home / "cache").mkdir(parents=True)
    yield home
    if (home / "lab").exists() or lab_namespaces():
        provision(home, "lab", "down", "--yes")


@pytest.fixture
def cached_lab_home(lab_home: Path, rootfs_cache: Path) -> Path:
    """`lab_home` whose rootfs cache is the session's (no second debootstrap)."""
    (lab_home / "cache" / "rootfs").symlink_to(rootfs_cache)
    return lab_home


# -- the plan, the state file and the hardware profile (no lab needed) -----------------------------------


def test_plan_names_and_addresses_are_fixed_and_only_the_labs_names_match() -> None:
    plan = LabPlan(nodes=3, upnp=True)
    assert plan.namespaces() == [
        "rigbase-lab-lan",
        "rigbase-lab-cp",
        "rigbase-lab-client",
        "rigbase-lab-router",
        "rigbase-lab-wan",
        "rigbase-lab-node1",
        "rigbase-lab-node2",
        "rigbase-lab-node3",
    ]
    assert [(p.name, p.address) for p in plan.node_plans()] == [
        ("node-1", "10.77.0.11"),
        ("node-2", "10.77.0.12"),
        ("node-3", "10.77.0.13"),
    ]
    assert address(HostRole.CP) == "10.77.0.2" and plan.cp_lan_url == "https://10.77.0.2:8470"
    assert all(NAME_PATTERN.match(n) for n in plan.namespaces())
    # namespaces of tests (netns.Lab: rigbase-<tag>-<role>-<random>) are never the lab's to delete
    for other in ("rigbase-lab-lan-1a2b3c", "rigbase-t-node-ffffff", "rigbase-lab-nodex", "lab-node1"):
        assert not NAME_PATTERN.match(other)
    for bad in (0, -1, 17):
        with pytest.raises(ValueError, match="out of range"):
            LabPlan(nodes=bad)


def test_the_lab_reaches_the_control_plane_over_http_only() -> None:
    """docs/lab.md "How the lab talks to the control plane": API calls with the admin token only; no
    services, no store rows, nothing of the CLI (it prints what the lab returns), no `provision`
    subprocesses."""
    import ast

    lab_package = Path(__file__).resolve().parents[2] / "provisioner" / "lab"
    for module in sorted(lab_package.glob("*.py")):
        tree = ast.parse(module.read_text())
        imported = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        imported |= {
            alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
        }
        forbidden = {
            name
            for name in imported
            if name.split(".")[:2]
            in (["provisioner", "services"], ["provisioner", "store"], ["provisioner", "cli"])
        }
        assert not forbidden, f"{module.name} imports {sorted(forbidden)}"
    # the one `provision` the lab runs is `provision serve`: the control plane it simulates a region for,
    # one process or (control_planes.py) one per host
    for module in ("lifecycle.py", "control_planes.py"):
        text = (lab_package / module).read_text()
        assert text.count('BIN / "provision"') == 1, module
        assert text.split('BIN / "provision")', 1)[1].lstrip(" ,\n").startswith('"serve"'), module


def test_state_survives_a_round_trip_and_never_trusts_a_reused_pid(tmp_path: Path) -> None:
    me = Proc.of("serve", os.getpid())
    state = LabState(
        home=str(tmp_path),
        serve=me,
        namespaces=[netns_name(HostRole.LAN)],
        nodes={"node-1": LabNodeRecord(1, "node-1", "rigbase-lab-node1", "10.77.0.11", minion_id="ab" * 16)},
    )
    state.save()
    again = LabState.load(tmp_path)
    assert again == state and again.serve.alive()
    # the same pid with another start time is another process: never signalled, never reported alive
    assert not Proc("serve", os.getpid(), (me.start_time or 0) + 1).alive()


def test_the_lab_hardware_profile_passes_the_local_storage_rules_under_umockdev(tmp_path: Path) -> None:
    record, host = hardware.write_testbed(hardware.load_profile("lab-gpu-node"), tmp_path)
    result = subprocess.run(
        [
            "umockdev-run",
            "-d",
            str(record),
            "--",
            str(MINION),
            "check",
            "--storage-mode",
            "local",
            "--public-jobs",
            "--host-root",
            str(host),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    verdict = json.loads(result.stdout)
    assert result.returncode == 0 and verdict["ok"], verdict
    assert {r["rule"] for r in verdict["rules"]} >= {"sata-drives", "nvme-count", "tpm2", "gpu-single-model"}
    assert len(verdict["inventory"]["gpus"]) == 2


# -- refusals: one line, the right exit code, nothing left behind ------------------------------------------


@pytest.mark.parametrize("nodes", ["0", "17", "two"])
def test_bad_node_counts_are_refused_before_anything_is_made(tmp_path: Path, nodes: str) -> None:
    home = tmp_path / "home"
    result = provision(home, "lab", "up", "--nodes", nodes)
    assert result.returncode == 2, result
    assert result.stderr.strip().count("\n") == 0 or "Usage" in result.stderr
    assert not (home / "lab").exists() and not (home / "client.json").exists()


def test_a_home_that_belongs_to_another_control_plane_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "client.json").write_text('{"url": "http://127.0.0.1:8470", "token": "x"}')
    result = provision(home, "lab", "up")
    assert result.returncode == 1
    assert result.stderr.startswith("error: ") and "own home" in result.stderr
    assert sorted(os.listdir(home)) == ["client.json"]


def test_down_needs_yes_without_a_terminal(tmp_path: Path) -> None:
    result = provision(tmp_path / "home", "lab", "down")
    assert result.returncode == 2 and "--yes" in result.stderr


def test_down_cleans_leftovers_of_a_crashed_up_and_up_refuses_them(lab_home: Path) -> None:
    """A `lab up` killed before it wrote its state: a namespace and a process still inside it."""
    stray = netns.Netns(netns_name(HostRole.CLIENT)).create()
    (lab_home / "lab").mkdir()
    sleeper = stray.popen(["sleep", "300"], start_new_session=True)
    try:
        refused = provision(lab_home, "lab", "up")
        assert refused.returncode == 1
        assert "rigbase-lab-client" in refused.stderr and "lab down" in refused.stderr
        down = provision(lab_home, "lab", "down", "--yes")
        assert down.returncode == 0, down.stderr
        assert lab_namespaces() == []
        assert sleeper.wait(5) is not None  # killed with its namespace
        assert sorted(os.listdir(lab_home)) == ["cache"]
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        stray.delete()


def test_a_lab_of_another_home_is_named_and_once_that_home_is_gone_any_homes_down_cleans_it(
    lab_home: Path, tmp_path: Path
) -> None:
    """The machine's lab is recorded with its home: a refusal names the `lab down` to run, and a lab whose
    home was deleted (a killed test run's --basetemp) is an orphan another home's `lab down` cleans,
    its processes found by that home's path."""
    other = tmp_path / "other-home"
    claim_machine(other)
    LabState(home=str(other), namespaces=[netns_name(HostRole.CLIENT)]).save()
    leftover = netns.Netns(netns_name(HostRole.CLIENT)).create()
    # a process of that lab on the host (as `provision serve` and swtpm run), naming its lab directory
    survivor = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", str(other / "lab" / "serve")],
        start_new_session=True,
    )
    try:
        refused = provision(lab_home, "lab", "up")
        assert refused.returncode == 1
        assert f"belongs to the lab of {other}: run `RIGBASE_HOME={other} provision lab down --yes`" in (
            refused.stderr
        )
        assert _status(lab_home)["owner"] == str(other)
        shutil.rmtree(other)
        refused = provision(lab_home, "lab", "up")
        assert refused.returncode == 1
        assert f"left over from a lab whose home {other} is gone: run `provision lab down --yes`" in (
            refused.stderr
        )
        down = provision(lab_home, "lab", "down", "--yes")
        assert down.returncode == 0, down.stderr
        assert lab_namespaces() == [] and not OWNER_PATH.exists()
        assert survivor.wait(10) is not None
        assert sorted(os.listdir(lab_home)) == ["cache"]
    finally:
        if survivor.poll() is None:
            survivor.kill()
        leftover.delete()
        OWNER_PATH.unlink(missing_ok=True)


# -- the real lab --------------------------------------------------------------------------------------------


def _status(home: Path) -> dict[str, Any]:
    result = provision(home, "lab", "status", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_two_nodes_join_reach_maintenance_and_down_leaves_nothing(cached_lab_home: Path) -> None:
    lab_home = cached_lab_home
    up = provision(lab_home, "lab", "up", "--nodes", "2", "--json", timeout=600)
    assert up.returncode == 0, up.stderr[-3000:]
    report = json.loads(up.stdout)
    assert [(n["name"], n["state"], n["online"]) for n in report["nodes"]] == [
        ("node-1", "maintenance", True),
        ("node-2", "maintenance", True),
    ]
    # the operator saw them pending (attested, requirements pass) before they were adopted
    assert "pending minions" in up.stderr and up.stderr.count(" pass ") >= 2
    assert {ns["name"] for ns in report["namespaces"]} == set(LabPlan(nodes=2).namespaces())
    assert all(p["alive"] for p in report["processes"]), report["processes"]
    assert sorted(p["kind"] for p in report["processes"]) == ["minion", "minion", "serve", "swtpm", "swtpm"]

    # every minion_id is its swtpm's EK, each node was finalized into its own lab root over the chroot
    for node in report["nodes"]:
        root = Path(node["lab_root"])
        assert "https://10.77.0.2:8470" in (root / "etc/rigbase/minion.yaml").read_text()
        assert (root / "etc/hostname").read_text().strip() == node["name"]
        history = json.loads(provision(lab_home, "node", "history", node["name"], "--json").stdout)
        assert [h["to_state"] for h in history if h["from_state"] != h["to_state"]] == [
            "new",
            "enrolling",
            "provisioning",
            "maintenance",
        ]

    # plain `provision …` in the same home talks to the lab; the client namespace reaches it over the LAN
    listed = json.loads(provision(lab_home, "node", "list", "--json").stdout)
    assert {n["name"] for n in listed} == {"node-1", "node-2"}
    # over TLS, with the certificate of the lab's CA for its LAN address; plain HTTP gets no answer
    ca = lab_home / "tls" / "ca.pem"
    probe = netns.Netns(netns_name(HostRole.CLIENT)).run(
        [
            sys.executable,
            "-c",
            f"import httpx, ssl; v = ssl.create_default_context(cafile='{ca}'); "
            "print(httpx.get('https://10.77.0.2:8470/healthz', verify=v).status_code)",
        ]
    )
    assert probe.stdout.strip() == "200", probe.stderr
    plain = netns.Netns(netns_name(HostRole.CLIENT)).run(
        [sys.executable, "-c", "import httpx; httpx.get('http://10.77.0.2:8470/healthz')"], check=False
    )
    assert plain.returncode != 0

    # a second `lab up` changes nothing: same nodes, same processes
    again = provision(lab_home, "lab", "up", "--nodes", "2", "--json", timeout=120)
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    assert [n["id"] for n in second["nodes"]] == [n["id"] for n in report["nodes"]]
    assert second["processes"] == report["processes"]
    shrink = provision(lab_home, "lab", "up", "--nodes", "1")
    assert shrink.returncode == 1 and "cannot shrink" in shrink.stderr

    # the walkthrough's activation
    assert provision(lab_home, "node", "maintenance", "node-1", "off").returncode == 0
    assert _status(lab_home)["nodes"][0]["state"] == "active"

    pids = [p["pid"] for p in report["processes"]]
    down = provision(lab_home, "lab", "down", "--yes", timeout=120)
    assert down.returncode == 0, down.stderr
    assert lab_namespaces() == []
    assert processes_naming(lab_home / "lab") == []
    deadline = time.monotonic() + 5
    while any(Proc.of("x", pid).alive() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(Proc.of("x", pid).alive() for pid in pids)
    assert sorted(os.listdir(lab_home)) == ["cache"]  # only the rootfs cache stays
    assert _status(lab_home)["up"] is False
