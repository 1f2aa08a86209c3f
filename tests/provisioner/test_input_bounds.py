"""Input an attacker or a careless operator sends is refused whole: names and
addresses with a trailing newline or a control character, TTLs too long for a date, free text of a
megabyte, a bundle URL that is not http(s); each answers a one-line 4xx and stores nothing. Also: the
store's files are the owner's only, and a second `serve` leaves a live server's client config alone."""

from __future__ import annotations

import json
import os
import stat
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from contracts.bundle import BundleError, EnrollmentBundle, parse_bundle
from contracts.errors import InvalidInput
from contracts.regional import DatastoreType, check_datastore, normalize_root
from provisioner.services.fleet import images, join_tokens
from provisioner.store.engine import make_engine
from tests.fixtures.control_plane import ControlPlane, start_control_plane

MID = "0123456789abcdef0123456789abcdef"
MID2 = "fedcba9876543210fedcba9876543210"


def _seed(c: httpx.Client) -> None:
    assert c.post("/v1/providers", json={"kind": "physical"}).status_code == 201
    assert c.post("/v1/regions", json={"name": "lab-1", "provider": "physical"}).status_code == 201
    assert c.post("/v1/nodes", json={"name": "gpu-1", "region": "lab-1", "minion_id": MID}).status_code == 201
    node = c.post("/v1/nodes/gpu-1/maintenance", json={"mode": "on", "reason": "first"})
    assert node.status_code in (200, 409), node.text  # only the stored state matters below


def _state(c: httpx.Client) -> list:
    return [
        c.get("/v1/nodes", params={"include_removed": True}).json(),
        c.get("/v1/nodes/gpu-1/history").json(),
        c.get("/v1/reservations").json(),
        c.get("/v1/datastores").json(),
        c.get("/v1/regions/lab-1/join-tokens").json(),
    ]


def _refusal(c: httpx.Client, path: str, body: dict) -> str | None:
    """None for a one-line 422, else what came back instead."""
    try:
        r = c.post(path, json=body)
    except httpx.TransportError as exc:  # a 500 that dropped the connection
        return f"no answer: {exc}"
    message = r.json().get("message", "")
    return None if r.status_code == 422 and "\n" not in message and len(message) < 1000 else r.text


def test_bad_text_is_refused_one_line_and_nothing_is_stored(api_server: ControlPlane) -> None:
    region = {"region": "lab-1"}
    nfs = {"name": "nas", "type": "nfs", **region}
    calls = [
        ("/v1/nodes", {"name": "gpu-2\n", "region": "lab-1", "minion_id": MID2}),
        ("/v1/nodes", {"name": "gpu-2", "region": "lab-1", "minion_id": MID2 + "\n"}),
        ("/v1/reservations", {"name": "web", "hostname": "web\n", "port": 8080, **region}),
        ("/v1/datastores", {**nfs, "address": "nas.lan\n", "root": "/export"}),
        ("/v1/datastores", {**nfs, "address": "10.0.0.5\n", "root": "/export"}),
        ("/v1/datastores", {**nfs, "address": "fe80::1%eth0\nforged", "root": "/export"}),
        ("/v1/datastores", {**nfs, "address": "10.0.0.5", "root": "/export\n"}),
        ("/v1/datastores", {**nfs, "address": "10.0.0.5", "root": "/ex\x1b[2Jport"}),
        ("/v1/regions/lab-1/join-tokens", {"ttl": "7d\n"}),
        ("/v1/regions/lab-1/join-tokens", {"ttl": "3000000d"}),
        ("/v1/regions/lab-1/join-tokens", {"ttl": "99999999999999999999999w"}),
        ("/v1/regions/lab-1/bundle", {"control_plane_url": "javascript:alert(1)"}),
        ("/v1/regions/lab-1/bundle", {"control_plane_url": "http://"}),
        ("/v1/regions/lab-1/bundle", {"control_plane_url": "http://cp:8080\nX-Forged: 1"}),
        ("/v1/nodes/gpu-1/maintenance", {"mode": "off", "reason": "x" * 501}),
        ("/v1/nodes/gpu-1/maintenance", {"mode": "off", "reason": "done\n2026-01-01 forged line"}),
    ]
    with api_server.client() as c:
        _seed(c)
        before = _state(c)
        wrong = [(path, body, answer) for path, body in calls if (answer := _refusal(c, path, body))]
        assert wrong == []
        huge = c.post("/v1/nodes/gpu-1/maintenance", json={"mode": "off", "reason": "x" * 1_000_000})
        assert huge.status_code in (413, 422), huge.text
        assert _state(c) == before


