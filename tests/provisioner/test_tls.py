"""`provision serve` speaks TLS itself (docs/control-plane.md, "TLS"): the CA and server certificate of a
first start, --advertise, the operator's own certificate, --insecure-http, what the bundle pins, and a
real minion (swtpm) joining over TLS and refusing a control plane whose certificate is not from its
bundle's CA. Real servers (`provision serve`), real CLI, real handshakes."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography import x509

from minion.join.client import ConnectionProblem, ControlPlane, Enrollment, attempt_join
from minion.tpm.session import TpmSession
from provisioner.adapters.tls import TlsFiles, ensure_server_cert
from provisioner.lab.swtpm import Swtpm, VendorCA
from tests.fixtures.control_plane import PROVISION, ROOT, start_control_plane
from tests.fixtures.postgres import free_port

PASSING = {"ok": True, "rules": [{"rule": "tpm", "ok": True}]}


def _sans(pem: bytes) -> set[str]:
    ext = x509.load_pem_x509_certificate(pem).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    return {
        *ext.value.get_values_for_type(x509.DNSName),
        *map(str, ext.value.get_values_for_type(x509.IPAddress)),
    }


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PROVISION), *args], env=env, capture_output=True, text=True, timeout=60)


def test_first_start_creates_the_ca_and_advertise_changes_the_certificate(tmp_path: Path) -> None:
    home = tmp_path / "home"
    files = TlsFiles(home / "tls")
    advertise = ("--advertise", "cp.example.org", "--advertise", "10.0.2.100")  # 10.0.2.100: not this host
    with start_control_plane(home, seed_ca=False, seed_store=False, extra_args=advertise) as cp:
        assert _mode(files.ca_key) == 0o600 and _mode(files.key) == 0o600 and _mode(home / "tls") == 0o700
        ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
        assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        assert (ca.not_valid_after_utc - ca.not_valid_before_utc).days >= 3649
        assert _sans(files.cert.read_bytes()) == {
            "cp.example.org",
            "10.0.2.100",
            "127.0.0.1",
            "localhost",
            "::1",
        }
        assert cp.session_tickets() == 1  # for a minion to resume with (adapters/tls.py rotating_tickets)
        config = json.loads((home / "client.json").read_text())
        assert (
            config["url"] == cp.url and cp.url.startswith("https://") and config["ca"] == str(files.ca_cert)
        )

        # the client config alone is enough: the CLI trusts its CA
        env = {k: v for k, v in os.environ.items() if not k.startswith("RIGBASE_") and k != "SSL_CERT_FILE"}
        env["RIGBASE_HOME"] = str(home)
        assert _cli(env, "provider", "enable", "physical").returncode == 0
        # plain HTTP to the TLS port gets no answer
        with pytest.raises(httpx.HTTPError):
            httpx.get(cp.url.replace("https://", "http://") + "/healthz", timeout=5)
        # a client that trusts another CA (the system's store) refuses the certificate
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"{cp.url}/healthz", verify=ssl.create_default_context(), timeout=5)
        # and so does the CLI, with one line
        other = _cli(
            {**cp.env, "RIGBASE_CA_CERT": str(Path(ssl.get_default_verify_paths().openssl_cafile))},
            "provider",
            "list",
        )
        assert other.returncode == 1 and "certificate not from" in other.stderr, other.stderr

        # the bundle pins the CA; a plain http URL is refused (exit 2, nothing written)
        assert cp.provision("region", "create", "lab", "--provider", "physical").returncode == 0
        bundle = tmp_path / "bundle.json"
        r = cp.provision(
            "region", "bundle", "lab", "-o", str(bundle), "--control-plane-url", "https://10.0.2.100:8470"
        )
        assert r.returncode == 0, r.stderr
        assert json.loads(bundle.read_text())["ca_certificate"] == files.ca_cert.read_text()
        r = cp.provision(
            "region",
            "bundle",
            "lab",
            "-o",
            str(tmp_path / "b2.json"),
            "--control-plane-url",
            "http://10.0.2.100:8470",
        )
        assert r.returncode == 2 and "is not https" in r.stderr and not (tmp_path / "b2.json").exists()

    ca_pem, cert_pem = files.ca_cert.read_bytes(), files.cert.read_bytes()
    with start_control_plane(home, seed_ca=False, extra_args=advertise):
        assert files.cert.read_bytes() == cert_pem  # same names: kept
    # RIGBASE_ADVERTISE (comma-separated) instead of the flag
    with start_control_plane(home, seed_ca=False, advertise=("cp2.example.org", "192.0.2.7")) as cp:
        assert files.ca_cert.read_bytes() == ca_pem  # the CA stays: nodes pin it
        assert _sans(files.cert.read_bytes()) == {
            "cp2.example.org",
            "192.0.2.7",
            "127.0.0.1",
            "localhost",
            "::1",
        }
        served = ssl.get_server_certificate(("127.0.0.1", int(cp.url.rsplit(":", 1)[1])))
        assert served.encode() == files.cert.read_bytes()


def test_a_server_certificate_near_its_end_is_renewed_at_start(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    files = TlsFiles(tmp_path / "tls")
    old = ensure_server_cert(files, ["cp.example.org"], now=datetime.now(UTC) - timedelta(days=70))
    assert old.issued
    again = ensure_server_cert(files, ["cp.example.org"])
    assert again.issued  # 20 days left < 30
    assert not ensure_server_cert(files, ["cp.example.org"]).issued


def test_own_certificate_is_used_as_given_and_pinned_by_bundles(tmp_path: Path) -> None:
    own = TlsFiles(tmp_path / "operator-pki")
    ensure_server_cert(own, ["cp.operator.example"])
    home = tmp_path / "home"
    args = ("--tls-cert", str(own.cert), "--tls-key", str(own.key), "--tls-ca", str(own.ca_cert))
    with start_control_plane(home, seed_ca=False, extra_args=args, ca=own.ca_cert) as cp:
        assert not (home / "tls").exists()  # nothing created
        served = ssl.get_server_certificate(("127.0.0.1", int(cp.url.rsplit(":", 1)[1])))
        assert served.encode() == own.cert.read_bytes()
        assert json.loads((home / "client.json").read_text())["ca"] == str(own.ca_cert)
        env = cp.env
        assert _cli(env, "provider", "enable", "physical").returncode == 0
        assert _cli(env, "region", "create", "lab", "--provider", "physical").returncode == 0
        bundle = tmp_path / "bundle.json"
        r = _cli(
            env,
            "region",
            "bundle",
            "lab",
            "-o",
            str(bundle),
            "--control-plane-url",
            "https://cp.operator.example",
        )
        assert r.returncode == 0, r.stderr
        assert json.loads(bundle.read_text())["ca_certificate"] == own.ca_cert.read_text()

    env = {**os.environ, "RIGBASE_HOME": str(tmp_path / "home2")}
    bad = [
        (("--tls-cert", str(own.cert)), "go together"),
        (("--tls-cert", str(own.cert), "--tls-key", str(own.ca_key)), "cannot use --tls-cert"),
        (("--insecure-http", "--tls-cert", str(own.cert), "--tls-key", str(own.key)), "exclude each other"),
        (("--advertise", "not a name!"), "neither an IP address nor a DNS name"),
    ]
    for extra, words in bad:
        r = _cli(env, "serve", "--host", "127.0.0.1", "--port", str(free_port()), *extra)
        assert r.returncode != 0 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.fixture
def insecure(tmp_path: Path) -> Iterator[tuple[Path, int, Path]]:
    """`provision serve --insecure-http` with no --host; yields its stderr file, port and home."""
    home, port, log = tmp_path / "home", free_port(), tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIGBASE_")} | {"RIGBASE_HOME": str(home)}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(PROVISION), "serve", "--insecure-http", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    try:
        yield log, port, home
    finally:
        proc.terminate()
        proc.wait(10)


def test_insecure_http_binds_loopback_and_warns(insecure: tuple[Path, int, Path]) -> None:
    log, port, home = insecure
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # serve binds before it starts up: wait for the answer
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    listening = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True).stdout
    # bound to loopback only, though no --host was given
    assert [line.split()[3] for line in listening.strip().splitlines()] == [f"127.0.0.1:{port}"]
    text = log.read_text()
    assert text.startswith("WARNING: --insecure-http: plain HTTP on 127.0.0.1"), text
    assert f"rigbase control plane on http://127.0.0.1:{port} " in text
    assert not (home / "tls").exists()
    config = json.loads((home / "client.json").read_text())
    assert config["url"] == f"http://127.0.0.1:{port}" and "ca" not in config
    assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200


def test_minion_joins_over_tls_and_refuses_a_control_plane_of_another_ca(
    tmp_path: Path, swtpm: Swtpm, tpm_vendor_ca: VendorCA
) -> None:
    with (
        start_control_plane(tmp_path / "a") as a,
        start_control_plane(tmp_path / "b", seed_ca=False) as b,  # its own CA, as a stand-in would have
    ):
        vendor = tmp_path / "vendor.pem"
        vendor.write_bytes(b"".join(tpm_vendor_ca.certificate_pems()))
        for args in (
            ["provider", "enable", "physical"],
            ["region", "create", "lab", "--provider", "physical"],
            ["tpm-ca", "add", str(vendor)],
        ):
            assert a.provision(*args).returncode == 0
        bundle = tmp_path / "bundle.json"
        assert a.provision("region", "bundle", "lab", "-o", str(bundle), "--allow-loopback").returncode == 0
        enrollment = Enrollment.from_bundle(bundle)
        assert enrollment.control_plane_url == a.url and enrollment.ca_certificate == a.ca.read_text()

        session = TpmSession(swtpm.tcti)
        session.open()
        try:
            ak = session.create_ak()
            with pytest.MonkeyPatch.context() as mp:
                mp.delenv("SSL_CERT_FILE")  # the minion trusts its bundle's CA, nothing of this process
                cp = ControlPlane(enrollment)
                status = attempt_join(cp, session, ak, inventory={"gpus": []}, requirements=PASSING)
                cp.close()
                assert status.state == "pending", status  # attested over TLS, waits for the operator

                impostor = ControlPlane(
                    Enrollment(b.url, enrollment.join_token, "lab", enrollment.ca_certificate)
                )
                with pytest.raises(ConnectionProblem, match="ConnectError"):
                    attempt_join(impostor, session, ak, inventory={"gpus": []}, requirements=PASSING)
                impostor.close()
        finally:
            session.close()


def test_a_client_that_never_answers_the_tls_close_does_not_hold_a_stop(tmp_path: Path) -> None:
    """A stopping server closes its idle connections, and closing a TLS connection waits for the peer's
    close_notify: asyncio waits up to 30 s for it. Uvicorn, unbounded, waited for every connection, so
    one client that made a request and then went quiet held `provision serve`'s stop for 30 s (the
    tests' fixture killed it after 10). The stop is bounded by SHUTDOWN_GRACE_S."""
    from provisioner.cli.serve import SHUTDOWN_GRACE_S

    with start_control_plane(tmp_path / "home") as cp:
        host, port = cp.url.removeprefix("https://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            with cp.verify.wrap_socket(raw, server_hostname=host) as tls:
                tls.sendall(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
                assert tls.recv(65536).startswith(b"HTTP/1.1 200")
                # a kept-alive connection, and this client reads nothing more: the server's
                # close_notify stays unanswered until the socket closes
                cp.process.terminate()
                cp.process.wait(timeout=SHUTDOWN_GRACE_S + 15)  # unbounded: 30 s and more
        # a clean stop: uvicorn re-raises the SIGTERM it stopped on once it has shut down
        assert cp.process.returncode == -signal.SIGTERM, (tmp_path / "home" / "server.log").read_text()
