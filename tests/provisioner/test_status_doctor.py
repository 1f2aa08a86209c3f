"""`provision status` and `provision doctor` through the real CLI against a real server: the status counts
what is there (nodes by state, pending minions, join tokens, refusals); doctor passes on a set-up control
plane, fails (exit 1) with the fix when no TPM CA is trusted, and warns about a loopback bundle URL."""

from __future__ import annotations

import json
from typing import Any

from tests.fixtures.control_plane import ControlPlane
from tests.provisioner.test_join_http import api


def _ok(cp: ControlPlane, *args: str) -> str:
    out = cp.provision(*args)
    assert out.returncode == 0, (args, out.stdout, out.stderr)
    return out.stdout


def test_status_counts_the_fleet(api_server: ControlPlane) -> None:
    cp = api_server
    api(cp, "POST", "/v1/providers", {"kind": "physical", "config": {}})
    for name in ("dc1", "dc2"):
        api(cp, "POST", "/v1/regions", {"name": name, "provider": "physical"})
    for i in range(3):
        api(cp, "POST", "/v1/nodes", {"name": f"gpu-{i}", "region": "dc1", "minion_id": f"{i + 1:032x}"})
    api(cp, "POST", "/v1/regions/dc1/join-tokens", {"ttl": "1h"})
    api(cp, "POST", "/v1/regions/dc2/join-tokens", {"ttl": "30d"})
    with cp.client() as client:
        bad = client.post("/v1/join", json={"minion_id": "0" * 32})  # a refusal of the last day
    assert bad.status_code in (403, 422)
    out = json.loads(_ok(cp, "status", "--json"))
    rows = {r["region"]: r for r in out["regions"]}
    assert rows["dc1"]["nodes"] == 3 and rows["dc1"]["by_state"] == {"new": 3}
    assert rows["dc1"]["join_tokens"] == 1 and rows["dc1"]["join_tokens_expiring"] == 1
    assert rows["dc2"]["nodes"] == 0 and rows["dc2"]["join_tokens_expiring"] == 0
    assert out["refusals_24h"] >= 1 and out["schema_revision"]
    table = _ok(cp, "status")
    assert "dc1" in table and "EXPIRING" in table and "refusals" in table


def test_doctor_finds_what_is_missing(api_server: ControlPlane, tpm_vendor_ca) -> None:  # type: ignore[no-untyped-def]
    cp = api_server
    api(cp, "POST", "/v1/providers", {"kind": "physical", "config": {}})
    api(cp, "POST", "/v1/regions", {"name": "dc1", "provider": "physical"})
    out = cp.provision("doctor", "--json")
    assert out.returncode == 1, out.stdout
    found = {f["check"]: f for f in json.loads(out.stdout)}
    assert found["server"]["verdict"] == "ok" and found["token"]["verdict"] == "ok"
    assert found["tpm-cas"]["verdict"] == "fail" and "tpm-ca add" in found["tpm-cas"]["detail"]
    assert found["join-tokens"]["verdict"] == "warn" and "dc1" in found["join-tokens"]["detail"]
    assert found["bundle-url"]["verdict"] == "warn"  # the tests' server is on loopback
    assert found["clock"]["verdict"] == "ok" and found["versions"]["verdict"] == "ok"
    api(cp, "POST", "/v1/tpm-cas", {"pem": b"".join(tpm_vendor_ca.certificate_pems()).decode()})
    api(cp, "POST", "/v1/regions/dc1/join-tokens", {"ttl": "7d"})
    again = cp.provision("doctor")
    assert again.returncode == 0, again.stdout
    bad = cp.env | {"RIGBASE_TOKEN": "rbo_not-a-token"}
    import subprocess

    from tests.fixtures.control_plane import PROVISION

    refused = subprocess.run([str(PROVISION), "doctor"], env=bad, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "token" in refused.stdout


def test_the_fleet_status_counts_on_both_stores(store: Any) -> None:
    """The status's grouped queries on SQLite and PostgreSQL alike (PostgreSQL refused the online count's
    GROUP BY when it repeated the expression with a second bound cutoff)."""
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import update

    from bench.bench_fleet_heartbeats import seed
    from provisioner.services.fleet.fleet_status import status
    from provisioner.store.models import Node

    nodes = seed(store.url, 3, 1_000_000)
    with store.sessions.begin() as s:  # one node last heard from an hour ago: offline
        stale = datetime.now(UTC) - timedelta(hours=1)
        s.execute(update(Node).where(Node.id == nodes[0].node_id).values(last_heartbeat_at=stale))
    with store.sessions.begin() as s:
        (region,) = status(s)["regions"]
    got = (region["region"], region["by_state"], region["nodes_offline"])
    assert got == ("fleet", {"maintenance": 3}, 1), region
