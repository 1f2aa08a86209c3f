"""Jobs and live grids in a real browser (headless Chromium, as test_console_browser.py): an operator
submits a job spec from the console's form, lands on the job's page, and watches the log the node ships
appear without reloading (static/console.js polls by offset under the console's CSP) until the page says
the log is complete and the job succeeded; then a region's grid shows a node's new state without a
reload. Every wait is for a condition in the page, never a fixed sleep. Screenshots as in
test_console_browser.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner.domain.states import NodeState
from tests.provisioner import test_console_browser
from tests.provisioner.test_console_browser import Screens, browser, flash, follow, live_text
from tests.provisioner.test_console_pages import SPEC
from tests.provisioner.test_jobs_api import Fleet, mine, report, running_fleet

pytest.importorskip("selenium.webdriver")  # as test_console_browser.py: skipped without selenium
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

__all__ = ["browser"]

pytestmark = test_console_browser.pytestmark  # Debian's chromium and its driver

WAIT_S = 30  # the log polls every second, the grids every five


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with running_fleet(tmp_path / "home") as f:
        yield f


def test_submit_then_the_job_page_follows_the_log_and_the_grid_updates_itself(
    fleet: Fleet,
    browser: WebDriver,
    tmp_path: Path,
) -> None:
    shots = Screens(browser, tmp_path)
    browser.get(f"{fleet.cp.url}/signin")
    browser.find_element(By.ID, "token").send_keys(fleet.cp.token, Keys.ENTER)
    WebDriverWait(browser, WAIT_S).until(lambda d: "Resources Dashboard" in d.page_source)

    browser.get(f"{fleet.cp.url}/jobs/new")
    browser.find_element(By.ID, "spec").send_keys(SPEC.format(name="browser-job"))
    shots.take("job-new")
    follow(browser, browser.find_element(By.CSS_SELECTOR, 'button[value="submit"]'))
    assert flash(browser) == "job browser-job created: starting on node gpu-1"
    job_id = browser.current_url.rsplit("/", 1)[1]
    log = browser.find_element(By.ID, "log")
    assert log.get_attribute("data-complete") == "no"

    # the node runs the worker and ships its output: the page shows it without a reload
    [worker] = mine(fleet.heartbeat("gpu-1"), job_id)
    fleet.heartbeat("gpu-1", [report(worker, "running", gpu_indices=[0])])
    assert fleet.log("gpu-1", job_id, 0, 0, "hello from the console\n").status_code == 200
    WebDriverWait(browser, WAIT_S).until(lambda d: "hello from the console" in log.text)
    WebDriverWait(browser, WAIT_S).until(lambda d: live_text(d, "#job-state") == "running")
    shots.take("job-running")
    assert fleet.log("gpu-1", job_id, 0, 23, "bye\n", eof=True).status_code == 200
    fleet.heartbeat("gpu-1", [report(worker, "exited", exit_code=0)])
    WebDriverWait(browser, WAIT_S).until(lambda d: log.get_attribute("data-complete") == "yes")
    assert log.text == "hello from the console\nbye"
    assert live_text(browser, "#job-state") == "succeeded"
    assert browser.find_element(By.ID, "log-status").text == "The whole log is here."
    # the rest of the page follows too: the workers' table, and no Stop button for an ended job
    WebDriverWait(browser, WAIT_S).until(
        lambda d: (
            not d.find_elements(By.XPATH, '//button[text()="Stop job"]')
            and "succeeded" in live_text(d, '[data-live="workers"]')
        )
    )
    shots.take("job-done")

    # a region's grid follows the fleet: gpu-2 enters maintenance behind the operator's back
    browser.get(f"{fleet.cp.url}/regions/lab-1")
    state = 'tr[data-node="gpu-2"] span.state'
    assert live_text(browser, state) == "active"
    fleet.set_node("gpu-2", NodeState.MAINTENANCE)
    WebDriverWait(browser, WAIT_S).until(lambda d: live_text(d, state) == "maintenance")
    assert browser.find_element(By.ID, "live-status").text.startswith("Updated ")
    shots.take("region-live")

    # the billing page: the account's balance, usage and ledger
    follow(browser, browser.find_element(By.LINK_TEXT, "Billing"))
    assert browser.find_element(By.ID, "balance-value").text == "0.000000"
    shots.take("billing")
