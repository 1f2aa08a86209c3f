"""A job's charts in a real browser (headless Chromium, as test_console_browser.py): the metric lines a
worker's log carries and the usage samples its node reports are drawn on the job page by uPlot, served
by the control plane itself; the test reads the points each chart holds inside the page, not only its
HTML. The vendored library is the package's own, byte for byte."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contracts.metrics import format_line
from tests.provisioner import test_console_browser
from tests.provisioner.test_console_browser import Screens, browser
from tests.provisioner.test_jobs_api import Fleet, create, mine, report, running_fleet, spec

pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

__all__ = ["browser"]
pytestmark = test_console_browser.pytestmark

WAIT_S = 30
VENDOR = (
    Path(__file__).resolve().parents[2] / "provisioner" / "api" / "console" / "static" / "vendor" / "uplot"
)
DIGESTS = {  # `npm pack uplot@1.6.32` (static/vendor/uplot/README.md)
    "uPlot.iife.min.js": "19c8d4c6ad88929a79f4ae49d6f7161566dfd0ba3d15cc495e974f787eb78f1f",
    "uPlot.min.css": "df630c6a8d6f8eeaff264b50f73ce5b114f646ffd9a0bb74f049b0a00135fa04",
}


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with running_fleet(tmp_path / "home") as f:
        yield f


def test_the_vendored_chart_library_is_the_packages_own() -> None:
    for name, digest in DIGESTS.items():
        assert hashlib.sha256((VENDOR / name).read_bytes()).hexdigest() == digest, name


def chart_data(driver: WebDriver, name: str) -> Any:
    return driver.execute_script(
        "var c = (window.rigbaseCharts || {})[arguments[0]]; return c ? c.data : null;", name
    )


def test_the_job_page_charts_the_metrics_and_the_usage_its_workers_reported(
    fleet: Fleet, browser: WebDriver, tmp_path: Path
) -> None:
    answer = create(fleet, spec("charted"))
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    [worker] = mine(fleet.heartbeat("gpu-1"), job_id)
    now = time.time()
    samples = [
        {
            "at": now - 20 + 10 * i,
            "cpu_cores": cpu,
            "memory_bytes": (i + 1) * 2**30,
            "disk_bytes": 0,
            "net_rx_bytes": 0,
            "net_tx_bytes": 0,
            "gpus": [],
        }
        for i, cpu in enumerate((0.5, 1.5, 2.5))
    ]
    fleet.heartbeat("gpu-1", [report(worker, "running", gpu_indices=[0], usage=samples)])
    log = "".join(
        format_line({"loss": loss}, step=step) + "\n" for step, loss in ((1, 0.9), (2, 0.6), (3, 0.2))
    )
    assert fleet.log("gpu-1", job_id, 0, 0, "training\n" + log).status_code == 200

    browser.get(f"{fleet.cp.url}/signin")
    browser.find_element(By.ID, "token").send_keys(fleet.cp.token, Keys.ENTER)
    WebDriverWait(browser, WAIT_S).until(lambda d: "Resources Dashboard" in d.page_source)
    browser.get(f"{fleet.cp.url}/jobs/{job_id}")
    WebDriverWait(browser, WAIT_S).until(lambda d: chart_data(d, "metrics") and chart_data(d, "usage"))
    assert chart_data(browser, "metrics") == [[1, 2, 3], [0.9, 0.6, 0.2]]
    xs, cpu, memory = chart_data(browser, "usage")
    assert [round(x - xs[0]) for x in xs] == [0, 10, 20] and cpu == [0.5, 1.5, 2.5] and memory == [1, 2, 3]
    # the chart is drawn, and the table beside it says the same for a reader without the picture
    assert browser.find_elements(By.CSS_SELECTOR, "#metrics-chart canvas")
    table = browser.find_element(By.ID, "metrics-latest").text
    assert "loss" in table and "0.2" in table
    assert "per hour while it runs" in browser.find_element(By.ID, "job-credits").text
    shots = Screens(browser, tmp_path)
    browser.execute_script("document.getElementById('metrics').scrollIntoView()")
    shots.take("job-charts")
    browser.set_window_size(390, 844)  # a phone
    browser.refresh()
    WebDriverWait(browser, WAIT_S).until(lambda d: chart_data(d, "metrics"))
    browser.execute_script("document.getElementById('metrics').scrollIntoView()")
    shots.take("job-charts-phone")
