"""GET /metrics scraped by a real Prometheus server (Debian's `prometheus`), started on loopback by the
test with the control plane's CA and a scrape token, and read back through PromQL on its HTTP API: the
fleet's node count, GPUs, jobs by state, the heartbeat's latency histogram and refusals by code. A scrape
with another credential is refused, and a scrape token opens nothing else (docs/monitoring.md)."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.provisioner.test_jobs_api import Fleet, create, mine, report, running_fleet, spec

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "rigbase-fleet.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("prom") / "home") as f:
        yield f


def scrape_token(fleet: Fleet, name: str) -> str:
    made = fleet.cp.provision("token", "create", name, "--role", "scrape", "--json")
    assert made.returncode == 0, made.stderr
    token: str = json.loads(made.stdout)["token"]
    return token


@pytest.fixture
def prometheus(fleet: Fleet, tmp_path: Path) -> Iterator[str]:
    if not Path(PROMETHEUS).exists():
        pytest.fail("prometheus is not installed: apt install prometheus (scripts/install-deps.sh)")
    token = scrape_token(fleet, "prometheus")
    (tmp_path / "token").write_text(token)
    (tmp_path / "wrong").write_text("rbo_" + "x" * 43)
    target = fleet.cp.url.removeprefix("https://")

    def job(name: str, credentials: Path) -> dict[str, Any]:
        return {
            "job_name": name,
            "scheme": "https",
            "authorization": {"type": "Bearer", "credentials_file": str(credentials)},
            "tls_config": {"ca_file": str(fleet.cp.ca)},
            "static_configs": [{"targets": [target]}],
        }

    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [job("rigbase", tmp_path / "token"), job("intruder", tmp_path / "wrong")],
    }
    conf = tmp_path / "prometheus.yml"
    conf.write_text(json.dumps(config))  # YAML is a superset of JSON
    check = subprocess.run(["promtool", "check", "config", str(conf)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={conf}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def bare(name: str) -> str:
    """A series' family name: without the suffixes of counters and histograms."""
    return re.sub(r"_(total|bucket|count|sum)$", "", name)


def query(url: str, promql: str, wanted: Any, timeout: float = 40) -> list[dict[str, Any]]:
    """Ask until the answer's values are `wanted` (Prometheus batches new targets for about 5 s)."""
    deadline = time.monotonic() + timeout
    result: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        result = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=5).json()["data"][
            "result"
        ]
        if sorted(float(r["value"][1]) for r in result) == wanted:
            return result
        time.sleep(0.5)
    targets = httpx.get(f"{url}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
    errors = {t["labels"]["job"]: t["lastError"] for t in targets}
    raise AssertionError(f"{promql}: {result}, wanted {wanted} (scrape errors: {errors})")


def test_a_real_prometheus_scrapes_the_fleet_with_its_scrape_token(fleet: Fleet, prometheus: str) -> None:
    answer = create(fleet, spec("scraped", gpus=2))
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    workers = mine(fleet.heartbeat("gpu-1"), job_id)
    fleet.heartbeat("gpu-1", [report(w, "running", gpu_indices=[0, 1]) for w in workers])
    assert create(fleet, spec("queued", gpus=2)).json()["state"] == "waiting"  # gpu-1 is busy
    fleet.heartbeat("gpu-2")  # healthy: active and beating

    query(prometheus, 'up{job="rigbase"}', [1.0])
    query(prometheus, 'up{job="intruder"}', [0.0])
    targets = httpx.get(f"{prometheus}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
    intruder = next(t for t in targets if t["labels"]["job"] == "intruder")
    assert "401" in intruder["lastError"]

    query(prometheus, "sum(rigbase_nodes)", [3.0])
    query(prometheus, 'rigbase_nodes{region="lab-1",state="active",gpu_type="RTX 3090"}', [1.0])
    query(prometheus, 'sum by (kind) (rigbase_gpus{region="lab-1"})', [2.0, 3.0, 3.0])  # allocated 2
    query(prometheus, 'rigbase_jobs{state="running",type="any"}', [1.0])
    query(prometheus, 'rigbase_jobs{state="waiting",type="training"}', [1.0])
    query(prometheus, "rigbase_jobs_waiting", [1.0])
    beats = query(
        prometheus,
        'sum(rigbase_http_request_duration_seconds_count{route="/v1/nodes/{node_id}/heartbeat"}) > bool 0',
        [1.0],
    )
    assert beats
    query(prometheus, 'sum(rigbase_refusals_total{code="token_invalid"}) > bool 0', [1.0])
    # the reconcilers of the serving process (it leads them): each one's last pass, seconds ago
    query(prometheus, 'rigbase_reconciler_last_pass_age_seconds{reconciler="jobs"} < bool 60', [1.0])
    # the dashboard shipped for these series asks only for series the server exports
    with fleet.http() as http:
        exported = http.get("/metrics").text.splitlines()
    types = {bare(line.split()[2]) for line in exported if line.startswith("# TYPE")}
    asked = {
        bare(name)
        for panel in json.loads(DASHBOARD.read_text())["panels"]
        for target in panel["targets"]
        for name in re.findall(r"rigbase_[a-z_]+", target["expr"])
    }
    assert asked and asked <= types, asked - types


def test_metrics_needs_a_scrape_or_root_admin_token_and_a_scrape_token_opens_nothing_else(
    fleet: Fleet,
) -> None:
    token = scrape_token(fleet, "scraper")
    with fleet.http() as http:
        assert http.get("/metrics").status_code == 200  # the root account's admin
        assert http.get("/metrics", headers={"Authorization": ""}).status_code == 401
    with fleet.http(fleet.other_token) as http:
        refused = http.get("/metrics")
        assert refused.status_code == 403 and "scrape token" in refused.json()["message"]
    with fleet.http(token) as http:
        answer = http.get("/metrics")
        assert answer.status_code == 200 and "rigbase_nodes{" in answer.text
        for path in ("/v1/jobs", "/v1/regions", "/v1/operator-tokens"):
            refused = http.get(path)
            assert refused.status_code == 403 and refused.json()["code"] == "forbidden_role", path
    other = fleet.cp.provision("token", "create", "prom-other", "--role", "scrape", "--account", "other")
    assert other.returncode != 0 and "root account" in other.stderr
