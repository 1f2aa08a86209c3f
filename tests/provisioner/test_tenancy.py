"""The multi-tenant attack suite: two accounts on one real `provision serve`, real swtpm joins, each
finding of the tenancy review tried as the attacker would and refused (docs/accounts.md, "Who may do
what"). Account `alpha` owns a private region with a joined node, a datastore, a reservation, a device
configuration and a join token; account `beta` (an admin token and a member token) attacks it. The
price a waiting job pays and the datastore passwords a node gets are tests/provisioner/test_jobs_api.py's
(they need its nodes' heartbeats); the container flags run under real podman in
tests/minion/test_jobs_podman.py."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from provisioner.lab.swtpm import Swtpm, VendorCA
from tests.fixtures.control_plane import ControlPlane, start_control_plane
from tests.fixtures.finalize import finish_finalize
from tests.fixtures.swtpm import _started_copy
from tests.provisioner.test_join_http import Minion

PASSING = {"ok": True, "rules": [{"rule": "tpm", "ok": True}]}


class Fleet:
    """The server, each caller's client, and alpha's resources by kind (their ids)."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.clients: dict[str, httpx.Client] = {}
        self.alpha: dict[str, str] = {}
        self.beta: dict[str, str] = {}

    def as_(self, who: str) -> httpx.Client:
        return self.clients[who]

    def ok(self, who: str, method: str, path: str, body: Any = None) -> Any:
        response = self.as_(who).request(method, path, json=body)
        assert response.is_success, (who, method, path, response.text)
        return response.json()


def _provision(cp: ControlPlane, *args: str) -> str:
    out = cp.provision(*args)
    assert out.returncode == 0, (args, out.stderr)
    return out.stdout.strip()


def _client(cp: ControlPlane, token: str) -> httpx.Client:
    client = cp.client()
    client.headers["Authorization"] = f"Bearer {token}"
    return client


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory,
    tpm_vendor_ca: VendorCA,
    _golden_swtpm: Callable[[VendorCA, int], Swtpm],
) -> Iterator[Fleet]:
    with start_control_plane(tmp_path_factory.mktemp("tenancy") / "home") as cp:
        f = Fleet(cp)
        f.clients["root"] = cp.client()
        for account in ("alpha", "beta"):
            _provision(cp, "account", "create", account)
            for role in ("admin", "member"):
                secret = _provision(
                    cp, "token", "create", f"{account}-{role}", "--account", account, "--role", role
                )
                f.clients[f"{account}_{role}"] = _client(cp, secret.split()[1])
        ca = tmp_path_factory.mktemp("ca") / "vendor.pem"
        ca.write_bytes(b"".join(tpm_vendor_ca.certificate_pems()))
        f.ok("root", "POST", "/v1/providers", {"kind": "physical"})
        f.ok("root", "POST", "/v1/tpm-cas", {"pem": ca.read_text()})
        for account, book in (("alpha", f.alpha), ("beta", f.beta)):
            who = f"{account}_admin"
            book["region"] = f.ok(
                who,
                "POST",
                "/v1/regions",
                {"name": f"{account}-lab", "provider": "physical", "public_jobs": False},
            )["id"]
        # alpha's region: a joined node (real swtpm), a datastore, a reservation, a device configuration
        tpm = _started_copy(_golden_swtpm(tpm_vendor_ca, 900), tmp_path_factory.mktemp("alpha") / "tpm")
        minion = Minion(tpm, cp.url)
        node = f.ok(
            "alpha_admin",
            "POST",
            "/v1/nodes",
            {"name": "a-gpu", "region": "alpha-lab", "minion_id": minion.minion_id},
        )
        f.alpha["node"] = node["id"]
        f.alpha["minion_id"] = minion.minion_id
        jt = f.ok("alpha_admin", "POST", "/v1/regions/alpha-lab/join-tokens", {"ttl": "1h"})
        f.alpha["join_token_id"] = jt["id"]
        joined = minion.join(jt["token"])
        assert joined.status_code == 200, joined.text
        finish_finalize(cp.url, joined.json()["node_id"], joined.json()["node_credential"])
        f.alpha["datastore"] = f.ok(
            "alpha_admin",
            "POST",
            "/v1/datastores",
            {
                "name": "a-data",
                "region": "alpha-lab",
                "type": "smb",
                "address": "192.0.2.10",
                "root": "/share",
                "username": "alpha",
                "password": "alpha-secret",
            },
        )["id"]
        f.alpha["reservation"] = f.ok(
            "alpha_admin",
            "POST",
            "/v1/reservations",
            {"name": "a-web", "region": "alpha-lab", "hostname": "a-web", "port": 8443},
        )["id"]
        f.alpha["device_config"] = f.ok(
            "alpha_admin",
            "POST",
            "/v1/device-configs",
            {
                "name": "a-cam",
                "region": "alpha-lab",
                "image": "docker.io/library/alpine:3.20",
                "model": "yolo",
                "command": "sleep infinity",
            },
        )["id"]
        yield f
        for client in f.clients.values():
            client.close()
        minion.close()
        tpm.remove()


