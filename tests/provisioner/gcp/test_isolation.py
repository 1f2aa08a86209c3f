"""The suite really is offline: inside the namespace only loopback works."""

from __future__ import annotations

import socket

import pytest

from tests.provisioner.gcp.conftest import isolated


def test_running_in_network_namespace() -> None:
    assert isolated(), "GCP tests must run through the unshare -n wrapper"


@pytest.mark.parametrize(
    "address", [("8.8.8.8", 443), ("142.250.80.10", 443)]
)  # Google DNS, a Google front end
def test_public_address_is_unreachable(address: tuple[str, int]) -> None:
    with socket.socket() as s:
        s.settimeout(2)
        with pytest.raises(OSError):  # ENETUNREACH: no route exists outside lo
            s.connect(address)


def test_google_hostname_does_not_resolve_or_connect() -> None:
    with pytest.raises(OSError):
        socket.create_connection(("compute.googleapis.com", 443), timeout=2)


def test_loopback_works() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname(), timeout=2):
            pass
