"""The console in a real browser: headless Chromium (Debian's chromium and chromium-driver, nothing
downloaded at run time) driven by selenium against a real `provision serve` over TLS, with minions that
join with their own swtpm. An operator signs in, sees a pending minion and a refused one with its
verdicts, adds the pending one with the prefilled form, sees it in the region's grid, watches it reach
maintenance once its minion joined and finalized, toggles it active, opens its node page, and reads the
refused join's reason. A form posted without its CSRF token is refused; the cookie's flags are checked
as the browser stores them. A screenshot of every page goes to the test's tmp dir, and to
$RIGBASE_TEST_ARTIFACTS/console/ when that is set (CI keeps it)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.fixtures.control_plane import ControlPlane
from tests.fixtures.finalize import finish_finalize
from tests.provisioner.test_join_http import Minion, api, cp, minion, token, wait_state

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

__all__ = ["cp", "minion"]

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FAILING = {"ok": False, "rules": [{"rule": "nvme_capacity", "ok": False}, {"rule": "tpm", "ok": True}]}

pytestmark = pytest.mark.skipif(
    not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
    reason="needs Debian's chromium and chromium-driver (scripts/install-deps.sh)",
)


class Screens:
    """Saves a screenshot of the page the browser shows, numbered in the order taken."""

    def __init__(self, driver: WebDriver, tmp: Path) -> None:
        self.driver = driver
        self.dirs = [tmp / "screens"]
        if os.environ.get("RIGBASE_TEST_ARTIFACTS"):
            self.dirs.append(Path(os.environ["RIGBASE_TEST_ARTIFACTS"]) / "console")
        for d in self.dirs:
            d.mkdir(parents=True, exist_ok=True)
        self.count = 0

    def take(self, name: str) -> None:
        self.count += 1
        first = self.dirs[0] / f"{self.count:02d}-{name}.png"
        assert self.driver.save_screenshot(str(first)), f"no screenshot of {name}"
        for d in self.dirs[1:]:
            shutil.copy2(first, d / first.name)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    opts = Options()
    opts.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        "--no-sandbox",  # as root in CI containers
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--ignore-certificate-errors",  # the test session's CA is not in Chromium's store
        "--window-size=1280,800",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def text(driver: WebDriver) -> str:
    return str(driver.find_element(By.TAG_NAME, "main").text)


def _detached(element: WebElement) -> bool:
    """The element left the document. Chromedriver says so either as a stale reference or, while the new
    page replaces the old one, as "Node with given id does not belong to the document"."""
    try:
        element.is_enabled()
    except WebDriverException:  # StaleElementReferenceException is one
        return True
    return False


def follow(driver: WebDriver, button: WebElement) -> None:
    """Click a link or a form's button and wait until the browser shows the next page (not the old one)."""
    old = driver.find_element(By.TAG_NAME, "html")
    button.click()
    WebDriverWait(driver, 15).until(lambda d: _detached(old))
    WebDriverWait(driver, 15).until(lambda d: d.execute_script("return document.readyState") == "complete")


def live_text(driver: WebDriver, selector: str) -> str:
    """The text of the element the CSS `selector` finds ("" if none), read in one step inside the page. The
    console's live refresh replaces what a [data-live] region holds whenever the server's copy differs, so an
    element found by one WebDriver call can be gone (a stale reference) by the next call that reads it."""
    script = "const e = document.querySelector(arguments[0]); return e ? e.innerText.trim() : '';"
    return str(driver.execute_script(script, selector))


def flash(driver: WebDriver) -> str:
    """The one line the page shows after a post: what was done, or the API's refusal."""
    found = driver.find_elements(By.CSS_SELECTOR, "p.flash.ok, p.flash.error")
    return str(found[0].text) if found else f"(no message on {driver.current_url}: {text(driver)[:300]})"