def _snapshot(f: Fleet) -> str:
    """Everything of alpha's that an attack could change, as alpha's admin sees it."""
    parts = [
        f.ok("alpha_admin", "GET", f"/v1/regions/{f.alpha['region']}"),
        f.ok("alpha_admin", "GET", f"/v1/nodes/{f.alpha['node']}"),
        f.ok("alpha_admin", "GET", f"/v1/datastores/{f.alpha['datastore']}"),
        f.ok("alpha_admin", "GET", f"/v1/reservations/{f.alpha['reservation']}"),
        f.ok("alpha_admin", "GET", f"/v1/device-configs/{f.alpha['device_config']}"),
        f.ok("alpha_admin", "GET", f"/v1/regions/{f.alpha['region']}/join-tokens"),
    ]
    for part in parts:
        for volatile in ("last_heartbeat_at", "last_quote_at", "updated_at", "heartbeats"):
            if isinstance(part, dict):
                part.pop(volatile, None)
    return json.dumps(parts, sort_keys=True, default=str)


def _attacks(f: Fleet) -> list[tuple[str, str, Any]]:
    """What the review's member of another account did to alpha's private region, and more of the same."""
    a = f.alpha
    return [
        ("GET", f"/v1/regions/{a['region']}", None),
        ("GET", "/v1/nodes?region=alpha-lab", None),
        ("GET", f"/v1/nodes/{a['node']}", None),
        ("GET", f"/v1/nodes/{a['node']}/history", None),
        ("GET", f"/v1/datastores/{a['datastore']}", None),
        ("GET", f"/v1/reservations/{a['reservation']}", None),
        ("GET", f"/v1/device-configs/{a['device_config']}", None),
        ("GET", f"/v1/regions/{a['region']}/join-tokens", None),
        ("GET", "/v1/pending-minions?region=alpha-lab", None),
        ("DELETE", f"/v1/regions/{a['region']}?force=true", None),
        ("PATCH", f"/v1/regions/{a['region']}", {"public_jobs": True}),
        ("PATCH", f"/v1/regions/{a['region']}", {"jobs_lan": True}),
        ("DELETE", f"/v1/datastores/{a['datastore']}", None),
        ("DELETE", f"/v1/reservations/{a['reservation']}", None),
        ("POST", f"/v1/reservations/{a['reservation']}/expose-wan", {"expose_wan": True}),
        ("POST", f"/v1/nodes/{a['node']}/maintenance", {"mode": "toggle"}),
        ("DELETE", f"/v1/nodes/{a['node']}?force=true", None),
        ("POST", f"/v1/nodes/{a['node']}/retry", {}),
        ("POST", f"/v1/regions/{a['region']}/join-tokens", {"ttl": "1h"}),
        ("DELETE", f"/v1/regions/{a['region']}/join-tokens", None),
        ("POST", f"/v1/regions/{a['region']}/bundle", {"control_plane_url": "https://cp.example:8443"}),
        ("POST", f"/v1/regions/{a['region']}/attestation", {"allow_ek_without_cert": True}),
        ("PATCH", f"/v1/device-configs/{a['device_config']}", {"command": "cat /run/keys/*"}),
        ("DELETE", f"/v1/device-configs/{a['device_config']}", None),
        ("POST", "/v1/nodes", {"name": "b-spy", "region": "alpha-lab", "minion_id": "0" * 32}),
        (
            "POST",
            "/v1/datastores",
            {"name": "b-data", "region": "alpha-lab", "type": "nfs", "address": "192.0.2.20", "root": "/x"},
        ),
        (
            "POST",
            "/v1/reservations",
            {"name": "b-web", "region": "alpha-lab", "hostname": "b-web", "port": 9443},
        ),
    ]


