"""The console's jobs, billing and devices pages over real HTTP (`provision serve`, TLS), against the fleet
of the jobs API tests (regions with active nodes, a second account): submit a job from the form (dry run
first: nothing stored), its page and the JSON log the page's script follows by offset (the node ships the
log over its real credential route), a bad spec shown line by line with the text kept, stop with CSRF,
the billing page (balance, ledger, usage), the devices grid with its Set Device Config and Deploy forms
(configurations made through the API, CSRF, the inference status the device reports), the script under
the CSP, and account isolation of every new page and action (another account's job, ledger or device
answers 404)."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from provisioner.domain.states import NodeState
from provisioner.services.devices import device_deployments as deployments
from provisioner.services.fleet import nodes
from tests.provisioner.test_console import browser, csrf_of, flash, sign_in
from tests.provisioner.test_devices import ORIN_NX
from tests.provisioner.test_jobs_api import Fleet, mine, report, running_fleet

SPEC = """name: {name}
type: training
resources:
  gpu_count: 1
  gpu_types: [RTX 3090]
workers:
  - echo hello
environment:
  image: localhost/rigbase-job:test
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("console-jobs") / "home") as f:
        yield f


def api(fleet: Fleet, method: str, path: str, body: dict[str, Any] | None = None, token: str = "") -> Any:
    with fleet.http(token or None) as http:
        answer = http.request(method, path, json=body)
    assert answer.is_success, answer.text
    return answer.json()


def submit(client: httpx.Client, spec: str, do: str = "submit") -> httpx.Response:
    token = csrf_of(client.get("/jobs/new"))
    return client.post("/jobs", data={"csrf": token, "spec": spec, "project": "default", "do": do})


def log_page(client: httpx.Client, job_id: str, offset: int) -> dict[str, Any]:
    answer = client.get(f"/jobs/{job_id}/log", params={"worker": 0, "offset": offset})
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/json", answer.text
    page: dict[str, Any] = answer.json()
    return page


def test_submit_dry_run_then_job_page_follows_the_log(fleet: Fleet) -> None:
    with browser(fleet.cp) as client:
        sign_in(client, fleet.cp.token)
        form = client.get("/jobs/new")
        assert form.status_code == 200 and 'name="spec"' in form.text
        dry = submit(client, SPEC.format(name="console-1"), do="dry-run")
        assert dry.status_code == 200 and "Where it would run now" in dry.text
        assert "gpu-1" in dry.text and "√" in dry.text and "console-1" in dry.text  # the text is kept
        with fleet.http() as http:
            assert http.get("/v1/jobs/console-1").status_code == 404  # a dry run stores nothing
        made = submit(client, SPEC.format(name="console-1"))
        assert made.status_code == 303, made.text
        job_id = made.headers["location"].rsplit("/", 1)[1]
        shown = client.get(made.headers["location"])
        assert flash(shown) == "job console-1 created: starting on node gpu-1"
        assert 'data-complete="no"' in shown.text and ">Stop job</button>" in shown.text
        assert api(fleet, "GET", f"/v1/jobs/{job_id}")["created_by"] == "operator:admin"

        [worker] = mine(fleet.heartbeat("gpu-1"), job_id)
        fleet.heartbeat("gpu-1", [report(worker, "running", gpu_indices=[0])])
        first = log_page(client, job_id, 0)
        assert (first["data"], first["next_offset"], first["complete"]) == ("", 0, False)
        assert fleet.log("gpu-1", job_id, 0, 0, "line 1\n").status_code == 200
        first = log_page(client, job_id, 0)
        assert (first["data"], first["next_offset"], first["job_state"]) == ("line 1\n", 7, "running")
        assert fleet.log("gpu-1", job_id, 0, 7, "line <2>\n", eof=True).status_code == 200
        fleet.heartbeat("gpu-1", [report(worker, "exited", exit_code=0)])
        rest = log_page(client, job_id, 7)
        assert rest["data"] == "line <2>\n" and rest["complete"] and rest["job_state"] == "succeeded"
        done = client.get(f"/jobs/{job_id}")
        assert 'data-complete="yes"' in done.text and "line 1\nline &lt;2&gt;\n</pre>" in done.text
        assert ">Stop job</button>" not in done.text
        # the scripts the page loads (the chart library, then the console's own), under a CSP that allows
        # this origin's scripts and nothing inline
        assert re.findall(r"<script[^>]*>", done.text) == [
            '<script src="/static/vendor/uplot.js" defer>',
            '<script src="/static/console.js" defer>',
        ]
        charts = client.get("/static/vendor/uplot.js")
        assert charts.status_code == 200 and "uPlot" in charts.text
        csp = done.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "unsafe-inline" not in csp
        script = client.get("/static/console.js")
        assert script.headers["content-type"].startswith("text/javascript") and "data-log-url" in script.text
        listed = client.get("/jobs")
        assert f'href="/jobs/{job_id}"' in listed.text and 'href="/jobs/new"' in listed.text
        missing_worker = client.get(f"/jobs/{job_id}/log", params={"worker": 3})
        assert missing_worker.status_code == 422 and "is not a worker of job" in missing_worker.text
        # digits int() refuses, and an offset past the store's 64-bit integers, are refused, not a 500
        for worker, offset in (("²", "0"), ("0", "²"), ("0", str(2**63)), ("0", "9" * 5000)):
            odd = client.get(f"/jobs/{job_id}/log", params={"worker": worker, "offset": offset})
            assert odd.status_code == 422, (worker, offset[:30], odd.status_code, odd.text[-300:])


