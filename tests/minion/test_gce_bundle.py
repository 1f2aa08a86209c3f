"""`minion gce-bundle`: a rigbase VM on Compute Engine reads its region's enrollment bundle from the
instance metadata server (the GCE image's rigbase-gce-bundle.service runs it). The real `minion` CLI
against a loopback metadata server speaking the real protocol (tests/fixtures/gce_metadata.py)."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
from pathlib import Path

from contracts.bundle import parse_bundle
from tests.fixtures.gce_metadata import Instance, metadata_server
from tests.fixtures.umockdev import minion_executable

BUNDLE = {
    "version": 1,
    "control_plane_url": "https://cp.example.net:8470",
    "ca_certificate": None,
    "region": "us-central1",
    "region_id": "reg_gce",
    "provider": "gcp",
    "join_token": "rbj_secret",
    "expires_at": None,
}


def gce_bundle(host: str, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GCE_METADATA_HOST": host}
    return subprocess.run(
        [minion_executable(), "gce-bundle", "--output", str(out), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_the_bundle_is_read_with_the_flavor_header_and_written_0600(tmp_path: Path) -> None:
    inst = Instance({"rigbase-bundle": json.dumps(BUNDLE), "startup-script": "echo not ours"})
    out = tmp_path / "state" / "bundle.json"
    with metadata_server(inst) as host:
        r = gce_bundle(host, out, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"output": str(out), "region": "us-central1", "region_id": "reg_gce"}
    assert out.read_text() == parse_bundle(BUNDLE).to_json()  # as `provision region bundle` writes it
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert inst.requests == ["/computeMetadata/v1/instance/attributes/rigbase-bundle"]


def test_what_cannot_be_a_bundle_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "bundle.json"
    cases = [
        (Instance({}), "this instance has no 'rigbase-bundle' metadata; it was not created by rigbase"),
        (Instance({"rigbase-bundle": "{not json"}), "'rigbase-bundle' is not JSON"),
        (Instance({"rigbase-bundle": json.dumps({**BUNDLE, "join_token": ""})}), "missing join_token"),
        # no Metadata-Flavor on the answer: not the metadata server (a proxy, a misrouted name)
        (Instance({"rigbase-bundle": json.dumps(BUNDLE)}, flavor=False), "it is not a GCE metadata server"),
    ]
    for inst, words in cases:
        with metadata_server(inst) as host:
            r = gce_bundle(host, out)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1 and words in lines[0], (words, r.stderr)
        assert not out.exists()


def test_an_unreachable_metadata_server_is_retried_until_the_wait_runs_out(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = gce_bundle(f"127.0.0.1:{port}", tmp_path / "bundle.json", "--wait", "2")
    assert r.returncode == 1
    assert "waiting for the metadata server" in r.stderr  # retried, saying so
    assert r.stderr.strip().splitlines()[-1].startswith("error: the metadata server 127.0.0.1:")
    assert not (tmp_path / "bundle.json").exists()