@pytest.mark.parametrize("attacker", ["beta_member", "beta_admin"])
def test_another_accounts_tokens_find_nothing_of_a_private_region(fleet: Fleet, attacker: str) -> None:
    """Finding 1: every fleet route acts as its caller's principal. Another account's region, and all in
    it, answers the same 404 as a missing one (a member's change is refused earlier, by its role)."""
    before = _snapshot(fleet)
    for method, path, body in _attacks(fleet):
        response = fleet.as_(attacker).request(method, path, json=body)
        expected = {404} if method == "GET" or attacker == "beta_admin" else {403, 404}
        assert response.status_code in expected, (attacker, method, path, response.text)
        if response.status_code == 404:  # worded as a missing row's, naming only what the caller sent
            assert "does not exist" in response.json()["message"], response.text
    assert _snapshot(fleet) == before
    # the lists leave alpha's rows out
    for path in (
        "/v1/regions",
        "/v1/nodes",
        "/v1/datastores",
        "/v1/reservations",
        "/v1/device-configs",
        "/v1/pending-minions",
        "/v1/join-refusals",
        "/v1/device-status",
    ):
        listed = fleet.ok(attacker, "GET", path)
        assert "alpha" not in json.dumps(listed), (path, listed)
    status = fleet.ok(attacker, "GET", "/v1/status")
    assert [r["region"] for r in status["regions"]] == ["beta-lab"]


def test_a_regions_members_read_it_and_its_admins_change_it(fleet: Fleet) -> None:
    """Finding 1: alpha's member sees alpha's region read-only; each change needs an admin (403 naming
    the role); alpha's admin and a root admin manage it."""
    before = _snapshot(fleet)
    for method, path, body in _attacks(fleet):
        response = fleet.as_("alpha_member").request(method, path, json=body)
        if method == "GET":
            assert response.status_code == 200, (path, response.text)
        else:
            assert response.status_code == 403, (method, path, response.text)
            assert response.json()["code"] == "forbidden_role"
            assert "an admin token" in response.json()["message"]
    assert _snapshot(fleet) == before
    listed = fleet.ok("alpha_member", "GET", "/v1/nodes")["items"]
    assert [n["name"] for n in listed] == ["a-gpu"]
    # the root account's admins run the fleet: they see and manage every account's regions
    assert {r["name"] for r in fleet.ok("root", "GET", "/v1/regions")["items"]} >= {"alpha-lab", "beta-lab"}
    fleet.ok(
        "root", "POST", f"/v1/reservations/{fleet.alpha['reservation']}/expose-wan", {"expose_wan": False}
    )


@pytest.mark.parametrize("caller", ["beta_member", "beta_admin", "alpha_admin"])
def test_trust_roots_and_providers_are_the_root_accounts_admins(
    fleet: Fleet, caller: str, tmp_path: Path, untrusted_vendor_ca: VendorCA
) -> None:
    """Finding 2: a TPM vendor CA or an image-builder key is trusted for every region of every account,
    and a provider spends for them all: only the root account's admins manage them."""
    pem = b"".join(untrusted_vendor_ca.certificate_pems()).decode()
    cas = fleet.ok("root", "GET", "/v1/tpm-cas")
    for method, path, body in (
        ("POST", "/v1/tpm-cas", {"pem": pem}),
        ("GET", "/v1/tpm-cas", None),
        ("POST", "/v1/image-keys", {"public_key": "A" * 43 + "=", "name": "mine"}),
        ("GET", "/v1/image-keys", None),
        ("POST", "/v1/providers", {"kind": "physical"}),
        ("DELETE", "/v1/providers/physical", None),
        ("POST", "/v1/rejected-minions", {"minion_id": fleet.alpha["minion_id"]}),
        ("GET", "/v1/rejected-minions", None),
        ("POST", "/v1/gcp/enable", {"project_id": "p", "service_account_key": "{}"}),
    ):
        response = fleet.as_(caller).request(method, path, json=body)
        assert response.status_code == 403, (caller, method, path, response.text)
        assert response.json()["code"] == "forbidden_role"
        if caller.endswith("admin"):
            assert "root account" in response.json()["message"]
    assert fleet.ok("root", "GET", "/v1/tpm-cas") == cas
    # providers stay readable: a region's admin picks one when creating a region
    assert [p["kind"] for p in fleet.ok(caller, "GET", "/v1/providers")["items"]] == ["physical"]


