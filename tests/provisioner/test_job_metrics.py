"""Job metrics and cost so far against a real control plane (`provision serve`): metric lines in a worker's
log, shipped over the node credential route as the minion ships them, come back from GET
/v1/jobs/{ref}/metrics and `provision job metrics` in the order they came, a line split across chunks
included; bad lines and points past the job's bound are counted, named and dropped while the job runs on;
`job show` and `job list` give the duration and the credits so far by the billing rules, and once the
metering posted the run, the ledger's figure is the same. Usage samples in the node's reports are kept
once each and folded into five-minute means as they age."""

from __future__ import annotations

import csv
import io
import json
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from contracts.metrics import METRIC_POINTS_PER_JOB, MetricRefused, format_line, parse_line
from provisioner.reconcilers.loop import ReconcilerLoop
from provisioner.services.common.wakeups import Wake
from provisioner.services.jobs import job_usage
from provisioner.store.job_models import Job, JobWorker
from tests.provisioner.test_jobs_api import Fleet, create, job, mine, report, running_fleet, spec

SDK = Path(__file__).resolve().parents[2] / "sdk" / "python"
MIB = 2**20


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("metrics") / "home") as f:
        yield f


def running(fleet: Fleet, body: dict[str, Any], node: str = "gpu-1") -> tuple[str, list[dict[str, Any]]]:
    answer = create(fleet, body)
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    workers = mine(fleet.heartbeat(node), job_id)
    fleet.heartbeat(node, [report(w, "running", gpu_indices=[w["worker"]]) for w in workers])
    assert job(fleet, job_id)["state"] == "running"
    return job_id, workers


def ship(fleet: Fleet, job_id: str, worker: int, pieces: list[str], node: str = "gpu-1") -> int:
    """Post `pieces` as consecutive chunks of the worker's log; the bytes acked."""
    offset = 0
    for piece in pieces:
        answer = fleet.log(node, job_id, worker, offset, piece)
        assert answer.status_code == 200, answer.text
        offset += len(piece.encode())
        assert answer.json()["acked"] == offset
    return offset


def metrics(fleet: Fleet, ref: str, **params: Any) -> dict[str, Any]:
    with fleet.http() as http:
        answer = http.get(f"/v1/jobs/{ref}/metrics", params=params)
        assert answer.status_code == 200, answer.text
        return answer.json()


def test_the_sdk_writes_the_lines_the_control_plane_reads() -> None:
    sys.path.insert(0, str(SDK))
    try:
        import rigbase_metrics
    finally:
        sys.path.remove(str(SDK))
    out = io.StringIO()
    rigbase_metrics.log(step=3, loss=0.25, accuracy=1)
    rigbase_metrics.log(7, file=out, loss=0.5)
    assert out.getvalue() == format_line({"loss": 0.5}, step=7) + "\n"
    points = parse_line(rigbase_metrics.line(step=3, loss=0.25, accuracy=1))
    assert [(p.name, p.value, p.step) for p in points] == [("loss", 0.25, 3), ("accuracy", 1.0, 3)]
    with pytest.raises(ValueError, match="finite"):
        rigbase_metrics.line(loss=float("nan"))


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("rigbase:metric {step: 1}", "not valid JSON"),
        ('rigbase:metric {"loss": NaN}', "NaN is not a number"),
        ('rigbase:metric {"loss": 1e309}', "finite"),
        ('rigbase:metric {"9lives": 1}', "is not valid"),
        ('rigbase:metric {"loss": "low"}', "must be a number"),
        ('rigbase:metric {"step": -1, "loss": 1}', r"from 0 to 2\^53"),
        ('rigbase:metric {"step": 1.5, "loss": 1}', "whole number"),
        ('rigbase:metric {"step": 1}', "at least one metric"),
        ("rigbase:metric [1, 2]", "JSON object"),
    ],
)
def test_a_bad_metric_line_is_refused_with_what_to_fix(line: str, why: str) -> None:
    with pytest.raises(MetricRefused, match=why):
        parse_line(line)


