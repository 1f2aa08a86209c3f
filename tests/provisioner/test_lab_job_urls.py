"""A served job in the local lab, for real (docs/job-urls.md): the lab node's minion starts an endpoint's
server in a rootful podman container, reports it `starting` (with the reason) until GET / answers, then
`running`; the URL on the control plane reaches it through the minion's outbound tunnel (the node never
accepts a connection), a private endpoint refuses a caller without a token, and an ended job answers 410.

A notebook in the lab, for real: `provision lab notebook-image` builds JupyterLab over the lab's image, the
minion starts it, and headless Chromium signs in to the console, follows the job page's link through the
control plane, opens a notebook in JupyterLab and runs a cell whose answer comes back over the kernel's
WebSocket through the tunnel."""

from __future__ import annotations

import json
import ssl
import time
from pathlib import Path
from typing import Any

import httpx
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.provisioner.test_console_browser import browser  # noqa: F401 - a fixture, used by name
from tests.provisioner.test_lab import (  # noqa: F401 - the fixtures are used by name
    cached_lab_home,
    lab_home,
    lab_namespaces,
    provision,
    rootfs_cache,
)
from tests.provisioner.test_lab_jobs import EXAMPLES, _job, _ok, _wait_state

LAB_UI_TIMEOUT_S = 120  # JupyterLab's first load: its bundles, then a kernel started in the container


def _client(home: Path) -> tuple[dict[str, str], httpx.Client]:
    config = json.loads((home / "client.json").read_text())
    return config, httpx.Client(verify=ssl.create_default_context(cafile=config["ca"]), timeout=30)


def test_an_endpoint_in_the_lab_runs_once_it_answers_and_its_url_reaches_it(
    cached_lab_home: Path,  # noqa: F811
) -> None:
    home = cached_lab_home
    up = provision(home, "lab", "up", "--nodes", "1", "--json", timeout=300)
    assert up.returncode == 0, up.stderr[-3000:]
    _ok(home, "node", "maintenance", "node-1", "off")
    _ok(home, "job", "create", "-f", str(EXAMPLES / "lab-endpoint.yaml"), "-y")
    reasons: list[str] = []
    deadline = time.monotonic() + 120
    while (job := _job(home, "hello-endpoint"))["state"] != "running":
        assert job["state"] in ("waiting", "starting"), job
        assert time.monotonic() < deadline, f"still {job['state']}: {job.get('reason')}"
        reasons.append(job.get("reason") or "")
        time.sleep(0.3)
    assert any("waiting for its server to answer GET / on port 8000" in r for r in reasons), reasons

    shown: dict[str, Any] = json.loads(_ok(home, "job", "url", "hello-endpoint", "--json"))
    assert shown["ready"] and shown["connected"] and not shown["public"], shown
    assert shown["url"].endswith(f"/j/{job['id']}/")
    config, client = _client(home)
    with client:
        answer = client.get(shown["url"], headers={"Authorization": f"Bearer {config['token']}"})
        assert answer.status_code == 200 and answer.text == "hello from hello-endpoint\n", answer.text
        assert client.get(shown["url"]).status_code == 401  # private: no token, no answer
        _ok(home, "job", "stop", "hello-endpoint")
        _wait_state(home, "hello-endpoint", {"stopped"})
        gone = client.get(shown["url"], headers={"Authorization": f"Bearer {config['token']}"})
        assert gone.status_code == 410 and "stopped" in gone.json()["message"]


def _cell_output(driver: WebDriver) -> str:
    outputs = driver.find_elements(By.CSS_SELECTOR, ".jp-Notebook .jp-OutputArea-output")
    return str(outputs[-1].text) if outputs else ""


def test_a_notebook_in_the_lab_opens_from_the_console_and_its_kernel_answers_in_chromium(
    cached_lab_home: Path,  # noqa: F811
    browser: WebDriver,  # noqa: F811
    tmp_path: Path,
) -> None:
    home = cached_lab_home
    up = provision(home, "lab", "up", "--nodes", "1", "--json", timeout=300)
    assert up.returncode == 0, up.stderr[-3000:]
    built = json.loads(_ok(home, "lab", "notebook-image", "--json", timeout=900))
    assert built["image"] == "localhost/rigbase-lab-notebook:latest" and built["id"], built
    _ok(home, "node", "maintenance", "node-1", "off")
    # an image without Jupyter (the lab's plain one) fails at once, saying so in its log
    plain = tmp_path / "plain-notebook.yaml"
    plain.write_text(
        (EXAMPLES / "lab-notebook.yaml")
        .read_text()
        .replace("name: lab-notebook", "name: no-jupyter")
        .replace("localhost/rigbase-lab-notebook:latest", "localhost/rigbase-lab:latest")
    )
    _ok(home, "job", "create", "-f", str(plain), "-y")
    failed = _wait_state(home, "no-jupyter", {"failed", "running"}, timeout=120)
    assert failed["state"] == "failed" and "127" in (failed["reason"] or ""), failed
    assert "this image has no `jupyter` command" in _ok(home, "job", "logs", "no-jupyter")
    job_id = _ok(home, "job", "create", "-f", str(EXAMPLES / "lab-notebook.yaml"), "-y").strip()
    job = _wait_state(home, "lab-notebook", {"running"}, timeout=180)
    assert job["id"] == job_id, job

    config = json.loads((home / "client.json").read_text())
    browser.get(f"{config['url']}/signin")
    browser.find_element(By.ID, "token").send_keys(config["token"], Keys.ENTER)
    WebDriverWait(browser, 30).until(lambda d: "Resources Dashboard" in d.page_source)
    browser.get(f"{config['url']}/jobs/{job_id}")
    link = browser.find_element(By.ID, "job-url")
    assert link.get_attribute("href") == f"{config['url']}/j/{job_id}/lab"
    console = browser.current_window_handle
    link.click()  # target=_blank: JupyterLab opens in a tab of its own, signed in by the console's session
    WebDriverWait(browser, 15).until(lambda d: len(d.window_handles) == 2)
    browser.switch_to.window(next(h for h in browser.window_handles if h != console))
    wait = WebDriverWait(browser, LAB_UI_TIMEOUT_S)
    card = wait.until(
        lambda d: next(
            iter(d.find_elements(By.CSS_SELECTOR, '.jp-LauncherCard[data-category="Notebook"]')), None
        )
    )
    assert browser.current_url.startswith(f"{config['url']}/j/{job_id}/lab"), browser.current_url
    card.click()
    editor = wait.until(
        lambda d: next(iter(d.find_elements(By.CSS_SELECTOR, ".jp-Notebook .jp-Cell .cm-content")), None)
    )
    # a cell run before the notebook has its kernel is dropped, not queued: wait for the kernel to be idle
    wait.until(lambda d: "(ipykernel) | Idle" in d.find_element(By.ID, "jp-main-statusbar").text)
    editor.click()
    ActionChains(browser).send_keys("6*7").key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(
        Keys.SHIFT
    ).perform()
    try:
        wait.until(lambda d: _cell_output(d) == "42")
    finally:
        browser.save_screenshot(str(tmp_path / "notebook.png"))  # what a failure looked like
    # the kernel is known to the control plane's view of the job: the minion reads it as activity
    _, client = _client(home)
    with client:
        shown = json.loads(_ok(home, "job", "url", "lab-notebook", "--json"))
        assert shown["ready"] and shown["url"].endswith(f"/j/{job_id}/"), shown
        kernels = client.get(
            shown["url"] + "api/kernels", headers={"Authorization": f"Bearer {config['token']}"}
        )
        assert kernels.status_code == 200 and len(kernels.json()) == 1, kernels.text
