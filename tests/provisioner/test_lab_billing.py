"""Billing of jobs that really ran:
`provision lab up` with one node, whose minion runs each job as a podman container; the server's metering
reconciler (every minute, on the wall clock) posts each job's partial hour once it stopped. What the
ledger holds must be what domain.billing_rules says for the run the control plane recorded: the job's
`started_at` and `ended_at` from `job show`, its workers, and its accounts.

Three jobs, one per way of paying (docs/billing.md):
- the root account's own job on its own region: the usage fee (RTX A6000, professional: 0.10 per GPU-hour);
- a federated job: account `partner` runs a job in the root account's shared project; the owner pays the
  usage fee, the creator the federated fee (training: 2.65 per worker-hour);
- a public job: `partner` runs a job of its own project on the root account's region once it sells its
  spare capacity (`region update lab --public-jobs`). Without credits it waits, with the reason; topped up,
  it runs at the locked public price, and the region owner earns (price − usage fee) ÷ 2 per GPU-hour.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from provisioner.domain import billing_rules as rules
from provisioner.domain.billing_rules import JobFacts
from provisioner.services.billing import prices
from tests.fixtures.control_plane import PROVISION
from tests.provisioner.test_lab import (  # noqa: F401 - the fixtures are used by name
    cached_lab_home,
    lab_home,
    provision,
    rootfs_cache,
)

pytestmark = pytest.mark.slow

GPU_TYPE = "RTX A6000"  # the lab node's (simulated) GPUs
PUBLIC_PRICE = Decimal("0.78")
JOB_TIMEOUT_S = 120
METERING_TIMEOUT_S = 150  # the reconciler's period is 60 s


def _spec(home: Path, name: str, seconds: int) -> Path:
    path = home / f"{name}.yaml"
    path.write_text(
        f"name: {name}\ntype: training\nresources: {{gpu_types: [{GPU_TYPE}], gpu_count: 1}}\n"
        f"workers: ['echo {name}; sleep {seconds}']\nenvironment: {{image: localhost/rigbase-lab:latest}}\n"
    )
    return path


def _as(home: Path, token: str | None, *args: str, timeout: float = 60) -> str:
    """`provision ARGS` with the lab's home, as the lab's root admin or with TOKEN; stdout."""
    if token is None:
        result = provision(home, *args, timeout=timeout)
    else:
        env = {k: v for k, v in os.environ.items() if k not in ("RIGBASE_URL", "RIGBASE_DATABASE_URL")}
        env |= {"RIGBASE_HOME": str(home), "RIGBASE_TOKEN": token}
        result = subprocess.run(
            [str(PROVISION), *args], env=env, capture_output=True, text=True, timeout=timeout
        )
    assert result.returncode == 0, f"provision {' '.join(args)}: {result.stderr[-3000:]}"
    return result.stdout


def _json(home: Path, token: str | None, *args: str) -> Any:
    return json.loads(_as(home, token, *args, "--json"))


def _wait_job(home: Path, token: str | None, name: str, states: set[str]) -> dict[str, Any]:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while (job := _json(home, token, "job", "show", name))["state"] not in states:
        assert time.monotonic() < deadline, f"{name} is still {job['state']}: {job.get('reason')}"
        time.sleep(0.5)
    return dict(job)


def _when(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _expected(job: dict[str, Any], facts: JobFacts) -> set[tuple[str, str, str, Decimal, int, int]]:
    """(rule, payer, payee, amount, worker, hour) of every entry the rules make of this recorded run: each
    worker is billed from its own start to its own end (docs/billing.md), which may differ from the job's
    by the moments between the node's reports."""
    out = set()
    for worker in job["workers"]:
        started = _when(worker.get("started_at") or job["started_at"])
        ended = _when(worker.get("ended_at") or job["ended_at"])
        for piece in rules.pieces(started, ended, ended):
            for c in rules.charges_for(facts, int(worker["index"]), piece):
                out.add((c.rule.value, c.payer, c.payee, c.amount, int(worker["index"]), piece.index))
    assert out, "a run of a few seconds is one partial hour"
    return out


def _posted(
    home: Path, job: dict[str, Any], accounts: list[str]
) -> set[tuple[str, str, str, Decimal, int, int]]:
    """The job's ledger entries as `billing ledger --job` lists them to each side, once the stopping
    piece is in. Metering posts a job's pieces in one transaction, but each side is a separate read: a
    pass that commits between two reads shows one side without the other (seen in CI), so the answer is
    the first non-empty one read twice alike."""
    deadline = time.monotonic() + METERING_TIMEOUT_S
    last: set[tuple[str, str, str, Decimal, int, int]] = set()
    while True:
        rows = {
            (
                r["rule"],
                r["payer"],
                r["payee"],
                Decimal(str(r["amount"])),
                int(r["worker"]),
                int(r["hour"]),
            )
            for account in accounts
            for r in _json(home, None, "billing", "ledger", "--account", account, "--job", job["id"])
        }
        if rows and rows == last:
            return rows
        last = rows
        assert time.monotonic() < deadline, f"nothing metered for {job['name']} in {METERING_TIMEOUT_S} s"
        time.sleep(2)