def test_a_bad_spec_is_shown_line_by_line_with_the_text_kept(fleet: Fleet) -> None:
    bad = SPEC.format(name="console-bad").replace("  image: localhost/rigbase-job:test\n", "  gpu: x\n")
    with browser(fleet.cp) as client:
        sign_in(client, fleet.cp.token)
        refused = submit(client, bad)
        assert refused.status_code == 422, refused.text
        lines = re.findall(r'<p class="line">(.*?)</p>', refused.text, re.S)
        assert [html.unescape(line) for line in lines] == [
            "error: line 9: environment.gpu: unknown field; allowed here: image, env, packages, keys"
        ]
        assert html.escape("gpu: x", quote=False) in refused.text  # the text as typed
        empty = submit(client, "  ")
        assert "error: the job spec is empty" in html.unescape(empty.text)
        taken = submit(client, SPEC.format(name="console-dup"))
        assert taken.status_code == 303
        again = submit(client, SPEC.format(name="console-dup"))
        assert again.status_code == 409 and "already" in html.unescape(again.text)
    with fleet.http() as http:
        assert http.get("/v1/jobs/console-bad").status_code == 404


def test_stop_needs_csrf_and_calls_the_service(fleet: Fleet) -> None:
    with browser(fleet.cp) as client:
        sign_in(client, fleet.cp.token)
        job_id = submit(client, SPEC.format(name="console-stop")).headers["location"].rsplit("/", 1)[1]
        bare = client.post(f"/jobs/{job_id}/stop", data={})
        assert bare.status_code == 403 and api(fleet, "GET", f"/v1/jobs/{job_id}")["state"] != "stopped"
        token = csrf_of(client.get(f"/jobs/{job_id}"))
        stopped = client.post(f"/jobs/{job_id}/stop", data={"csrf": token}, follow_redirects=True)
        assert flash(stopped).startswith("job console-stop is stopped")
        assert api(fleet, "GET", f"/v1/jobs/{job_id}")["state"] == "stopped"
        twice = client.post(f"/jobs/{job_id}/stop", data={"csrf": token}, follow_redirects=True)
        assert flash(twice) == "error: job 'console-stop' already ended (stopped): nothing to stop"


