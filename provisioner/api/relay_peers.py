"""The tunnel relay between hosts (`serve --peer-address`, api/tunnel_relay.py): its TLS both ways, its
token and its rows in the store, from this process's settings."""

from __future__ import annotations

import ssl
from typing import Any, Final

from provisioner.adapters.secrets import Sealer
from provisioner.adapters.tls import TlsFiles
from provisioner.api.tunnel_relay import PeerLink
from provisioner.services.common import relay_peers
from provisioner.settings import Settings

_TOKEN_LABEL: Final = b"rigbase tunnel relay v1"


def peer_link(settings: Settings, sealer: Sealer, sessions: Any) -> PeerLink | None:
    """None unless `peer_address` is set. The server side is the host's own certificate (serve adds the
    address to its names); the client side trusts the CA the deployment's certificates chain to."""
    if settings.peer_address is None:
        return None
    if settings.tls_cert and settings.tls_key:
        cert, key, ca = settings.tls_cert, settings.tls_key, settings.tls_ca
    else:
        files = TlsFiles(settings.tls_dir)
        cert, key, ca = files.cert, files.key, files.ca_cert
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.minimum_version = ssl.TLSVersion.TLSv1_3
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cafile=str(ca) if ca else None)
    client.minimum_version = ssl.TLSVersion.TLSv1_3

    def renew(tag: str, url: str) -> None:
        with sessions.begin() as session:
            relay_peers.renew(session, tag, url)

    def forget(tag: str) -> None:
        with sessions.begin() as session:
            relay_peers.forget(session, tag)

    def living(tag: str) -> dict[str, str]:
        with sessions.begin() as session:
            return relay_peers.living(session, tag)

    return PeerLink(
        host=settings.peer_address, port=settings.peer_port, server_tls=server, client_tls=client,
        token=sealer.derive(_TOKEN_LABEL).hex(), renew=renew, forget=forget, living=living,
        renew_every_s=relay_peers.PEER_RENEW.total_seconds(),
    )  # fmt: skip