def _facts(job: dict[str, Any], *, project: str, creator: str, region: str, price: Decimal) -> JobFacts:
    return JobFacts(
        job_id=job["id"],
        job_type=job["type"],
        project_account=project,
        creator_account=creator,
        region_account=region,
        region_id=None,  # not part of any amount
        gpu_type=GPU_TYPE,
        gpu_class=prices.gpu_class_of(GPU_TYPE),
        gpus_per_worker=1,
        price_per_gpu_hour=price,
    )


def test_jobs_run_in_the_lab_are_charged_and_earn_exactly_as_the_rules_say(
    cached_lab_home: Path,  # noqa: F811
) -> None:
    home = cached_lab_home
    up = provision(home, "lab", "up", "--nodes", "1", "--json", timeout=300)
    assert up.returncode == 0, up.stderr[-3000:]
    _as(home, None, "node", "maintenance", "node-1", "off")
    _as(home, None, "project", "create", "lab-demo")
    root_id = _json(home, None, "account", "show", "default")["id"]
    _as(home, None, "account", "create", "partner")
    partner_id = _json(home, None, "account", "show", "partner")["id"]
    partner = _as(home, None, "token", "create", "partner-admin", "--account", "partner").splitlines()[1]
    _as(home, None, "project", "share", "lab-demo", "--account", "partner")

    # 1. own capacity: the root account's job on its own region pays the usage fee
    _as(home, None, "job", "create", "-f", str(_spec(home, "own", 3)), "--project", "lab-demo", "-y")
    own = _wait_job(home, None, "own", {"succeeded", "failed"})
    assert own["state"] == "succeeded" and not own["federated"], own
    # 2. federated: partner's job in the root account's shared project
    fed_spec = _spec(home, "fed", 3)
    _as(home, partner, "job", "create", "-f", str(fed_spec), "--project", "default/lab-demo", "-y")
    fed = _wait_job(home, partner, "fed", {"succeeded", "failed"})
    assert fed["state"] == "succeeded" and fed["federated"], fed

    # 3. public: the region sells its spare capacity; partner's own job waits for credits, then runs
    assert "its region owner earns 0.34" in _as(home, None, "price", "set", GPU_TYPE, str(PUBLIC_PRICE))
    _as(home, None, "region", "update", "lab", "--public-jobs")
    assert _json(home, None, "region", "show", "lab")["public_jobs"] is True
    _as(home, partner, "job", "create", "-f", str(_spec(home, "pub", 3)), "-y")
    waiting = _wait_job(home, partner, "pub", {"waiting"})
    assert "credits" in waiting["reason"], waiting["reason"]
    _as(home, None, "billing", "credit", "partner", "1")
    pub = _wait_job(home, partner, "pub", {"succeeded", "failed"})
    assert pub["state"] == "succeeded" and Decimal(str(pub["price_per_gpu_hour"])) == PUBLIC_PRICE, pub

    sides = [root_id, partner_id]
    cases = [
        (own, None, _facts(own, project=root_id, creator=root_id, region=root_id, price=Decimal(0))),
        (fed, partner, _facts(fed, project=root_id, creator=partner_id, region=root_id, price=Decimal(0))),
        (
            pub,
            partner,
            _facts(pub, project=partner_id, creator=partner_id, region=root_id, price=PUBLIC_PRICE),
        ),
    ]
    rules_seen: set[str] = set()
    for job, token, facts in cases:
        expected = _expected(job, facts)
        posted = _posted(home, job, sides)
        assert posted == expected, (job["name"], sorted(posted ^ expected))
        rules_seen |= {row[0] for row in posted}
        paid = sum((row[3] for row in posted if row[2] == rules.PLATFORM), Decimal(0))
        assert Decimal(str(_json(home, token, "job", "show", job["id"])["credits"])) == paid, job["name"]
    assert rules_seen == {"usage_fee", "federated_fee", "public_price", "public_earnings"}

    # what each account sees of it: partner paid the federated fee and the public price out of its top-up;
    # the root account's earnings wait for the daily transfer; the region shows them
    fed_fee = sum((r[3] for r in _expected(fed, cases[1][2]) if r[0] == "federated_fee"), Decimal(0))
    pub_price = sum((r[3] for r in _expected(pub, cases[2][2]) if r[0] == "public_price"), Decimal(0))
    earned = sum((r[3] for r in _expected(pub, cases[2][2]) if r[0] == "public_earnings"), Decimal(0))
    assert earned > 0
    balance = _json(home, partner, "billing", "balance")
    assert Decimal(str(balance["balance"])) == Decimal(1) - fed_fee - pub_price
    root_balance = _json(home, None, "billing", "balance")
    assert Decimal(str(root_balance["earned_pending"])) == earned
    assert Decimal(str(_json(home, None, "region", "show", "lab")["credits_earned"])) == earned
    today = _when(pub["ended_at"]).date().isoformat()
    usage = _json(home, partner, "billing", "usage", "--day", today)
    assert {row["job_id"] for row in usage} >= {fed["id"], pub["id"]}, usage
