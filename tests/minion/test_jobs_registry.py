"""A customer's private image is pulled with the job's own registry credentials, every time (tenancy
finding 6): a real registry (the distribution project's, Debian's docker-registry) on loopback with TLS
and htpasswd, real podman, the minion's jobs agent.

The registry's CA is trusted for its one address only (/etc/containers/certs.d/127.0.0.1:PORT, removed
afterwards), as a node trusts a private registry."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from contracts.jobs import RegistryAuth
from minion.jobs.podman import Podman
from minion.settings import ContainerSettings
from tests.minion.test_jobs_podman import (  # noqa: F401  (fixtures)
    IMAGE,
    RUNTIME,
    Agents,
    LogStore,
    agents,
    ended_and_shipped,
    gpu_kind,
    image,
    jobs_network_named,
    server,
    settings,
    store,
    until,
    worker,
)

USER, PASSWORD = "alpha", "alpha-registry-secret"


@pytest.fixture(scope="module")
def jobs_network() -> Iterator[tuple[str, str]]:
    yield from jobs_network_named("rigbase-jt-registry", "10.231.6.0/24")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory, image: str) -> Iterator[str]:  # noqa: F811
    """The registry's host:port, holding account alpha's private image alpha/private:1."""
    for tool in ("docker-registry", "htpasswd", "openssl"):
        if shutil.which(tool) is None:
            pytest.skip(
                f"{tool} is missing: scripts/install-deps.sh installs docker-registry and apache2-utils"
            )
    d = tmp_path_factory.mktemp("registry")
    port = _free_port()
    host = f"127.0.0.1:{port}"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem"), "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    (d / "htpasswd").write_text(
        subprocess.run(
            ["htpasswd", "-Bbn", USER, PASSWORD], check=True, capture_output=True, text=True
        ).stdout
    )
    (d / "config.yml").write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {d / 'data'}\n"
        f"http:\n  addr: {host}\n  tls:\n    certificate: {d / 'cert.pem'}\n    key: {d / 'key.pem'}\n"
        f"auth:\n  htpasswd:\n    realm: rigbase-test\n    path: {d / 'htpasswd'}\nlog:\n  level: error\n"
    )
    trust = Path("/etc/containers/certs.d") / host
    trust.mkdir(parents=True)
    shutil.copy(d / "cert.pem", trust / "ca.crt")
    served = subprocess.Popen(["docker-registry", "serve", str(d / "config.yml")], stderr=subprocess.DEVNULL)
    podman = Podman(ContainerSettings(**RUNTIME))  # type: ignore[arg-type]
    private = f"{host}/alpha/private:1"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the registry did not start"
                time.sleep(0.1)
        podman.call(["push", "--creds", f"{USER}:{PASSWORD}", IMAGE, private])
        yield host
    finally:
        served.terminate()
        served.wait(10)
        shutil.rmtree(trust)
        subprocess.run([*podman.base(), "rmi", "--force", private], capture_output=True)


def test_a_private_image_runs_with_the_jobs_own_key_and_never_without_it_even_cached(
    registry: str,
    agents: Agents,  # noqa: F811
    store: LogStore,  # noqa: F811
    settings: ContainerSettings,  # noqa: F811
) -> None:
    """Tenancy finding 6: another tenant's cached private image ran by name with no credentials. Now a
    pull is made every start with the job's own key: alpha's job runs, and then, with the image cached
    on this node, a job with no key or a wrong one is refused by the registry and never starts."""
    private = f"{registry}/alpha/private:1"
    key = RegistryAuth(registry=registry, username=USER, password=PASSWORD)
    agent = agents()
    first = until(agent, [worker("job-own", "echo ran", image=private, registry_auth=key)], ended_and_shipped)
    assert (first.workers[0].state, first.workers[0].exit_code) == ("exited", 0), first.workers[0].message
    assert "ran" in store.text("job-own")

    # the node itself is logged in to that registry (an operator's own podman login): a customer's job
    # still pulls with its own credentials only
    login = [*Podman(settings).base(), "login", "--username", USER, "--password-stdin", registry]
    subprocess.run(login, input=PASSWORD, text=True, check=True, capture_output=True)
    try:
        wrong = key.model_copy(update={"password": "guessed"})
        for job, auth in (("job-nokey", None), ("job-wrongkey", wrong)):
            assignment = worker(job, "echo ran", image=private, registry_auth=auth)
            report = until(agent, [assignment], ended_and_shipped).workers[0]
            assert report.state == "failed_to_start", report
            assert "authentication required" in (report.message or ""), report.message
            assert "ran" not in store.text(job)
    finally:
        subprocess.run([*Podman(settings).base(), "logout", registry], capture_output=True)