def test_an_operator_adopts_a_minion_and_activates_it_in_the_browser(  # noqa: PLR0915
    cp: ControlPlane,
    minion: Callable[..., Minion],
    browser: WebDriver,
    tmp_path: Path,
) -> None:
    shots = Screens(browser, tmp_path)
    jt = token(cp)
    good, bad = minion(), minion()
    assert good.join(jt).status_code == 202  # attested, pending
    refused = bad.begin(jt, requirements=FAILING)
    assert refused.status_code == 403 and refused.json()["code"] == "join_requirements_failed"

    # sign in with the keyboard: the token field has focus, Enter submits
    browser.get(f"{cp.url}/signin")
    shots.take("signin")
    field = browser.find_element(By.ID, "token")
    assert browser.switch_to.active_element == field
    old = browser.find_element(By.TAG_NAME, "html")
    field.send_keys(cp.token, Keys.ENTER)
    WebDriverWait(browser, 15).until(lambda d: _detached(old))
    assert "Resources Dashboard" in text(browser)
    cookie = browser.get_cookie("rigbase_console")
    assert cookie and cookie["httpOnly"] and cookie["secure"] and cookie["sameSite"] == "Strict"
    assert cp.token not in cookie["value"]
    assert "lab" in text(browser)
    shots.take("resources")

    # pending minions: inventory and verdicts, and the Add form prefilled with the minion_id
    follow(browser, browser.find_element(By.LINK_TEXT, "Pending minions"))
    card = browser.find_element(By.CSS_SELECTOR, f'section[data-minion="{good.minion_id}"]')
    assert "pass" in card.text and "lab" in card.text
    failing = browser.find_element(By.CSS_SELECTOR, f'section[data-minion="{bad.minion_id}"]')
    assert "fail: nvme_capacity" in failing.text
    shots.take("pending")
    prefilled = card.find_element(By.NAME, "minion_id").get_attribute("value")
    assert prefilled == good.minion_id
    name = card.find_element(By.NAME, "name").get_attribute("value")
    assert name == f"node-{good.minion_id[:8]}"
    follow(browser, card.find_element(By.CSS_SELECTOR, "button[type=submit]"))

    # the region's dashboard: the new node in the Compute Nodes grid, waiting for its minion
    assert f"node {name} added" in flash(browser)
    row = browser.find_element(By.CSS_SELECTOR, f'#compute tr[data-node="{name}"]')
    assert "new" in row.text and not row.find_elements(By.TAG_NAME, "form")  # nothing to toggle yet
    assert "No device in this region." in browser.find_element(By.ID, "devices").text
    shots.take("region-new-node")

    # the minion's next attempt joins; it finalizes and the node reaches maintenance
    joined = good.join(jt)
    assert joined.status_code == 200, joined.text
    node = joined.json()
    finish_finalize(cp.url, node["node_id"], node["node_credential"])
    wait_state(cp, name, "maintenance")
    browser.refresh()
    row = browser.find_element(By.CSS_SELECTOR, f'#compute tr[data-node="{name}"]')
    assert "maintenance" in row.text
    shots.take("region-maintenance")
    follow(browser, row.find_element(By.CSS_SELECTOR, "form button"))
    assert f"node {name} is active" in flash(browser)
    assert "active" in live_text(browser, f'#compute tr[data-node="{name}"]')
    assert api(cp, "GET", f"/v1/nodes/{name}")["state"] == "active"
    shots.take("region-active")

    # the node page: state, history, verdicts
    follow(browser, browser.find_element(By.LINK_TEXT, name))
    assert browser.find_element(By.ID, "node-state").text == "active"
    page = text(browser)
    for step in ("enrolling", "provisioning", "maintenance", "maintenance off by operator"):
        assert step in page, step
    shots.take("node")

    # the refused join's reason
    follow(browser, browser.find_element(By.LINK_TEXT, "Refusals"))
    reason = browser.find_element(By.CSS_SELECTOR, f'tr[data-minion="{bad.minion_id}"]').text
    assert "join_requirements_failed" in reason and "nvme_capacity" in reason
    shots.take("refusals")

    # a form whose CSRF token is taken out is refused, and nothing changes
    browser.get(f"{cp.url}/nodes/{node['node_id']}")
    browser.execute_script("document.querySelectorAll('input[name=csrf]').forEach(e => e.remove())")
    follow(
        browser,
        browser.find_element(By.XPATH, "//button[normalize-space()='Put in maintenance']"),
    )
    assert "no valid CSRF token" in text(browser)
    assert api(cp, "GET", f"/v1/nodes/{name}")["state"] == "active"
    shots.take("csrf-refused")

    # on a phone
    browser.set_window_size(390, 844)
    browser.get(f"{cp.url}/regions/{api(cp, 'GET', '/v1/regions/lab')['id']}")
    assert "Compute Nodes" in text(browser)
    width = browser.execute_script("return document.documentElement.scrollWidth")
    assert width <= 400, f"the page scrolls sideways on a phone ({width} px)"
    shots.take("region-phone")
