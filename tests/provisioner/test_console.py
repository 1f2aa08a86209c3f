"""The operator's console over real HTTP (`provision serve`, TLS): sign-in with an operator token, the
session cookie's flags and contents, CSRF refusals, sign-out and revocation ending the session, the
API's one-line refusals shown on the page, account isolation, HTML 404s for unknown pages while the API
keeps its JSON, and no console route in the OpenAPI document. The browser itself: test_console_browser.py."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from contracts.bundle import parse_bundle
from tests.fixtures.control_plane import ControlPlane, start_control_plane

BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"  # Chromium's
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with start_control_plane(tmp_path_factory.mktemp("console-cp") / "home") as server:
        yield server


def browser(cp: ControlPlane) -> httpx.Client:
    """A cookie-keeping client, as a browser is (no Authorization header)."""
    return httpx.Client(base_url=cp.url, verify=cp.verify, timeout=30, headers={"Accept": BROWSER_ACCEPT})


def csrf_of(page: httpx.Response) -> str:
    found = CSRF.search(page.text)
    assert found, page.text
    return found.group(1)


def sign_in(client: httpx.Client, token: str) -> httpx.Response:
    form = client.get("/signin")
    return client.post("/signin", data={"csrf": csrf_of(form), "token": token, "next": "/"})


def flash(page: httpx.Response) -> str:
    found = re.search(r'<p class="flash (?:ok|error)"[^>]*>(.*?)</p>', page.text, re.S)
    return html.unescape(found.group(1)).strip() if found else ""


def session_cookies(answer: httpx.Response) -> list[str]:
    """The session cookies an answer sets (not the ones it clears)."""
    return [
        c
        for c in answer.headers.get_list("set-cookie")
        if c.startswith("rigbase_console=") and not c.startswith('rigbase_console="";')
    ]


def api(cp: ControlPlane, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    with cp.client() as client:
        answer = client.request(method, path, json=body)
    assert answer.is_success, answer.text
    return answer.json()


def test_sign_in_sets_a_signed_strict_cookie_and_refuses_bad_tokens(cp: ControlPlane) -> None:
    with browser(cp) as client:
        assert client.get("/", follow_redirects=False).headers["location"] == "/signin"
        wrong = sign_in(client, "rbo_" + "x" * 43)
        assert wrong.status_code == 303 and wrong.headers["location"] == "/signin"
        shown = client.get("/signin")
        # the API's own one line for a bad bearer token
        assert flash(shown) == (
            "error: the bearer token is not valid: "
            "use the token in the client config written by `provision serve`"
        )
        assert not session_cookies(wrong)
        ok = sign_in(client, cp.token)
        assert ok.status_code == 303 and ok.headers["location"] == "/"
        [cookie] = session_cookies(ok)
        flags = {part.strip().lower() for part in cookie.split(";")[1:]}
        assert {"httponly", "secure", "samesite=strict", "path=/"} <= flags, cookie
        value = cookie.split(";")[0].split("=", 1)[1]
        assert cp.token not in value and cp.token.removeprefix("rbo_")[:12] not in value
        home = client.get("/")
        assert home.status_code == 200 and "Resources Dashboard" in home.text
        assert "operator:admin" in home.text and "signed in as operator:admin" in flash(home)
        assert (
            home.headers["x-frame-options"] == "DENY"
            and "frame-ancestors 'none'" in home.headers["content-security-policy"]
        )


def test_posts_without_a_valid_csrf_token_are_refused(cp: ControlPlane) -> None:
    with browser(cp) as client:
        # the sign-in form itself: no token, or one not bound to this browser's sign-in cookie
        bare = client.post("/signin", data={"token": cp.token})
        assert bare.status_code == 403 and "no valid CSRF token" in bare.text
        assert not session_cookies(bare)
        sign_in(client, cp.token)
        with browser(cp) as other:
            sign_in(other, cp.token)
            foreign = csrf_of(other.get("/"))
        before = api(cp, "GET", "/v1/regions")["items"]
        for data in ({"name": "csrf-less", "provider": "physical"}, {"name": "x", "csrf": foreign}):
            refused = client.post("/regions", data={"provider": "physical", **data})
            assert refused.status_code == 403, refused.text
            assert "error: the form carries no valid CSRF token: reload the page and submit it again" in (
                html.unescape(refused.text)
            )
        assert api(cp, "GET", "/v1/regions")["items"] == before  # nothing was done


def test_actions_call_the_services_and_show_the_apis_one_line_refusals(cp: ControlPlane) -> None:
    with browser(cp) as client:
        sign_in(client, cp.token)
        home = client.get("/")
        token = csrf_of(home)
        if "Enable Physical" in home.text:
            client.post("/providers", data={"csrf": token, "kind": "physical"})
        made = client.post(
            "/regions",
            data={
                "csrf": token,
                "name": "web",
                "provider": "physical",
                "storage_mode": "local",
                "public_jobs": "on",
            },
        )
        region_id = api(cp, "GET", "/v1/regions/web")["id"]
        assert made.headers["location"] == f"/regions/{region_id}"
        dashboard = client.get(made.headers["location"])
        assert flash(dashboard) == "region web created"
        for grid in ("Compute Nodes", "Storage Nodes", "Devices", "Datastores", "Reservations"):
            assert f">{grid}</h2>" in dashboard.text
        assert "No device in this region." in dashboard.text
        # the region's enrollment bundle: a loopback URL is refused as the CLI refuses it, then allowed
        bundle_form = {"csrf": token, "control_plane_url": cp.url, "ttl": "1h"}
        dead = client.post(f"/regions/{region_id}/bundle", data=bundle_form, follow_redirects=True)
        assert flash(dead).startswith(f"error: control plane URL {cp.url} is this machine's loopback")
        file = client.post(f"/regions/{region_id}/bundle", data={**bundle_form, "allow_loopback": "on"})
        assert file.headers["content-disposition"] == 'attachment; filename="rigbase-bundle-web.json"'
        bundle = parse_bundle(file.json())
        assert bundle.control_plane_url == cp.url and bundle.join_token.startswith("rbj_")
        assert bundle.ca_certificate == cp.ca.read_text()
        quota = client.get(f"/regions/{region_id}/quota")
        assert "region &#39;web&#39; is a physical region, which has no quota" in quota.text
        assert client.get("/jobs").status_code == 200
        again = client.post(
            "/regions", data={"csrf": token, "name": "web", "provider": "physical"}, follow_redirects=True
        )
        assert flash(again).startswith("error: region 'web' already exists")
        bad = client.post(
            "/nodes",
            data={
                "csrf": token,
                "region": region_id,
                "name": "n1",
                "minion_id": "nope",
                "back": f"/regions/{region_id}",
            },
            follow_redirects=True,
        )
        assert flash(bad) == (
            "error: minion_id 'nope' is not 32 lowercase hex characters: "
            "copy it from the node's console banner"
        )
        added = client.post(
            f"/regions/{region_id}/datastores",
            data={"csrf": token, "name": "scratch", "type": "nfs", "address": "10.0.0.5", "root": "/export"},
            follow_redirects=True,
        )
        assert flash(added) == "datastore scratch added" and ">scratch</td>" in added.text
        port = client.post(
            f"/regions/{region_id}/reservations",
            data={"csrf": token, "name": "web", "hostname": "web", "port": "70000", "protocol": "tcp"},
            follow_redirects=True,
        )
        assert flash(port).startswith("error: port 70000 is out of range: use 1-65535")
        rsv = client.post(
            f"/regions/{region_id}/reservations",
            data={"csrf": token, "name": "web", "hostname": "web", "port": "8080", "protocol": "tcp"},
            follow_redirects=True,
        )
        assert flash(rsv) == "reservation web added: assign it to a node"
        assert [r["name"] for r in api(cp, "GET", f"/v1/reservations?region={region_id}")["items"]] == ["web"]
        node = client.post(
            "/nodes",
            data={"csrf": token, "region": region_id, "name": "gpu-a", "minion_id": "d" * 32, "upnp": "on"},
            follow_redirects=True,
        )
        assert flash(node) == "node gpu-a added: it is new until its minion joins and finalizes"
        rsv_id = api(cp, "GET", f"/v1/reservations/web?region={region_id}")["id"]
        node_id = api(cp, "GET", f"/v1/nodes/gpu-a?region={region_id}")["id"]
        back = f"/regions/{region_id}"
        assigned = client.post(
            f"/reservations/{rsv_id}/assign",
            data={"csrf": token, "node": node_id, "back": back},
            follow_redirects=True,
        )
        assert flash(assigned) == "reservation web assigned to node gpu-a"
        assert api(cp, "GET", f"/v1/reservations/{rsv_id}")["node"] == "gpu-a"
        unassigned = client.post(
            f"/reservations/{rsv_id}/unassign", data={"csrf": token, "back": back}, follow_redirects=True
        )
        assert flash(unassigned) == "reservation web unassigned"
        ds_id = api(cp, "GET", "/v1/datastores/scratch")["id"]
        confirm = client.get(f"/datastores/{ds_id}/remove")
        assert "Remove datastore scratch" in confirm.text
        gone = client.post(f"/datastores/{ds_id}/remove", data={"csrf": token}, follow_redirects=True)
        assert flash(gone) == "datastore scratch removed"


def test_other_accounts_regions_look_missing(cp: ControlPlane) -> None:
    api(cp, "POST", "/v1/accounts", {"name": "acme"})
    # an admin: a member's change is refused for its role first (403), before any region is looked up
    acme = api(cp, "POST", "/v1/operator-tokens", {"name": "acme-ops", "account": "acme", "role": "admin"})
    lab = api(cp, "POST", "/v1/regions", {"name": "root-only", "provider": "physical"})
    with browser(cp) as client:
        sign_in(client, str(acme["token"]))
        home = client.get("/")
        assert home.status_code == 200 and "root-only" not in home.text
        hidden = client.get(f"/regions/{lab['id']}")
        assert hidden.status_code == 404
        assert f"error: region '{lab['id']}' does not exist: see `provision region list`" in html.unescape(
            hidden.text
        )
        token = csrf_of(home)
        post = client.post(
            f"/regions/{lab['id']}/datastores",
            data={"csrf": token, "name": "x", "type": "nfs", "address": "10.0.0.9", "root": "/x"},
            follow_redirects=True,
        )
        assert flash(post).startswith(f"error: region '{lab['id']}' does not exist")
        assert api(cp, "GET", f"/v1/datastores?region={lab['id']}")["items"] == []


def test_sign_out_and_revocation_end_the_session(cp: ControlPlane) -> None:
    made = api(cp, "POST", "/v1/operator-tokens", {"name": "short-lived"})
    with browser(cp) as client:
        sign_in(client, str(made["token"]))
        cookie = client.cookies["rigbase_console"]
        token = csrf_of(client.get("/"))
        out = client.post("/signout", data={"csrf": token})
        assert out.status_code == 303 and out.headers["location"] == "/signin"
        assert 'rigbase_console=""' in out.headers["set-cookie"] or "Max-Age=0" in out.headers["set-cookie"]
    with browser(cp) as replayed:  # the signed-out cookie, sent again, is refused
        replayed.cookies.set("rigbase_console", cookie)
        assert replayed.get("/", follow_redirects=False).headers["location"] == "/signin"
    with browser(cp) as client:
        sign_in(client, str(made["token"]))
        assert client.get("/").status_code == 200
        api(cp, "DELETE", "/v1/operator-tokens/short-lived")
        ended = client.get("/", follow_redirects=True)
        assert flash(ended) == "error: operator token 'short-lived' is revoked: sign in with a live token"


def test_unknown_pages_are_html_404s_and_the_api_keeps_its_shape(cp: ControlPlane) -> None:
    with browser(cp) as client:
        sign_in(client, cp.token)
        page = client.get("/no/such/page")
        assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")
        assert "no such page: /no/such/page" in page.text
        missing = client.get("/nodes/node_doesnotexist")
        assert (
            missing.status_code == 404 and "node &#39;node_doesnotexist&#39; does not exist" in missing.text
        )
    unknown = httpx.get(f"{cp.url}/no/such/page", verify=cp.verify)  # not a browser: the API's JSON
    assert unknown.status_code == 404 and unknown.json()["code"] == "not_found"
    api_404 = httpx.get(
        f"{cp.url}/v1/no-such", headers={"Authorization": f"Bearer {cp.token}"}, verify=cp.verify
    )
    assert api_404.status_code == 404 and api_404.json()["code"] == "not_found"
    doc = httpx.get(f"{cp.url}/openapi.json", verify=cp.verify).json()
    beside = {"/healthz", "/metrics"}  # the API's two routes outside /v1: liveness and the Prometheus scrape
    assert all(p.startswith("/v1/") or p in beside for p in doc["paths"]), sorted(doc["paths"])
    assert (
        httpx.get(f"{cp.url}/static/console.css", verify=cp.verify)
        .headers["content-type"]
        .startswith("text/css")
    )


def test_storage_node_replace_and_remove_with_confirmation(cp: ControlPlane) -> None:
    old_id, new_id = "a" * 32, "b" * 32
    with browser(cp) as client:
        sign_in(client, cp.token)
        token = csrf_of(client.get("/"))
        made = client.post(
            "/regions", data={"csrf": token, "name": "hub", "provider": "physical", "storage_mode": "central"}
        )
        region = made.headers["location"]
        region_id = region.rsplit("/", 1)[1]
        # a compute node first: the API's rule, in its words
        first = client.post(
            "/nodes",
            data={"csrf": token, "region": region_id, "name": "gpu-1", "minion_id": "c" * 32, "back": region},
            follow_redirects=True,
        )
        assert flash(first).startswith("error: region 'hub' uses central storage and has no storage node yet")
        added = client.post(
            "/nodes",
            data={
                "csrf": token,
                "region": region_id,
                "name": "store",
                "minion_id": old_id,
                "service": "storage",
            },
            follow_redirects=True,
        )
        assert flash(added) == "node store added: it is new until its minion joins and finalizes"
        assert "Replace Node" in added.text and 'data-node="store"' in added.text
        # toggling maintenance of a node still waiting for its minion: the API's refusal
        store = api(cp, "GET", f"/v1/nodes/store?region={region_id}")
        waiting = client.post(
            f"/nodes/{store['id']}/maintenance", data={"csrf": token, "mode": "toggle"}, follow_redirects=True
        )
        assert flash(waiting).startswith("error: node 'store' is new: it waits for its minion to join")
        # reservations go to compute nodes only: the API's refusal
        client.post(
            f"/regions/{region_id}/reservations",
            data={"csrf": token, "name": "api", "hostname": "api", "port": "8443"},
        )
        rsv = api(cp, "GET", f"/v1/reservations/api?region={region_id}")
        assigned = client.post(
            f"/reservations/{rsv['id']}/assign",
            data={"csrf": token, "node": store["id"], "back": region},
            follow_redirects=True,
        )
        assert flash(assigned) == (
            "error: node 'store' is a storage node: "
            "assign reservation 'api' to a compute node of region 'hub'"
        )
        # replace: a form for the new minion_id; the new node's page follows
        assert "New minion_id" in client.get(f"/nodes/{store['id']}/replace").text
        replaced = client.post(
            f"/nodes/{store['id']}/replace", data={"csrf": token, "minion_id": new_id}, follow_redirects=True
        )
        assert flash(replaced).startswith("storage node store now waits for minion " + new_id)
        now = api(cp, "GET", f"/v1/nodes/store?region={region_id}")
        assert now["minion_id"] == new_id and now["id"] != store["id"]
        # remove asks first; the confirmation posts
        confirm = client.get(f"/nodes/{now['id']}/remove")
        assert (
            "Remove storage node &#39;store&#39;" in confirm.text
            and f'action="/nodes/{now["id"]}/remove"' in confirm.text
        )
        removed = client.post(f"/nodes/{now['id']}/remove", data={"csrf": token}, follow_redirects=True)
        assert flash(removed) == "node store removed" and 'data-node="store"' not in removed.text
        history = client.get(f"/nodes/{now['id']}")
        assert history.status_code == 200 and "removed by operator" in history.text
