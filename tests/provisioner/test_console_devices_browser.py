"""The Devices grid in a real browser (headless Chromium, as test_console_browser.py): an operator makes a
central-storage region from the Resources Dashboard, adds its storage node and a Jetson by minion_id from
the region page, sets a device configuration on the device and deploys it with the grid's buttons,
watches the inference status the device reports change in the grid without a reload, deploys the
configuration's latest revision, and removes the device after the confirmation page. In a local-storage
region the page offers no Add Device, and a device added there anyway (the form's hidden service changed
in the page) is refused with the control plane's one line. Screenshots as in test_console_browser.py.

The device's minion is not started (no swtpm lab here): its join and reports go through the same services
its heartbeat would call, as in test_console_pages.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from provisioner.services.devices import device_deployments as deployments
from provisioner.services.fleet import nodes
from tests.provisioner import test_console_browser
from tests.provisioner.test_console_browser import Screens, browser, flash, follow, live_text
from tests.provisioner.test_console_pages import api
from tests.provisioner.test_devices import ORIN_NX
from tests.provisioner.test_jobs_api import Fleet, running_fleet

pytest.importorskip("selenium.webdriver")  # as test_console_browser.py: skipped without selenium
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.ui import WebDriverWait

__all__ = ["browser"]

pytestmark = test_console_browser.pytestmark  # Debian's chromium and its driver

WAIT_S = 30  # the grids poll every five seconds


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with running_fleet(tmp_path / "home") as f:
        yield f


def _new_region(browser: WebDriver, url: str, name: str, storage_mode: str) -> None:
    """The Resources Dashboard's New Region form, typed and submitted; lands on the region's page."""
    browser.get(f"{url}/")
    form = browser.find_element(By.CSS_SELECTOR, 'form[action="/regions"]')
    form.find_element(By.NAME, "name").send_keys(name)
    Select(form.find_element(By.NAME, "storage_mode")).select_by_value(storage_mode)
    follow(browser, form.find_element(By.CSS_SELECTOR, "button[type=submit]"))
    assert browser.find_element(By.TAG_NAME, "h1").text.endswith(name), browser.current_url


def _add(browser: WebDriver, section: str, name: str, minion_id: str) -> str:
    """Open the grid's Add form, type the name and the minion_id, submit; the flash line."""
    grid = browser.find_element(By.ID, section)
    summary = grid.find_element(By.CSS_SELECTOR, "details.add > summary")
    if grid.find_element(By.CSS_SELECTOR, "details.add").get_attribute("open") is None:
        summary.click()
    form = grid.find_element(By.CSS_SELECTOR, 'form[action="/nodes"]')
    form.find_element(By.NAME, "name").send_keys(name)
    form.find_element(By.NAME, "minion_id").send_keys(minion_id)
    follow(browser, form.find_element(By.CSS_SELECTOR, "button[type=submit]"))
    return flash(browser)


def _joined(fleet: Fleet, name: str, inventory: dict[str, Any] | None = None) -> str:
    """The node's minion joined and provisioning completed (the services its join calls); its id."""
    from provisioner.domain.states import NodeState

    with fleet.sessions.begin() as s:
        node = nodes.get(s, name)
        for state in (NodeState.ENROLLING, NodeState.PROVISIONING, NodeState.ACTIVE):
            nodes.transition(s, node, state, actor="minion:test")
        if inventory is not None:
            nodes.record_report(s, node, inventory=inventory)
        return node.id


def _scroll_to_devices(browser: WebDriver) -> None:
    """The Devices grid in view, so the screenshot shows it (it is below the fold at 1280×800)."""
    browser.execute_script("document.getElementById('devices').scrollIntoView()")


def _row(browser: WebDriver, name: str) -> str:
    return live_text(browser, f'#devices tr[data-node="{name}"]')


