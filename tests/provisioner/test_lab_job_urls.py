"""A served job in the local lab, for real (docs/job-urls.md): the lab node's minion starts an endpoint's
server in a rootful podman container, reports it `starting` (with the reason) until GET / answers, then
`running`; the URL on the control plane reaches it through the minion's outbound tunnel (the node never
accepts a connection), a private endpoint refuses a caller without a token, and an ended job answers 410."""

from __future__ import annotations

import json
import ssl
import time
from pathlib import Path
from typing import Any

import httpx

from tests.provisioner.test_lab import (  # noqa: F401 - the fixtures are used by name
    cached_lab_home,
    lab_home,
    lab_namespaces,
    provision,
    rootfs_cache,
)
from tests.provisioner.test_lab_jobs import EXAMPLES, _job, _ok, _wait_state


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