def test_a_tenant_cannot_plant_a_node_with_its_own_tpm_ca(
    fleet: Fleet,
    untrusted_vendor_ca: VendorCA,
    _golden_swtpm: Callable[[VendorCA, int], Swtpm],
    tmp_path: Path,
) -> None:
    """Finding 2, end to end with a swtpm: beta's admin cannot trust its own vendor CA, cannot mint a join
    token for alpha's region or add a node there, and a TPM of its own CA cannot join even beta's region."""
    tpm = _started_copy(_golden_swtpm(untrusted_vendor_ca, 901), tmp_path / "beta-tpm")
    rogue = Minion(tpm, fleet.cp.url)
    try:
        pem = b"".join(untrusted_vendor_ca.certificate_pems()).decode()
        assert fleet.as_("beta_admin").post("/v1/tpm-cas", json={"pem": pem}).status_code == 403
        assert (
            fleet.as_("beta_admin").post("/v1/regions/alpha-lab/join-tokens", json={"ttl": "1h"}).status_code
            == 404
        )
        assert (
            fleet.as_("beta_admin")
            .post("/v1/nodes", json={"name": "h100x8", "region": "alpha-lab", "minion_id": rogue.minion_id})
            .status_code
            == 404
        )
        fleet.ok(
            "beta_admin",
            "POST",
            "/v1/nodes",
            {"name": "h100x8", "region": "beta-lab", "minion_id": rogue.minion_id},
        )
        jt = fleet.ok("beta_admin", "POST", "/v1/regions/beta-lab/join-tokens", {"ttl": "1h"})["token"]
        first = rogue.begin(jt)
        assert first.status_code == 403 and first.json()["code"] == "attestation_ek_untrusted_ca", first.text
    finally:
        rogue.close()
        tpm.remove()


def test_a_minion_id_another_account_holds_is_refused_without_naming_it(fleet: Fleet) -> None:
    """Finding 11: one live node per minion_id in the fleet; the refusal names neither the node, its
    region nor its account."""
    response = fleet.as_("beta_admin").post(
        "/v1/nodes", json={"name": "claim", "region": "beta-lab", "minion_id": fleet.alpha["minion_id"]}
    )
    assert response.status_code == 409 and response.json()["code"] == "duplicate_minion_id", response.text
    message = response.json()["message"]
    assert "another account" in message and "a-gpu" not in message and "alpha" not in message


def _job(name: str, image: str, **more: Any) -> dict[str, Any]:
    return {
        "name": name,
        "type": "training",
        "resources": {"gpu_count": 0, "cpu_count": 4},
        "workers": ["true"],
        "environment": {"image": image},
        **more,
    }


def test_images_are_registry_references_only(fleet: Fleet) -> None:
    """Findings 6 and 7: podman reads host paths through `dir:` and `oci-archive:`, and an image starting
    with `-` was an option: a job's or a device's image must be a registry reference."""
    for image in ("dir:/etc", "oci-archive:/var/lib/x.tar", "-v", "--privileged", "docker://x", "a b"):
        spec = _job("probe", image)
        response = fleet.as_("beta_member").post("/v1/jobs/dry-run", json={"spec": spec})
        assert response.status_code == 422, (image, response.text)
        assert "registry image reference" in response.text, response.text
        patched = fleet.as_("alpha_admin").patch(
            f"/v1/device-configs/{fleet.alpha['device_config']}", json={"image": image}
        )
        assert patched.status_code == 422 and patched.json()["code"] == "invalid_image", patched.text
    ok = fleet.as_("beta_member").post("/v1/jobs/dry-run", json={"spec": _job("probe", "localhost/app:1")})
    assert ok.status_code == 200, ok.text


def test_credits_take_plain_decimals_once_per_idempotency_key(fleet: Fleet) -> None:
    """Finding 9: 1e999999999 was a 500, `1_000`, full-width digits and `+5` were accepted, and a retried
    credit POST credited twice."""
    for amount in ("1e999999999", "1_000", "\uff11\uff10", "+5", " 5 5", "NaN", "0x10", "5."):
        response = fleet.as_("root").post(
            "/v1/billing/credits", json={"account": "beta", "amount": amount, "memo": "probe"}
        )
        assert response.status_code == 422 and response.json()["code"] == "invalid_credits", (
            amount,
            response.text,
        )
        price = fleet.as_("root").post("/v1/billing/prices", json={"gpu_type": "H100", "price": amount})
        assert price.status_code == 422, (amount, price.text)
    before = fleet.ok("beta_admin", "GET", "/v1/billing/balance")["balance"]
    body = {"account": "beta", "amount": "25", "memo": "top-up", "idempotency_key": "retry-" + "k" * 20}
    first = fleet.ok("root", "POST", "/v1/billing/credits", body)
    again = fleet.ok("root", "POST", "/v1/billing/credits", body)
    assert first["key"] == again["key"] and again["balance"] == first["balance"]
    assert float(first["balance"]) - float(before) == 25
    reused = fleet.as_("root").post("/v1/billing/credits", json={**body, "amount": "30"})
    assert reused.status_code == 409 and reused.json()["code"] == "idempotency_key_reused", reused.text