def test_another_accounts_jobs_and_billing_look_missing(fleet: Fleet) -> None:
    job_id = api(fleet, "POST", "/v1/jobs", {"spec": {**_spec("console-private")}})["id"]
    with browser(fleet.cp) as client:
        sign_in(client, fleet.other_token)
        for path in (f"/jobs/{job_id}", f"/jobs/{job_id}/log?worker=0&offset=0", "/billing?account=default"):
            hidden = client.get(path)
            assert hidden.status_code == 404, (path, hidden.text)
        assert "job_" not in client.get("/jobs").text
        token = csrf_of(client.get("/jobs"))
        stop = client.post(f"/jobs/{job_id}/stop", data={"csrf": token}, follow_redirects=True)
        assert flash(stop) == f"error: job '{job_id}' does not exist: see `provision job list`"
    assert api(fleet, "GET", f"/v1/jobs/{job_id}")["state"] != "stopped"


def _spec(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "type": "training",
        "resources": {"gpu_count": 1, "gpu_types": ["RTX 3090"]},
        "workers": ["echo hi"],
        "environment": {"image": "localhost/rigbase-job:test"},
    }


def test_billing_shows_balance_ledger_and_usage(fleet: Fleet) -> None:
    api(
        fleet, "POST", "/v1/billing/credits", {"account": "other", "amount": "12.5", "memo": "console top-up"}
    )
    with browser(fleet.cp) as client:
        sign_in(client, fleet.other_token)
        page = client.get("/billing")
        assert page.status_code == 200, page.text
        assert '<strong id="balance-value">12.500000</strong>' in page.text
        assert "console top-up" in page.text and "+12.500000" in page.text
        # names, not ids: the top-up went from the platform to the account `other`
        assert "platform → other" in page.text and "acc_" not in page.text.split('id="ledger-h"', 1)[1]
        assert "Usage in " in page.text
        bad = client.get("/billing", params={"month": "soon"})
        assert bad.status_code == 422 and "month &#39;soon&#39; is not YYYY-MM" in bad.text
    with browser(fleet.cp) as admin:  # the root account's admins may name any account
        sign_in(admin, fleet.cp.token)
        theirs = admin.get("/billing", params={"account": "other"})
        assert theirs.status_code == 200 and "Billing: account other" in theirs.text


def new_region(client: httpx.Client, token: str, name: str) -> str:
    """A physical region with central storage (where devices join), made from the console: its page."""
    made = client.post(
        "/regions", data={"csrf": token, "name": name, "provider": "physical", "storage_mode": "central"}
    )
    assert made.status_code == 303, made.text
    return str(made.headers["location"])


def add_active(
    client: httpx.Client, fleet: Fleet, token: str, region: str, service: str, name: str, minion: str
) -> str:
    """A node added from the region page's form and brought up as its minion's join would (the jobs tests'
    way), a device reporting an Orin NX; its id."""
    added = client.post(
        "/nodes",
        data={
            "csrf": token,
            "region": region.rsplit("/", 1)[1],
            "name": name,
            "minion_id": minion,
            "service": service,
            "back": region,
        },
        follow_redirects=True,
    )
    assert flash(added).startswith(f"node {name} added"), flash(added)
    with fleet.sessions.begin() as s:
        node = nodes.get(s, name)
        for state in (NodeState.ENROLLING, NodeState.PROVISIONING, NodeState.ACTIVE):
            nodes.transition(s, node, state, actor="minion:test")
        if service == "device":
            nodes.record_report(s, node, inventory={"device": ORIN_NX})
        return node.id


def devices_grid(client: httpx.Client, region: str) -> str:
    shown = client.get(region)
    assert shown.status_code == 200, shown.text
    return shown.text.split('id="devices-h"', 1)[1].split("</section>", 1)[0]


def device_row(client: httpx.Client, region: str, name: str) -> str:
    return devices_grid(client, region).split(f'data-node="{name}"', 1)[1].split("</tr>", 1)[0]