def test_metric_lines_come_back_in_order_and_bad_ones_are_counted_while_the_job_runs(
    fleet: Fleet, tmp_path: Path
) -> None:
    job_id, workers = running(fleet, spec("metrics-ok", workers=2))
    lines = [
        "epoch 1 starting\n",
        format_line({"loss": 0.9, "accuracy": 0.1}, step=1) + "\n",
        'rigbase:metric {"loss": NaN}\n',
        format_line({"loss": 0.5}, step=2) + "\n",
        "rigbase:metric {not json}\n",
        format_line({"loss": 0.25}, step=3),  # the last line, without a newline, is read at the log's end
    ]
    text = "".join(lines)
    split = text.index('"loss":0.5') + 3  # one metric line cut in the middle, across two chunks
    held = ship(fleet, job_id, 0, [text[:split], text[split:]])
    ship(fleet, job_id, 1, [format_line({"loss": 1.5}, step=1) + "\n"])

    page = metrics(fleet, job_id)
    assert [(p["worker"], p["step"], p["name"], p["value"]) for p in page["points"]] == [
        (0, 1, "loss", 0.9),
        (0, 1, "accuracy", 0.1),
        (0, 2, "loss", 0.5),
        (1, 1, "loss", 1.5),
    ]
    first = {w["worker"]: w for w in page["workers"]}[0]
    assert first["refused"] == 2 and "not valid JSON" in first["last_refusal"] and not page["complete"]
    assert job(fleet, job_id)["state"] == "running"  # refusals never touch the job
    # a resent chunk adds nothing; the end of the log reads the last line
    assert fleet.log("gpu-1", job_id, 0, 0, text[:split]).json()["acked"] == held
    assert fleet.log("gpu-1", job_id, 0, held, "", eof=True).json() == {"acked": held, "eof": True}
    page = metrics(fleet, job_id, after=page["next_after"])
    assert [(p["step"], p["value"]) for p in page["points"]] == [(3, 0.25)]
    assert [p["name"] for p in metrics(fleet, job_id, name="accuracy")["points"]] == ["accuracy"]
    assert [p["worker"] for p in metrics(fleet, job_id, worker=1)["points"]] == [1]

    # the CLI: a table, CSV and JSON, and the refusals as one notice each on stderr
    shown = fleet.cp.provision("job", "metrics", job_id)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0].split() == ["WORKER", "STEP", "NAME", "VALUE", "AT"]
    assert len(shown.stdout.splitlines()) == 6
    assert "worker 0: 2 metric line(s) refused, the last: not valid JSON" in shown.stderr
    as_csv = list(
        csv.DictReader(io.StringIO(fleet.cp.provision("job", "metrics", job_id, "-o", "csv").stdout))
    )
    assert [(r["worker"], r["step"], r["name"], r["value"]) for r in as_csv][:2] == [
        ("0", "1", "loss", "0.9"),
        ("0", "1", "accuracy", "0.1"),
    ]
    as_json = json.loads(fleet.cp.provision("job", "metrics", job_id, "--json").stdout)
    assert [p["value"] for p in as_json] == [0.9, 0.1, 0.5, 1.5, 0.25]

    fleet.heartbeat("gpu-1", [report(w, "exited", exit_code=0, log_eof=True) for w in workers])
    fleet.log("gpu-1", job_id, 1, len(format_line({"loss": 1.5}, step=1)) + 1, "", eof=True)
    # --follow ends once the job ended and every log was read
    followed = fleet.cp.provision("job", "metrics", job_id, "--follow", "-o", "json")
    assert followed.returncode == 0 and len(followed.stdout.splitlines()) == 5, followed.stderr
    assert metrics(fleet, job_id)["complete"]


def test_points_past_the_jobs_bound_are_counted_and_dropped(fleet: Fleet) -> None:
    job_id, workers = running(fleet, spec("metrics-bound", gpus=0, cpu_count=4), node="cpu-1")
    per_line = 32
    line = format_line({f"m{i}": float(i) for i in range(per_line)}, step=1) + "\n"
    lines = METRIC_POINTS_PER_JOB // per_line + 10  # 320 points past the bound
    chunk = line * 700  # under the 256 KiB of one LogChunk
    total = line * lines
    pieces = [total[i : i + len(chunk)] for i in range(0, len(total), len(chunk))]
    ship(fleet, job_id, 0, pieces, node="cpu-1")
    worker = metrics(fleet, job_id, after=10**12)["workers"][0]
    assert (
        worker["points"] == METRIC_POINTS_PER_JOB and worker["dropped"] == lines * per_line - worker["points"]
    )
    shown = fleet.cp.provision("job", "metrics", job_id, "--name", "m0", "-o", "csv")
    notice = f"point(s) dropped past the job's bound of {METRIC_POINTS_PER_JOB}"
    assert shown.stderr.count(notice) == 1, shown.stderr
    # the log says so too, once, after the output (the output itself stays as the job wrote it)
    logs = fleet.cp.provision("job", "logs", job_id)
    assert logs.returncode == 0 and logs.stderr.count(notice) == 1 and notice not in logs.stdout
    assert job(fleet, job_id)["state"] == "running"
    fleet.heartbeat("cpu-1", [report(w, "exited", exit_code=0) for w in workers])