def test_an_operator_adds_configures_deploys_and_removes_a_device_in_the_browser(  # noqa: PLR0915
    fleet: Fleet,
    browser: WebDriver,
    tmp_path: Path,
) -> None:
    shots = Screens(browser, tmp_path)
    url = fleet.cp.url
    browser.get(f"{url}/signin")
    browser.find_element(By.ID, "token").send_keys(fleet.cp.token, Keys.ENTER)
    WebDriverWait(browser, WAIT_S).until(lambda d: "Resources Dashboard" in d.page_source)

    # a local-storage region: no Add Device, and a device forced in through the page is refused
    _new_region(browser, url, "shop", "local")
    devices = browser.find_element(By.ID, "devices")
    assert "Devices (Jetsons) join physical regions with central storage only." in devices.text
    assert not devices.find_elements(By.CSS_SELECTOR, "details.add")
    browser.execute_script(
        "document.querySelector('#compute form[action=\"/nodes\"] input[name=service]').value = 'device'"
    )
    refused = _add(browser, "compute", "cam-0", "a" * 32)
    assert refused == (
        "error: region shop uses local storage: devices need a central-storage region; "
        "create a new region to add devices"
    ), refused
    assert "cam-0" not in browser.find_element(By.ID, "devices").text
    assert "cam-0" not in browser.find_element(By.ID, "compute").text  # nothing half made
    shots.take("devices-local-refused")

    # a central region: its storage node, then the device, both added by minion_id from the page
    _new_region(browser, url, "edge", "central")
    assert _add(browser, "storage", "store-1", "b" * 32).startswith("node store-1 added")
    _joined(fleet, "store-1")
    browser.refresh()
    assert _add(browser, "devices", "cam-1", "c" * 32).startswith("node cam-1 added")
    assert "new" in _row(browser, "cam-1")
    device_id = _joined(fleet, "cam-1", {"device": ORIN_NX})
    config = {"region": "edge", "image": "reg.lan/detect:1", "model": "yolo", "command": "serve"}
    made = api(fleet, "POST", "/v1/device-configs", {"name": "detect", **config})
    browser.refresh()
    row = _row(browser, "cam-1")
    assert "NVIDIA Jetson Orin NX" in row and "active" in row and "Deploy" not in row
    _scroll_to_devices(browser)
    shots.take("devices-active")

    # Set Device Config, then Deploy: the grid's own buttons
    cell = browser.find_element(By.CSS_SELECTOR, '#devices tr[data-node="cam-1"] td.actions')
    Select(cell.find_element(By.NAME, "config")).select_by_value(made["id"])
    follow(
        browser, cell.find_element(By.XPATH, ".//button[starts-with(normalize-space(), 'Set Device Config')]")
    )
    assert flash(browser) == "device cam-1 set to configuration detect revision 1: Deploy runs it"
    assert "detect r1" in _row(browser, "cam-1") and "not deployed" in _row(browser, "cam-1")
    cell = browser.find_element(By.CSS_SELECTOR, '#devices tr[data-node="cam-1"] td.actions')
    follow(browser, cell.find_element(By.XPATH, ".//button[starts-with(normalize-space(), 'Deploy')]"))
    assert flash(browser) == (
        "device cam-1 is deploying configuration detect revision 1: it starts at the device's next heartbeat"
    )
    assert "deploying" in _row(browser, "cam-1")
    _scroll_to_devices(browser)
    shots.take("devices-deploying")

    # the device reports its container running: the grid shows it without a reload
    status = api(fleet, "GET", f"/v1/nodes/{device_id}/device-status")
    with fleet.sessions.begin() as s:
        report = {"inference": {"generation": status["generation"], "state": "running"}}
        deployments.record_actual(s, nodes.get(s, device_id), report)
    WebDriverWait(browser, WAIT_S).until(lambda d: "running" in _row(d, "cam-1"))
    _scroll_to_devices(browser)
    shots.take("devices-running")

    # a new revision of the configuration: the row says so, and Deploy with "latest" sends it
    api(fleet, "PATCH", f"/v1/device-configs/{made['id']}", {"command": "serve --v2"})
    browser.refresh()
    assert "r2 is the latest" in _row(browser, "cam-1")
    cell = browser.find_element(By.CSS_SELECTOR, '#devices tr[data-node="cam-1"] td.actions')
    cell.find_element(By.NAME, "latest").click()
    follow(browser, cell.find_element(By.XPATH, ".//button[starts-with(normalize-space(), 'Deploy')]"))
    assert "revision 2" in flash(browser), flash(browser)
    shown = api(fleet, "GET", f"/v1/nodes/{device_id}/device-status")
    assert (shown["deployed_revision"], shown["inference_status"]) == (2, "deploying")

    # Remove, after the confirmation page
    cell = browser.find_element(By.CSS_SELECTOR, '#devices tr[data-node="cam-1"] td.actions')
    follow(browser, cell.find_element(By.LINK_TEXT, "Remove"))
    assert "cam-1" in browser.find_element(By.TAG_NAME, "main").text
    shots.take("device-remove-confirm")
    follow(browser, browser.find_element(By.CSS_SELECTOR, 'form[action$="/remove"] button[type=submit]'))
    assert flash(browser) == "node cam-1 removed"
    assert not browser.find_elements(By.CSS_SELECTOR, '#devices tr[data-node="cam-1"]')
    assert "No device in this region." in browser.find_element(By.ID, "devices").text
    _scroll_to_devices(browser)
    shots.take("devices-removed")