def test_job_logs_show_control_characters_as_text() -> None:
    """Finding 13: `provision job logs` printed the node's escape sequences to the terminal."""
    from provisioner.cli.jobs import visible

    assert visible("ok\x1b]0;pwned\x07\x1b[2J\tdone\r\n\x9b") == "ok\\x1b]0;pwned\\x07\\x1b[2J\tdone\r\n\\x9b"


def test_forwarded_headers_and_bad_tokens_cannot_lock_out_valid_ones(fleet: Fleet) -> None:
    """Finding 5: X-Forwarded-For from 127.0.0.1 was believed (rotating it dodged the failure budget,
    setting it to a victim's address locked the victim out), bad tokens from an address made its valid
    requests 429, and the console's sign-in had no budget. Last in the module: it spends the budget."""
    cp = fleet.cp
    with cp.client() as anon:
        refused = 0
        for n in range(80):
            forged = {"Authorization": "Bearer rbo_" + "x" * 40, "X-Forwarded-For": f"198.51.100.{n}"}
            refused += anon.get("/v1/regions", headers=forged).status_code == 429
        assert refused > 0, "rotating X-Forwarded-For dodged the failure budget"
        # the budget of this address is spent: a token that authenticated here before still passes
        assert fleet.as_("alpha_admin").get("/v1/regions").status_code == 200
        assert fleet.as_("beta_member").get("/v1/nodes").status_code == 200
        # a forbidden_role answer is an authenticated caller, not a failed authentication
        assert fleet.as_("alpha_member").post("/v1/tpm-cas", json={"pem": "x"}).status_code == 403
    # the console's sign-in spends from the same budget (a new client: its own sign-in cookie)
    with cp.client() as browser:
        answers = set()
        for _ in range(5):
            form = browser.get("/signin")
            csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
            assert csrf, form.text
            answers.add(
                browser.post("/signin", data={"token": "rbo_" + "y" * 40, "csrf": csrf[1]}).status_code
            )
        assert 429 in answers, answers


def test_a_signed_out_console_session_stays_out_after_a_restart(tmp_path: Path) -> None:
    """Finding 8: the sign-outs lived in the process's memory, so a restarted server took the cookie again."""
    home = tmp_path / "home"
    with start_control_plane(home) as cp, cp.client() as browser:
        token = cp.token
        form = browser.get("/signin")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert csrf
        assert browser.post("/signin", data={"csrf": csrf[1], "token": token, "next": "/"}).status_code == 303
        cookies = dict(browser.cookies)
        home_page = browser.get("/")
        assert home_page.status_code == 200, home_page.text
        out = re.search(r'name="csrf" value="([^"]+)"', home_page.text)
        assert out
        assert browser.post("/signout", data={"csrf": out[1]}).status_code == 303
    with start_control_plane(home, token=token) as again, again.client() as replay:
        for name, value in cookies.items():
            replay.cookies.set(name, value)
        answer = replay.get("/")
        assert answer.status_code == 303 and answer.headers["location"].startswith("/signin"), answer.text


def test_forwarded_for_counts_from_a_named_proxy(tmp_path: Path) -> None:
    """Finding 5's other half: behind HAProxy (RIGBASE_TRUSTED_PROXIES names it) each client's own
    address is counted, so one client's bad tokens spend its budget only."""
    with start_control_plane(tmp_path / "home", env={"RIGBASE_TRUSTED_PROXIES": "127.0.0.0/8"}) as cp:
        with cp.client() as proxy:
            bad = {"Authorization": "Bearer rbo_" + "x" * 40}
            guesser = [
                proxy.get("/v1/regions", headers={**bad, "X-Forwarded-For": "198.51.100.7"}).status_code
                for _ in range(60)
            ]
            assert 429 in guesser, "one client's guesses spend its budget"
            other = proxy.get("/v1/regions", headers={**bad, "X-Forwarded-For": "198.51.100.8"})
            assert other.status_code == 401, "another client behind the same proxy still has its own"