def test_ttl_is_a_full_match_and_bounded() -> None:
    assert join_tokens.parse_ttl("365d") == timedelta(days=365)
    assert join_tokens.parse_ttl("never") is None
    for bad in ("7d\n", " 7d", "366d", "53w", "3000000d", "9" * 40 + "s"):
        with pytest.raises(InvalidInput) as err:
            join_tokens.parse_ttl(bad)
        assert "\n" not in err.value.message


def test_datastore_roots_refuse_control_characters() -> None:
    assert str(normalize_root("/export/dir")) == "/export/dir"
    for root in ("/export\n", "/a\tb", "/a\x00b", "/a\x7fb"):
        with pytest.raises(InvalidInput):
            check_datastore("nas", DatastoreType.NFS, root, None, None)


def test_manifest_hashes_are_full_matches() -> None:
    good = "ab" * 32
    assert images._HEX64.fullmatch(good)
    with pytest.raises(InvalidInput):
        images._hex({"image": {"sha256": good + "\n"}}, "image", "sha256")


def test_bundle_url_is_http_or_https_with_a_host() -> None:
    fields = {
        "region": "lab-1",
        "region_id": "reg_1",
        "provider": "physical",
        "join_token": "rbj_x",
    }
    for ok in ("http://10.0.0.2:8080", "https://cp.example"):
        assert parse_bundle({"version": 1, "control_plane_url": ok, **fields}).control_plane_url == ok
    for bad in ("javascript:alert(1)", "file:///etc/passwd", "http://", "ftp://cp", "http://cp\n"):
        with pytest.raises(BundleError):
            parse_bundle({"version": 1, "control_plane_url": bad, **fields})
        with pytest.raises(ValueError):
            EnrollmentBundle(control_plane_url=bad, **fields)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_sqlite_store_files_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        fresh = tmp_path / "fresh.db"
        with make_engine(f"sqlite:///{fresh}").connect() as conn:
            conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
            conn.exec_driver_sql("INSERT INTO t VALUES (1)")
            conn.commit()
            files = [fresh, fresh.with_name("fresh.db-wal"), fresh.with_name("fresh.db-shm")]
            assert {f.name: _mode(f) for f in files} == {f.name: 0o600 for f in files}
        wide = tmp_path / "wide.db"
        wide.touch(0o644)
        (tmp_path / "wide.db-wal").touch(0o644)
        make_engine(f"sqlite:///{wide}").dispose()
        assert (_mode(wide), _mode(tmp_path / "wide.db-wal")) == (0o600, 0o600)
    finally:
        os.umask(old)


def test_served_home_files_are_private(api_server: ControlPlane) -> None:
    with api_server.client() as c:
        _seed(c)
    home = api_server.home
    assert _mode(home) == 0o700
    for name in ("rigbase.db", "rigbase.db-wal", "rigbase.db-shm", "client.json"):
        assert _mode(home / name) == 0o600, name


def test_second_serve_keeps_the_client_config_of_a_live_server(tmp_path: Path) -> None:
    home = tmp_path / "home"
    config = home / "client.json"
    with start_control_plane(home) as first:
        assert json.loads(config.read_text())["url"] == first.url
        with start_control_plane(home) as second:
            assert json.loads(config.read_text())["url"] == first.url
            log = (home / "server.log").read_text()
            assert f"RIGBASE_URL={second.url}" in log and first.url in log
    # the first server is gone: a restart (on another port) takes the config over
    with start_control_plane(home) as third:
        assert json.loads(config.read_text())["url"] == third.url