def test_the_devices_grid_lists_device_nodes(fleet: Fleet) -> None:
    with browser(fleet.cp) as client:
        sign_in(client, fleet.cp.token)
        token = csrf_of(client.get("/"))
        region = new_region(client, token, "edge")
        empty = client.get(region)
        assert "No device in this region." in empty.text and ">Add Device</summary>" in empty.text
        assert 'data-live="devices"' in empty.text and 'data-live="compute"' in empty.text
        add_active(client, fleet, token, region, "storage", "store", "e" * 32)
        add_active(client, fleet, token, region, "device", "jetson-1", "f" * 32)
        added = client.get(region)
        grid = devices_grid(client, region)
        assert 'data-node="jetson-1"' in grid and "Put in maintenance" not in grid
        assert "<td>NVIDIA Jetson Orin NX</td>" in grid and ">5.1.2</td>" in grid and ">active</span>" in grid
        assert 'data-node="jetson-1"' not in added.text.split('id="devices-h"', 1)[0]
        assert "No device configuration in this region" in grid and "Set Device Config" not in grid


def test_set_device_config_and_deploy_from_the_devices_grid(fleet: Fleet) -> None:  # noqa: PLR0915
    with browser(fleet.cp) as client:
        sign_in(client, fleet.cp.token)
        token = csrf_of(client.get("/"))
        region = new_region(client, token, "edge-cfg")
        add_active(client, fleet, token, region, "storage", "store-cfg", "d" * 32)  # a device needs one
        device_id = add_active(client, fleet, token, region, "device", "cam-1", "c" * 32)
        config = {"region": "edge-cfg", "image": "reg.lan/detect:1", "model": "yolo", "command": "serve"}
        made = api(fleet, "POST", "/v1/device-configs", {"name": "detect", **config})
        row = device_row(client, region, "cam-1")
        assert f'<option value="{made["id"]}">detect (r1)</option>' in row and ">Set Device Config" in row
        assert ">Deploy" not in row  # nothing to deploy before a configuration is set

        def status() -> dict[str, Any]:
            shown: dict[str, Any] = api(fleet, "GET", f"/v1/nodes/{device_id}/device-status")
            return shown

        # a post without its CSRF token is refused and changes nothing
        bare = client.post(f"/nodes/{device_id}/device-config", data={"config": made["id"]})
        assert bare.status_code == 403 and "CSRF" in bare.text and status()["config"] is None
        assert client.post(f"/nodes/{device_id}/deploy", data={}).status_code == 403

        token = csrf_of(client.get(region))
        unknown = client.post(
            f"/nodes/{device_id}/device-config", data={"csrf": token, "config": "nope"}, follow_redirects=True
        )
        assert flash(unknown).startswith("error: device-config 'nope' does not exist"), flash(unknown)
        assert str(unknown.url).endswith(region) and status()["config"] is None
        empty = client.post(f"/nodes/{device_id}/device-config", data={"csrf": token}, follow_redirects=True)
        assert flash(empty) == "error: device configuration is empty: fill it in and submit again"

        chosen = client.post(
            f"/nodes/{device_id}/device-config",
            data={"csrf": token, "config": made["id"]},
            follow_redirects=True,
        )
        assert flash(chosen) == "device cam-1 set to configuration detect revision 1: Deploy runs it"
        assert (status()["config"], status()["config_revision"], status()["deployed_revision"]) == (
            "detect",
            1,
            None,
        )
        row = device_row(client, region, "cam-1")
        assert "detect r1" in row and ">not deployed</span>" in row and ">Deploy" in row
        assert f'<option value="{made["id"]}" selected>' in row

        deployed = client.post(f"/nodes/{device_id}/deploy", data={"csrf": token}, follow_redirects=True)
        assert flash(deployed) == (
            "device cam-1 is deploying configuration detect revision 1: "
            "it starts at the device's next heartbeat"
        )
        shown = status()
        assert (shown["deployed_revision"], shown["inference_status"]) == (1, "deploying")
        assert 'class="state s-deploying">deploying</span>' in device_row(client, region, "cam-1")

        # what the device's minion reports shows in the row (its heartbeat's report, through the service)
        with fleet.sessions.begin() as s:
            node = nodes.get(s, device_id)
            report = {
                "inference": {"generation": shown["generation"], "state": "failed", "message": "no GPU"}
            }
            deployments.record_actual(s, node, report)
        row = device_row(client, region, "cam-1")
        assert 'class="state s-failed">failed</span>' in row and ">no GPU</span>" in row

        # a new revision: the row says so, and Deploy with "latest" sends it
        api(fleet, "PATCH", f"/v1/device-configs/{made['id']}", {"command": "serve --v2"})
        row = device_row(client, region, "cam-1")
        assert "r2 is the latest" in row and 'name="latest"' in row
        latest = client.post(
            f"/nodes/{device_id}/deploy", data={"csrf": token, "latest": "on"}, follow_redirects=True
        )
        assert "revision 2" in flash(latest) and status()["deployed_revision"] == 2
        generation = status()["generation"]

    # another account's device looks missing: 404, nothing changed
    with browser(fleet.cp) as other:
        sign_in(other, fleet.other_token)
        assert other.get(region).status_code == 404
        theirs = csrf_of(other.get("/"))
        for path, data in (
            (f"/nodes/{device_id}/deploy", {"csrf": theirs}),
            (f"/nodes/{device_id}/device-config", {"csrf": theirs, "config": made["id"]}),
        ):
            hidden = other.post(path, data=data)
            assert hidden.status_code == 404, (path, hidden.text)
            assert f"node &#39;{device_id}&#39; does not exist" in hidden.text
    assert status()["generation"] == generation