def test_cost_so_far_is_the_ledgers_plus_what_the_run_accrued_by_the_same_rules(fleet: Fleet) -> None:
    job_id, workers = running(fleet, spec("cost-so-far"))
    started = datetime.now(UTC) - timedelta(minutes=90)
    with fleet.sessions.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(started_at=started))
        # each worker is billed from its own start
        s.execute(update(JobWorker).where(JobWorker.job_id == job_id).values(started_at=started))
    shown = job(fleet, job_id)
    rate = Decimal("0.05")  # RTX 3090, development class: 0.05 credits per GPU-hour, one GPU, one worker
    hours = Decimal(str(shown["duration_s"])) / 3600
    assert 1.5 <= hours < 1.6
    expected = rate + (rate * (hours - 1)).quantize(Decimal("0.000001"))
    assert abs(Decimal(str(shown["credits_so_far"])) - expected) <= Decimal("0.000002")
    assert Decimal(str(shown["credits_per_hour"])) == rate
    listed = fleet.cp.provision("job", "list", "-o", "wide")
    assert "DURATION" in listed.stdout and "1h" in listed.stdout and "CREDITS" in listed.stdout

    fleet.heartbeat("gpu-1", [report(w, "exited", exit_code=0) for w in workers])
    ReconcilerLoop(fleet.sessions, only=[Wake.METERING], elect=False).run_once()
    ended = job(fleet, job_id)
    assert ended["state"] == "succeeded" and ended["credits_per_hour"] is None
    assert Decimal(str(ended["credits"])) > 0
    assert Decimal(ended["credits_so_far"]) == Decimal(ended["credits"])  # all of it is in the ledger now


def usage_sample(
    at: float, cpu: float, disk: int, gpus: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "at": at,
        "cpu_cores": cpu,
        "memory_bytes": 64 * 2**20,
        "disk_bytes": disk,
        "net_rx_bytes": 1000,
        "net_tx_bytes": 2000,
        "gpus": gpus or [],
    }


def test_usage_samples_are_kept_once_each_and_older_ones_folded_into_five_minute_means(
    fleet: Fleet,
) -> None:
    job_id, workers = running(fleet, spec("usage"))
    gpu = {"index": 0, "util_pct": 90.0, "memory_bytes": 2**30, "power_w": 250.0, "temp_c": 70.0}
    now = time.time()
    first = [usage_sample(now - 20, 0.5, 1 * MIB), usage_sample(now - 10, 0.7, 2 * MIB, [gpu])]
    fleet.heartbeat("gpu-1", [report(workers[0], "running", gpu_indices=[0], usage=first)])
    # the next beat repeats the last sample and adds one: only the new one is stored
    second = [first[-1], usage_sample(now, 0.9, 3 * MIB, [gpu])]
    fleet.heartbeat("gpu-1", [report(workers[0], "running", gpu_indices=[0], usage=second)])
    with fleet.http() as http:
        page = http.get(f"/v1/jobs/{job_id}/usage").json()
    assert [(s["cpu_cores"], s["disk_bytes"]) for s in page["samples"]] == [
        (0.5, 1 * MIB),
        (0.7, 2 * MIB),
        (0.9, 3 * MIB),
    ]
    assert page["samples"][-1]["gpus"] == [gpu] and page["disk_gb"] == 10
    shown = fleet.cp.provision("job", "usage", job_id)
    assert shown.returncode == 0, shown.stderr
    row = shown.stdout.splitlines()[-1].split()
    assert row[:4] == ["0", "0.90", "64MiB", "3MiB"] and "90%" in shown.stdout and "250W" in shown.stdout

    # two hours on: the raw samples fold into the mean of their five minutes
    with fleet.sessions.begin() as s:
        folded = job_usage.compact(s, now=now + 7200)
    assert folded >= 3
    with fleet.http() as http:
        kept = [x for x in http.get(f"/v1/jobs/{job_id}/usage").json()["samples"] if x["worker"] == 0]
    assert all(x["resolution_s"] == job_usage.PERIOD for x in kept)
    mean = sum(x["cpu_cores"] for x in kept) / len(kept)
    assert 0.5 <= mean <= 0.9 and {g["index"] for x in kept for g in x["gpus"]} == {0}
    fleet.heartbeat("gpu-1", [report(w, "exited", exit_code=0) for w in workers])
