"""Every console page passes axe-core's checks (WCAG 2.1 A and AA, and axe's best practices) in headless
Chromium, at a desktop's width and at a phone's: axe-core itself (the npm package, installed into
.venv/npm by scripts/install-deps.sh) is injected into each page as it is served, with its CSP, and runs
there; any violation fails the test with the rule, the element and what to fix. At a phone's width no
page may scroll sideways as a whole: a wide grid scrolls inside its own frame."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contracts.metrics import format_line
from minion.gpu.health import RecordedReader, assess
from tests.provisioner import test_console_browser
from tests.provisioner.test_console_browser import browser
from tests.provisioner.test_jobs_api import Fleet, create, mine, report, running_fleet, spec

pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

__all__ = ["browser"]
pytestmark = test_console_browser.pytestmark

NVML = Path(__file__).resolve().parents[1] / "minion" / "nvml"  # recorded NVML answers: the node page's GPUs
AXE = Path(__file__).resolve().parents[2] / ".venv" / "npm" / "node_modules" / "axe-core" / "axe.min.js"
WAIT_S = 30
SIZES = {"desktop": (1280, 900), "phone": (390, 844)}
DRY_RUN_SPEC = (
    "name: axe-dry\ntype: training\nresources: {gpu_count: 1, gpu_types: [RTX 3090]}\n"
    "workers: [echo hi]\nenvironment: {image: localhost/rigbase-job:test}\n"
)
TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"]
RUN_AXE = """
var done = arguments[arguments.length - 1];
function where(n) { return n.target.join(" ") + ": " + n.failureSummary; }
axe.run(document, {runOnly: {type: "tag", values: arguments[0]}})
  .then(function (r) { done(r.violations.map(function (v) {
    return {id: v.id, help: v.help, nodes: v.nodes.slice(0, 3).map(where)};
  })); })
  .catch(function (e) { done([{id: "axe-failed", help: String(e), nodes: []}]); });
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("axe") / "home") as f:
        yield f


def pages(fleet: Fleet) -> dict[str, str]:
    """One URL of every kind of console page, with real content: a running job with metrics and usage,
    a waiting job, nodes, a datastore."""
    answer = create(fleet, spec("axe-job"))
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    [worker] = mine(fleet.heartbeat("gpu-1"), job_id)
    usage = [
        {"at": time.time(), "cpu_cores": 1.0, "memory_bytes": 2**30, "disk_bytes": 0}
        | {"net_rx_bytes": 0, "net_tx_bytes": 0, "gpus": []}
    ]
    health = assess(RecordedReader(NVML / "h100x4-faults.json").read()).model_dump(mode="json")
    fleet.heartbeat(
        "gpu-1", [report(worker, "running", gpu_indices=[0], usage=usage)], {"gpu_health": health}
    )
    fleet.log("gpu-1", job_id, 0, 0, "start\n" + format_line({"loss": 0.5}, step=1) + "\n")
    assert create(fleet, spec("axe-waits", types=("A100 80GB",))).json()["state"] == "waiting"
    with fleet.http() as http:
        region = http.get("/v1/regions/lab-1").json()["id"]
        node = http.get("/v1/nodes/gpu-1").json()["id"]
        datastore = http.get("/v1/datastores/results").json()["id"]
    return {
        "resources": "/",
        "region": f"/regions/{region}",
        "node": f"/nodes/{node}",
        "node-remove": f"/nodes/{node}/remove",
        "node-replace": f"/nodes/{node}/replace",
        "datastore-remove": f"/datastores/{datastore}/remove",
        "pending": "/pending",
        "refusals": "/refusals",
        "jobs": "/jobs",
        "job-new": "/jobs/new",
        "job": f"/jobs/{job_id}",
        "billing": "/billing",
        "data": "/data",
        "not-found": "/no-such-page",
    }


def sideways(driver: WebDriver, name: str, size: str) -> list[str]:
    """At a phone's width the page itself never scrolls sideways (a wide grid scrolls in its frame)."""
    if size != "phone":
        return []
    wide = driver.execute_script(
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    return [f"{name}@phone: the page scrolls sideways by {wide}px"] if wide > 1 else []


def audit(driver: WebDriver) -> list[dict[str, Any]]:
    driver.execute_script(AXE.read_text())
    found: list[dict[str, Any]] = driver.execute_async_script(RUN_AXE, TAGS)
    return found


def test_every_console_page_passes_axe_at_desktop_and_phone_width(fleet: Fleet, browser: WebDriver) -> None:
    if not AXE.exists():
        pytest.fail(f"axe-core is missing ({AXE}): run ./scripts/install-deps.sh (it needs npm)")
    browser.set_script_timeout(60)
    urls = pages(fleet)
    failures: list[str] = []
    browser.get(f"{fleet.cp.url}/signin")
    for size, (width, height) in SIZES.items():
        browser.set_window_size(width, height)
        browser.get(f"{fleet.cp.url}/signin")
        failures += [f"signin@{size}: {v['id']} ({v['help']}): {v['nodes']}" for v in audit(browser)]
    browser.find_element(By.ID, "token").send_keys(fleet.cp.token, Keys.ENTER)
    WebDriverWait(browser, WAIT_S).until(lambda d: "Resources Dashboard" in d.page_source)
    for size, (width, height) in SIZES.items():
        browser.set_window_size(width, height)
        for name, path in urls.items():
            browser.get(fleet.cp.url + path)
            WebDriverWait(browser, WAIT_S).until(
                lambda d: d.execute_script("return document.readyState") == "complete"
            )
            failures += [f"{name}@{size}: {v['id']} ({v['help']}): {v['nodes']}" for v in audit(browser)]
            failures += sideways(browser, name, size)
        # the dry run's match table: the answer to a form, not a page of its own
        browser.get(f"{fleet.cp.url}/jobs/new")
        field = browser.find_element(By.ID, "spec")
        field.clear()
        field.send_keys(DRY_RUN_SPEC)
        browser.find_element(By.CSS_SELECTOR, 'button[value="dry-run"]').click()
        WebDriverWait(browser, WAIT_S).until(lambda d: "Where it would run now" in d.page_source)
        failures += [f"dry-run@{size}: {v['id']} ({v['help']}): {v['nodes']}" for v in audit(browser)]
        failures += sideways(browser, "dry-run", size)
    assert not failures, "\n".join(failures)