def _cells(html: str, table_id: str) -> list[list[str]]:
    body = html.split(f'id="{table_id}"', 1)[1].split("</table>", 1)[0].split("<tbody>", 1)[1]
    return [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)]


def test_the_dashboard_sums_up_gpus_jobs_and_credits_for_the_account_only(fleet: Fleet) -> None:
    cpu_only = {**_spec("console-summary"), "resources": {"gpu_count": 0, "cpu_count": 4}}
    made = api(fleet, "POST", "/v1/jobs", {"spec": cpu_only})
    job_id, node = made["id"], made["node"]
    assert node, made["reason"]
    [worker] = mine(fleet.heartbeat(node), job_id)
    fleet.heartbeat(node, [report(worker, "running")])
    waits = {**_spec("console-waits"), "resources": {"gpu_count": 1, "gpu_types": ["A100 80GB"]}}  # none here
    api(fleet, "POST", "/v1/jobs", {"spec": waits})
    with browser(fleet.cp) as client:
        sign_in(client, fleet.cp.token)
        home = client.get("/").text
        gpus = {row[0]: [int(n) for n in row[1:]] for row in _cells(home, "gpu-summary")}
        assert gpus["RTX 3090"][0] == 2 and gpus["T4"][0] == 1  # the lab's GPUs: total, allocated, healthy
        assert all(total >= allocated and total >= healthy for total, allocated, healthy in gpus.values())
        summary = home.split('id="job-summary"', 1)[1].split("</dl>", 1)[0]
        assert re.search(r"<dt>Running</dt><dd>[1-9][0-9]*</dd>", summary), summary
        assert re.search(r"<dt>Waiting</dt><dd>[1-9][0-9]* [(]the oldest for", summary), summary
        assert len(_cells(home, "paid-per-day")) == 7
        sign_in(client, fleet.other_token)  # another account: none of these regions, nodes or jobs
        other = client.get("/").text
        assert "No GPU node has joined yet." in other and "<dt>Waiting</dt><dd>0</dd>" in other
    api(fleet, "POST", f"/v1/jobs/{job_id}/stop", {})


