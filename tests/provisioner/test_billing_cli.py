"""The real `provision billing …` and `provision price …` CLI (subprocess) against a real control plane:
the product rules' A100 example before any job runs, the price list and `price set` (root admins only,
one-line
refusals), balances and the ledger (--account, --job, --since, --json) of entries posted to its store."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from provisioner.domain import billing_rules as rules
from provisioner.domain.billing_rules import Rule, Subject
from provisioner.services.billing import ledger
from provisioner.services.billing.ledger import NewEntry
from provisioner.store.engine import make_engine, make_sessionmaker
from provisioner.store.models import AuditEvent
from tests.fixtures.control_plane import PROVISION, ControlPlane, start_control_plane


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with start_control_plane(tmp_path_factory.mktemp("billing-cli") / "home") as server:
        yield server


def _json(cp: ControlPlane, *args: str) -> object:
    answer = cp.provision(*args, "--json")
    assert answer.returncode == 0, answer.stderr
    return json.loads(answer.stdout)


def test_estimate_shows_the_seed_a100_example_before_any_job_runs(cp: ControlPlane) -> None:
    answer = cp.provision("billing", "estimate", "--gpu-type", "A100 40GB", "--gpu-count", "1", "--public")
    assert answer.returncode == 0, answer.stderr
    assert "public price per GPU-hour" in answer.stdout and "2.78" in answer.stdout
    assert "region owner earns per GPU-hour" in answer.stdout and "1.265" in answer.stdout
    data = _json(cp, "billing", "estimate", "--gpu-type", "A100", "--public", "--federated", "training")
    assert isinstance(data, dict)
    assert data["owner_earnings_per_gpu_hour"] == "1.265000"
    assert data["price"] == "2.780000" and data["federated_fee"] == "2.650000"
    assert data["total_cost"] == "5.430000"


def test_estimate_on_own_capacity_is_the_usage_fee_and_cpu_only_pays_none(cp: ControlPlane) -> None:
    own = _json(cp, "billing", "estimate", "--gpu-type", "RTX A6000", "--gpu-count", "2")
    assert isinstance(own, dict) and own["usage_fee"] == "0.200000" and own["owner_earnings"] == "0.000000"
    cpu = _json(cp, "billing", "estimate", "--gpu-count", "0", "--federated", "inference")
    assert isinstance(cpu, dict) and cpu["usage_fee"] == "0.000000" and cpu["total_cost"] == "1.850000"
    bad = cp.provision("billing", "estimate", "--gpu-type", "A1OO", "--gpu-count", "1")
    assert (
        bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1 and "did you mean A10" in bad.stderr
    )


def test_price_list_and_set(cp: ControlPlane) -> None:
    rows = _json(cp, "price", "list")
    assert isinstance(rows, list)
    a100 = next(r for r in rows if r["gpu_type"] == "A100 40GB")
    assert (a100["price_per_gpu_hour"], a100["source"]) == ("2.780000", "default")
    answer = cp.provision("price", "set", "RTX 3090", "0.45")
    assert answer.returncode == 0, answer.stderr
    assert "RTX 3090: 0.45 credits per GPU-hour; its region owner earns 0.20" in answer.stdout
    rows = _json(cp, "price", "list")
    assert isinstance(rows, list)
    assert next(r for r in rows if r["gpu_type"] == "RTX 3090")["source"] == "set"
    for args, words in [
        (("RTX 3090", "cheap"), "not a number of credits"),
        (("RTX 3090", "0.01"), "between its usage fee"),
        (("RTX 3090", "0.1234567"), "at most 6 decimal places"),
        (("A100", "3"), "name one of them"),
    ]:
        bad = cp.provision("price", "set", *args)
        assert bad.returncode != 0 and words in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_balance_and_ledger_of_posted_entries(cp: ControlPlane) -> None:
    me = _json(cp, "billing", "balance")
    assert isinstance(me, dict) and me["account"] == "default" and me["balance"] == "0.000000"
    account = me["account_id"]
    engine = make_engine(cp.database_url)
    at = datetime(2026, 11, 17, 10, tzinfo=UTC)
    entries = [
        NewEntry(
            key=rules.job_hour_key(Rule.USAGE_FEE, "job_cli", 0, hour),
            rule=Rule.USAGE_FEE,
            subject=Subject.JOB_HOUR,
            payer=account,
            payee=rules.PLATFORM,
            amount=Decimal("0.25"),
            quantity=Decimal(1),
            at=at.replace(hour=10 + hour),
            job_id="job_cli",
            worker=0,
            hour=hour,
        )
        for hour in range(3)
    ]
    with make_sessionmaker(engine).begin() as s:
        ledger.post(s, entries)
    engine.dispose()
    me = _json(cp, "billing", "balance")
    assert isinstance(me, dict) and me["balance"] == "-0.750000" and me["can_start_public_jobs"] is False
    rows = _json(cp, "billing", "ledger", "--job", "job_cli")
    assert isinstance(rows, list) and [r["hour"] for r in rows] == [2, 1, 0]
    since = _json(cp, "billing", "ledger", "--since", "2026-11-17T11:00:00")
    assert isinstance(since, list) and len(since) == 2
    table = cp.provision("billing", "ledger")
    assert table.returncode == 0 and "usage_fee" in table.stdout and "0.25" in table.stdout
    platform = _json(cp, "billing", "balance", "--account", "platform")
    assert isinstance(platform, dict) and platform["balance"] == "0.750000"
    month = _json(cp, "billing", "usage", "--month", "2026-11")
    assert month == [
        {
            "job_id": "job_cli",
            "gpu_type": None,
            "rule": "usage_fee",
            "quantity": "3.000000",
            "paid": "0.750000",
            "earned": "0.000000",
        }
    ]
    as_csv = cp.provision("billing", "usage", "--month", "2026-11", "--csv")
    assert as_csv.stdout.splitlines() == [
        "job_id,gpu_type,rule,quantity,paid,earned",
        "job_cli,,usage_fee,3.000000,0.750000,0.000000",
    ]
    # per day: the entries whose period ends that UTC day (here all three, at 10:00-12:00 on the 17th)
    day = _json(cp, "billing", "usage", "--day", "2026-11-17")
    assert isinstance(day, list) and [(r["quantity"], r["paid"]) for r in day] == [("3.000000", "0.750000")]
    assert _json(cp, "billing", "usage", "--day", "2026-11-18") == []
    both = cp.provision("billing", "usage", "--month", "2026-11", "--day", "2026-11-17")
    assert both.returncode != 0 and "--month YYYY-MM or --day YYYY-MM-DD" in both.stderr
    bad_day = cp.provision("billing", "usage", "--day", "17/11/2026")
    assert bad_day.returncode != 0 and "is not YYYY-MM-DD" in bad_day.stderr
    bad_month = cp.provision("billing", "usage", "--month", "November")
    assert bad_month.returncode != 0 and "is not YYYY-MM" in bad_month.stderr
    missing = cp.provision("billing", "balance", "--account", "nobody")
    assert missing.returncode != 0 and "does not exist" in missing.stderr


def test_credit_tops_up_an_account_and_only_the_root_admin_may(cp: ControlPlane) -> None:
    acme = cp.provision("account", "create", "acme-credit")
    assert acme.returncode == 0, acme.stderr
    added = cp.provision("billing", "credit", "acme-credit", "25", "--memo", "first invoice paid")
    assert added.returncode == 0, added.stderr
    key, summary = added.stdout.strip().splitlines()
    assert key.startswith("adjustment:") and "balance now 25.00" in summary
    debit = _json(cp, "billing", "credit", "acme-credit", "5", "--debit", "--memo", "correction")
    assert isinstance(debit, dict) and debit["balance"] == "20.000000"
    balance = _json(cp, "billing", "balance", "--account", "acme-credit")
    assert isinstance(balance, dict) and balance["can_start_public_jobs"] is True
    rows = _json(cp, "billing", "ledger", "--account", "acme-credit")
    assert isinstance(rows, list) and {r["rule"] for r in rows} == {"adjustment"}
    assert any("operator:admin: first invoice paid" in (r.get("memo") or "") for r in rows), rows
    for amount, words in (("0", "non-zero"), ("lots", "not a number")):
        bad = cp.provision("billing", "credit", "acme-credit", amount)
        assert bad.returncode != 0 and words in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    made = cp.provision("token", "create", "acme-admin", "--account", "acme-credit", "--role", "admin")
    assert made.returncode == 0, made.stderr
    with cp.client() as c:
        c.headers["Authorization"] = f"Bearer {made.stdout.split()[1]}"
        answer = c.post(
            "/v1/billing/credits", json={"account": "acme-credit", "amount": "1000", "memo": "me"}
        )
    assert answer.status_code == 403 and answer.json()["code"] == "forbidden_role", answer.text
    after = _json(cp, "billing", "balance", "--account", "acme-credit")
    assert isinstance(after, dict) and after["balance"] == "20.000000"


def _token(cp: ControlPlane, name: str, *args: str) -> str:
    answer = cp.provision("token", "create", name, *args)
    assert answer.returncode == 0, answer.stderr
    return answer.stdout.splitlines()[1]


def _as(cp: ControlPlane, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**cp.env, "RIGBASE_TOKEN": token}
    return subprocess.run([str(PROVISION), *args], env=env, capture_output=True, text=True, timeout=60)


def test_region_update_sells_spare_capacity_only_by_its_accounts_admins(cp: ControlPlane) -> None:
    assert cp.provision("provider", "enable", "physical").returncode == 0
    made = cp.provision("region", "create", "sell-1", "--provider", "physical", "--no-public-jobs")
    assert made.returncode == 0, made.stderr
    assert cp.provision("account", "create", "neighbour").returncode == 0
    neighbour = _token(cp, "neighbour-admin", "--account", "neighbour")
    member = _token(cp, "root-member", "--role", "member")
    for token, words in [
        (neighbour, "region 'sell-1' does not exist"),  # another account's region looks missing
        (member, "a member token may not create regions and change a region's"),
    ]:
        refused = _as(cp, token, "region", "update", "sell-1", "--public-jobs")
        assert refused.returncode != 0 and not refused.stdout, refused
        assert words in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    nothing = cp.provision("region", "update", "sell-1")
    assert nothing.returncode != 0 and "name a setting to change" in nothing.stderr
    shown = _json(cp, "region", "show", "sell-1")
    assert isinstance(shown, dict) and shown["public_jobs"] is False  # no refusal changed anything
    updated = _json(cp, "region", "update", "sell-1", "--public-jobs")
    assert isinstance(updated, dict) and updated["public_jobs"] is True
    with Session(make_engine(cp.database_url)) as s:  # the audit trail says who sold it
        (note,) = s.scalars(
            select(AuditEvent).where(AuditEvent.resource_name == "sell-1", AuditEvent.reason.like("public%"))
        )
        assert (note.reason or "").startswith("public jobs allowed") and note.actor.startswith("operator:")
    back = _json(cp, "region", "update", "sell-1", "--no-public-jobs")
    assert isinstance(back, dict) and back["public_jobs"] is False