def test_bulk_maintenance_names_its_direction_and_changes_all_or_nothing(fleet: Fleet) -> None:
    region = api(fleet, "GET", "/v1/regions/lab-1")["id"]
    ids = {n: api(fleet, "GET", f"/v1/nodes/{n}")["id"] for n in ("gpu-1", "gpu-2")}
    fresh = api(fleet, "POST", "/v1/nodes", {"name": "not-joined", "region": "lab-1", "minion_id": "ab" * 16})
    with browser(fleet.cp) as client:
        sign_in(client, fleet.cp.token)
        page = client.get(f"/regions/{region}").text
        assert ">Put in maintenance<" in page and "Toggle" not in page
        token = csrf_of(client.get(f"/regions/{region}"))
        done = client.post(
            f"/regions/{region}/maintenance",
            data={"csrf": token, "mode": "on", "node": list(ids.values())},
            follow_redirects=True,
        )
        assert flash(done) == "2 node(s) in maintenance: gpu-1, gpu-2"
        assert {api(fleet, "GET", f"/v1/nodes/{n}")["state"] for n in ids} == {"maintenance"}
        row = client.get(f"/regions/{region}").text.split('data-node="gpu-1"', 1)[1].split("</tr>", 1)[0]
        assert '<input type="hidden" name="mode" value="off">' in row and ">Make active<" in row
        # one node that cannot: nothing changes, and the line says which and why
        refused = client.post(
            f"/regions/{region}/maintenance",
            data={"csrf": token, "mode": "off", "node": [ids["gpu-1"], fresh["id"]]},
            follow_redirects=True,
        )
        assert flash(refused).startswith("error: node 'not-joined' is new: it waits for its minion")
        assert api(fleet, "GET", "/v1/nodes/gpu-1")["state"] == "maintenance"
        nothing = client.post(
            f"/regions/{region}/maintenance", data={"csrf": token, "mode": "off"}, follow_redirects=True
        )
        assert flash(nothing) == "error: select the nodes first: tick their boxes in the grid"
        client.post(
            f"/regions/{region}/maintenance",
            data={"csrf": token, "mode": "off", "node": list(ids.values())},
        )
        # filters: by name and by state, on the node grid and on the jobs list
        only = client.get(f"/regions/{region}", params={"q": "GPU-2"}).text
        assert 'data-node="gpu-2"' in only and 'data-node="gpu-1"' not in only
        new = client.get(f"/regions/{region}", params={"state": "new"}).text
        assert 'data-node="not-joined"' in new and 'data-node="gpu-2"' not in new
        jobs_page = client.get("/jobs", params={"q": "no-such-job"}).text
        assert "No job matches the filter." in jobs_page
    api(fleet, "DELETE", f"/v1/nodes/{fresh['id']}")


def test_a_regions_compute_grid_comes_in_pages_of_a_hundred(fleet: Fleet) -> None:
    region = api(fleet, "POST", "/v1/regions", {"name": "wide", "provider": "physical"})
    with fleet.sessions.begin() as s:
        for i in range(230):
            nodes.add(s, f"n-{i:03d}", region="wide", minion_id=f"{0xC000 + i:032x}", actor="operator:test")

    def rows(page: str) -> list[str]:
        return re.findall(r'<tr data-node="(n-\d{3})"', page)

    with browser(fleet.cp) as client:
        sign_in(client, fleet.cp.token)
        first = client.get(f"/regions/{region['id']}").text
        assert rows(first) == [f"n-{i:03d}" for i in range(100)]
        assert "Compute nodes 1–100 of 230" in first and 'rel="next"' in first and 'rel="prev"' not in first
        last = client.get(f"/regions/{region['id']}", params={"page": "3"}).text
        assert rows(last) == [f"n-{i:03d}" for i in range(200, 230)] and "201–230 of 230" in last
        assert 'rel="next"' not in last and html.escape("?q=&state=&page=2") in last
        # a page past the end is the last one, and not a number is the first
        assert rows(client.get(f"/regions/{region['id']}", params={"page": "99"}).text) == rows(last)
        assert rows(client.get(f"/regions/{region['id']}", params={"page": "x"}).text) == rows(first)
        # a filter pages what it matched, and a page of it keeps the filter in its links
        matched = client.get(f"/regions/{region['id']}", params={"q": "n-1"}).text
        assert rows(matched) == [f"n-1{i:02d}" for i in range(100)] and "pager" not in matched
        filtered = client.get(f"/regions/{region['id']}", params={"q": "n-", "page": "2"}).text
        assert (
            html.escape("?q=n-&state=&page=3") in filtered and html.escape("?q=n-&state=&page=1") in filtered
        )


def test_a_regions_device_grid_comes_in_pages_and_keeps_the_compute_grids_page(fleet: Fleet) -> None:
    region = api(
        fleet,
        "POST",
        "/v1/regions",
        {"name": "paged-edge", "provider": "physical", "storage_mode": "central"},
    )
    with fleet.sessions.begin() as s:
        storage = nodes.add(
            s, "s-000", region="paged-edge", minion_id=f"{0xD000:032x}", service="storage", actor="t"
        )
        storage.state = "active"  # as if it had joined: devices join a central region once it is
        s.flush()
        for i in range(250):
            nodes.add(
                s,
                f"d-{i:03d}",
                region="paged-edge",
                minion_id=f"{0xE000 + i:032x}",
                service="device",
                actor="t",
            )
        for i in range(150):
            nodes.add(s, f"c-{i:03d}", region="paged-edge", minion_id=f"{0xF000 + i:032x}", actor="t")

    def rows(page: str, prefix: str) -> list[str]:
        return re.findall(rf'<tr data-node="({prefix}-\d{{3}})"', page)

    with browser(fleet.cp) as client:
        sign_in(client, fleet.cp.token)
        first = client.get(f"/regions/{region['id']}").text
        assert [len(rows(first, p)) for p in ("c", "s", "d")] == [100, 1, 100]
        assert "Compute nodes 1–100 of 150" in first and "Devices 1–100 of 250" in first
        # the devices' third page, with the compute grid on its second: each link keeps the other's page
        both = client.get(f"/regions/{region['id']}", params={"page": "2", "devices_page": "3"}).text
        assert rows(both, "d") == [f"d-{i:03d}" for i in range(200, 250)] and "201–250 of 250" in both
        assert rows(both, "c") == [f"c-{i:03d}" for i in range(100, 150)]
        assert rows(both, "s") == ["s-000"]
        assert html.escape("?q=&state=&page=2&devices_page=2#devices") in both  # the devices' previous
        assert html.escape("?q=&state=&page=1&devices_page=3#compute") in both  # the compute grid's
        # a filter pages what it matched in every grid
        matched = client.get(f"/regions/{region['id']}", params={"q": "-00"}).text
        assert [len(rows(matched, p)) for p in ("c", "s", "d")] == [10, 1, 10] and "pager" not in matched


def test_the_data_page_lists_the_projects_objects_and_hides_another_accounts(
    fleet: Fleet, tmp_path: Path
) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("a")
    made = fleet.cp.provision("dataset", "create", "console-set", "--source", str(tmp_path / "d"))
    assert made.returncode == 0, made.stderr
    ours = api(fleet, "GET", "/v1/projects/default")["id"]
    with browser(fleet.cp) as client:
        sign_in(client, fleet.cp.token)
        shown = client.get("/data")
        assert shown.status_code == 200 and "console-set" in shown.text and "ready" in shown.text
        assert "No model in this project yet." in shown.text
        assert 'href="/data"' in shown.text
        token = csrf_of(shown)
        form = {"csrf": token, "project": "default", "kind": "dataset", "name": "from-web"}
        # a local path is the CLI's to upload; the refusal says so, and nothing is stored
        local = client.post("/data", data={**form, "source": str(tmp_path / "d")}, follow_redirects=True)
        assert flash(local).startswith("error: a local path is uploaded from your machine"), flash(local)
        # a remote source: created, downloading (then failed with its one line: a loopback host is not a
        # public address, refused before any connection)
        web = {**form, "source": "http://127.0.0.1:9/none.zip"}
        made_web = client.post("/data", data=web, follow_redirects=True)
        assert flash(made_web).startswith("dataset from-web created (obj_"), flash(made_web)
        assert "from-web" in made_web.text
        # each own object's Remove asks first, then removes it
        (row,) = [r for r in api(fleet, "GET", "/v1/datasets")["items"] if r["name"] == "console-set"]
        asked = client.get(f"/data/dataset/{row['id']}/remove")
        assert asked.status_code == 200 and "Remove dataset console-set" in asked.text
        gone = client.post(
            f"/data/dataset/{row['id']}/remove", data={"csrf": csrf_of(asked)}, follow_redirects=True
        )
        assert flash(gone) == "dataset console-set removed"
        assert "<td>console-set</td>" not in gone.text and "<td>from-web</td>" in gone.text
    with browser(fleet.cp) as client:
        sign_in(client, fleet.other_token)
        assert "from-web" not in client.get("/data").text
        assert client.get("/data", params={"project": ours}).status_code == 404
        # another account's object cannot be removed from its console: the same 404 as for none
        assert client.get(f"/data/dataset/{row['id']}/remove").status_code == 404


def test_a_dry_run_shows_what_would_fail_at_start(fleet: Fleet) -> None:
    """The console's dry run shows the warnings `job create --dry-run` prints: here every node's minion
    told it holds no localhost/ image, so the job's would not start where it would go."""
    for node in fleet.node_ids:
        fleet.heartbeat(node, jobs={"workers": [], "images": {"local": [], "pulls": {}}})
    cpu_job = SPEC.replace("gpu_count: 1\n  gpu_types: [RTX 3090]", "gpu_count: 0\n  cpu_count: 4")
    try:
        with browser(fleet.cp) as client:
            sign_in(client, fleet.cp.token)
            dry = submit(client, cpu_job.format(name="console-warned"), do="dry-run")
            assert dry.status_code == 200 and "Where it would run now" in dry.text
            assert re.search(
                r'role="alert">Warning: node &#39;[\w-]+&#39; does not hold localhost/rigbase-job:test',
                dry.text,
            ), dry.text
    finally:
        held = {"local": ["localhost/rigbase-job:test"], "pulls": {}}
        for node in fleet.node_ids:
            fleet.heartbeat(node, jobs={"workers": [], "images": held})


def test_the_node_page_shows_its_gpus_health(fleet: Fleet) -> None:
    """The node page's GPU table from the node's last GPU health report (docs/minion-jobs.md)."""
    from minion.gpu.health import RecordedReader, assess

    recorded = Path(__file__).resolve().parents[1] / "minion" / "nvml"
    with browser(fleet.cp) as client:
        sign_in(client, fleet.cp.token)
        node_id = fleet.node_ids["gpu-2"]
        before = client.get(f"/nodes/{node_id}").text
        assert "No GPU health report yet" in before
        health = assess(RecordedReader(recorded / "h100x2-busy.json").read(), ours=lambda pid: pid == 4242)
        fleet.heartbeat("gpu-2", extra={"gpu_health": health.model_dump(mode="json")})
        page = client.get(f"/nodes/{node_id}").text
        table = page.split('id="gpu-health"', 1)[1].split("</table>", 1)[0]
        rows = [html.unescape(re.sub(r"<[^>]+>", " ", r)).split() for r in table.split("<tr>")[2:]]
        assert rows[0][:9] == ["0", "ok", "NVIDIA", "H100", "80GB", "HBM3", "gen", "5", "x16"], rows[0]
        assert "97 %" in " ".join(rows[0]) and "612 W" in " ".join(rows[0])
        assert rows[1][1] == "busy" and "outside rigbase's containers (pid 9001)" in " ".join(rows[1])
        assert "Driver 550.127.05" in page
        missing = assess(RecordedReader(recorded / "driver-not-loaded.json").read())
        fleet.heartbeat("gpu-2", extra={"gpu_health": missing.model_dump(mode="json")})
        problem = client.get(f"/nodes/{node_id}").text
        assert (
            'id="gpu-problem">the NVIDIA driver is installed but its kernel module is not loaded' in problem
        )
