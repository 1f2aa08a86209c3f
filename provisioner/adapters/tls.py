"""The control plane's TLS material (docs/control-plane.md, "TLS").

`provision serve` speaks TLS itself. At first start it creates a control-plane CA under
$RIGBASE_HOME/tls/ (key 0600, ten years) and, from it, a server certificate for the names and addresses
it is told to advertise. The CA is what nodes pin (the enrollment bundle's `ca_certificate`) and what the
`provision` commands trust (client.json), so a network attacker cannot stand in for the control plane
with any certificate a public CA would sign. The server certificate is short-lived and re-issued at a
start whose advertised set differs from the certificate's, or when it is near its end: restarting the
server is how it rotates, and the nodes notice nothing because the CA stays.

An operator's own certificate (--tls-cert / --tls-key, optionally --tls-ca for a private CA) replaces
both; nothing is created then."""

from __future__ import annotations

import fcntl
import ipaddress
import os
import re
import socket
import ssl
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from contracts.errors import InvalidInput
from provisioner.settings import Settings

CA_VALIDITY = timedelta(days=3650)
# Short so a leaked server key is useful for weeks, not years; renewed at a start within RENEW_BEFORE.
SERVER_VALIDITY = timedelta(days=90)
RENEW_BEFORE = timedelta(days=30)
# Always in the server certificate: the `provision` commands on this host reach it through loopback.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_DNS_NAME = re.compile(
    r"^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
)
_SIOCGIFADDR = 0x8915


@dataclass(frozen=True)
class TlsFiles:
    """The files under $RIGBASE_HOME/tls/ (backed up with the home: provisioner/services/common/backup.py)."""

    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def cert(self) -> Path:
        return self.dir / "server.pem"

    @property
    def key(self) -> Path:
        return self.dir / "server.key"


@dataclass(frozen=True)
class ServerTls:
    """What uvicorn serves with, and the CA clients and nodes trust (None: the operator's certificate
    chains to a CA every client already trusts)."""

    cert: Path
    key: Path
    ca: Path | None
    names: tuple[str, ...]  # the certificate's subject alternative names
    issued: bool  # a new server certificate was written at this start


# A ticket key lives this long: a ticket sealed under an older key resumes no more (a full handshake), so
# a leaked process memory opens at most an hour of resumptions. Resumption still runs ECDHE (psk_dhe_ke),
# so the traffic of a resumed connection keeps its own forward secrecy either way.
TICKET_KEY_S = 3600.0
# One ticket per handshake: a minion holds one connection and resumes from the newest ticket
TICKETS_PER_HANDSHAKE = 1


class RotatingTickets(ssl.SSLContext):
    """A server context whose TLS 1.3 session-ticket key is replaced every `every_s`.

    Python cannot set OpenSSL's ticket keys, and each SSL_CTX draws its own at random when it is made, so
    this context hands each new connection to a fresh inner context once the current one is `every_s`
    old (asyncio and uvicorn call `wrap_bio` once per connection). Each inner context is `make()`:
    uvicorn's own, from the certificate files, so a rotation also picks up a replaced certificate."""

    def __new__(cls, make: Callable[[], ssl.SSLContext], every_s: float = TICKET_KEY_S) -> RotatingTickets:
        return super().__new__(cls, ssl.PROTOCOL_TLS_SERVER)

    def __init__(self, make: Callable[[], ssl.SSLContext], every_s: float = TICKET_KEY_S) -> None:
        self._make, self._every_s = make, every_s
        self.rotations = 0
        self._current, self._since = self._fresh(), time.monotonic()

    def _fresh(self) -> ssl.SSLContext:
        context = self._make()
        context.num_tickets = TICKETS_PER_HANDSHAKE
        return context

    def current(self) -> ssl.SSLContext:
        if time.monotonic() - self._since >= self._every_s:
            self._current, self._since = self._fresh(), time.monotonic()
            self.rotations += 1
        return self._current

    def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:
        return self.current().wrap_bio(*args, **kwargs)

    def wrap_socket(self, sock: socket.socket, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        return self.current().wrap_socket(sock, *args, **kwargs)


def rotating_tickets(_config: object, default: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """uvicorn's `ssl_context_factory`: its own context, issuing one TLS 1.3 session ticket per handshake
    under a key rotated every TICKET_KEY_S, so a minion that must reconnect resumes its session
    (minion/join/tls_resume.py) instead of a full handshake. Each worker process has its own key."""
    return RotatingTickets(default)


def split_names(
    names: Iterable[str],
) -> tuple[list[str], list[ipaddress.IPv4Address | ipaddress.IPv6Address]]:
    """DNS names and IP addresses, each checked: a typo must stop the start, not make a useless cert."""
    dns: list[str] = []
    ips: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    for raw in names:
        name = raw.strip().strip("[]").lower()
        try:
            ip = ipaddress.ip_address(name)
        except ValueError:
            if not _DNS_NAME.match(name):
                raise InvalidInput(
                    f"--advertise {raw!r} is neither an IP address nor a DNS name: "
                    "give e.g. cp.example.org or 192.0.2.10",
                    code="invalid_advertise",
                ) from None
            if name not in dns:
                dns.append(name)
        else:
            if ip not in ips:
                ips.append(ip)
    return dns, ips


def _ipv4_addresses() -> Iterator[str]:
    """Every interface's IPv4 address (SIOCGIFADDR: no dependency beyond the kernel)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _index, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # an interface without an IPv4 address
                continue
            yield socket.inet_ntoa(packed[20:24])


def _ipv6_addresses() -> Iterator[str]:
    try:
        lines = Path("/proc/net/if_inet6").read_text().splitlines()
    except OSError:
        return
    for line in lines:
        raw = line.split()[0]
        yield str(ipaddress.IPv6Address(bytes.fromhex(raw)))


def default_advertise() -> list[str]:
    """This host's name(s) and its global and private addresses; link-local addresses are left out
    (a URL cannot name one without a zone)."""
    names = [socket.gethostname().lower(), socket.getfqdn().lower()]
    out = [n for n in dict.fromkeys(names) if n and _DNS_NAME.match(n)]
    for text in (*_ipv4_addresses(), *_ipv6_addresses()):
        ip = ipaddress.ip_address(text)
        if not (ip.is_loopback or ip.is_link_local or ip.is_unspecified) and text not in out:
            out.append(text)
    return out


def _private_write(path: Path, data: bytes, mode: int) -> None:
    """Atomically, with `mode` from the first byte (a key is never readable by others, even briefly)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Two `provision serve` on one home (tests/provisioner/test_sqlite_locking.py) must not both
    create a CA: the second waits and finds the first one's."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _load_ca(files: TlsFiles) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        cert = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
        key = serialization.load_pem_private_key(files.ca_key.read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise InvalidInput(
            f"the control-plane CA in {files.dir} is unreadable ({exc}): restore it from a backup "
            "(nodes pin it), or remove the directory to create a new CA and re-enrol every node"
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise InvalidInput(f"{files.ca_key} is not an EC key: restore the home's tls/ from a backup")
    return cert, key


def ensure_ca(
    files: TlsFiles, now: datetime | None = None
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """The control-plane CA: loaded, or created once (EC P-256, ten years, key 0600). Never replaced
    here: every node pins it, so a new one means re-enrolling them all (docs/control-plane.md)."""
    if files.ca_cert.exists() or files.ca_key.exists():
        return _load_ca(files)
    now = now or datetime.now(UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "rigbase"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"rigbase control plane CA {socket.gethostname()}"),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _private_write(files.ca_key, _key_pem(key), 0o600)
    _private_write(files.ca_cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert, key


def _sans(cert: x509.Certificate) -> set[str]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {
        *ext.get_values_for_type(x509.DNSName),
        *(str(ip) for ip in ext.get_values_for_type(x509.IPAddress)),
    }


def _current(files: TlsFiles, ca: x509.Certificate, wanted: set[str], now: datetime) -> bool:
    """Whether the server certificate on disk can be kept: same names, from this CA, not near its end,
    and its key is there."""
    try:
        cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
        if not files.key.exists():
            return False
        cert.verify_directly_issued_by(ca)
    except Exception:
        return False
    return _sans(cert) == wanted and cert.not_valid_after_utc - now > RENEW_BEFORE


def ensure_server_cert(files: TlsFiles, advertise: Iterable[str], now: datetime | None = None) -> ServerTls:
    """The CA (created at first start) and a server certificate for `advertise` plus loopback,
    re-issued when that set changed or the certificate is near its end."""
    now = now or datetime.now(UTC)
    dns, ips = split_names([*advertise, *LOOPBACK_NAMES])
    wanted = {*dns, *(str(ip) for ip in ips)}
    with _locked(files.dir):
        ca, ca_key = ensure_ca(files, now)
        issued = not _current(files, ca, wanted, now)
        if issued:
            key = ec.generate_private_key(ec.SECP256R1())
            first = dns[0] if dns else str(ips[0])
            cert = (
                x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, first[:64])]))
                .issuer_name(ca.subject)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - timedelta(minutes=5))
                .not_valid_after(min(now + SERVER_VALIDITY, ca.not_valid_after_utc))
                .add_extension(
                    x509.SubjectAlternativeName(
                        [*(x509.DNSName(n) for n in dns), *(x509.IPAddress(ip) for ip in ips)]
                    ),
                    critical=False,
                )
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .add_extension(
                    x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
                )
                .sign(ca_key, hashes.SHA256())
            )
            _private_write(files.key, _key_pem(key), 0o600)
            _private_write(files.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return ServerTls(files.cert, files.key, files.ca_cert, tuple(sorted(wanted)), issued)


def operator_tls(cert: Path, key: Path, ca: Path | None) -> ServerTls:
    """The operator's own certificate, used as given; checked now so a wrong pair stops the start with
    one line instead of failing every handshake."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
        loaded = x509.load_pem_x509_certificates(cert.read_bytes())
        if ca is not None:
            x509.load_pem_x509_certificates(ca.read_bytes())
    except (OSError, ValueError, ssl.SSLError) as exc:
        raise InvalidInput(
            f"cannot use --tls-cert {cert} / --tls-key {key}"
            f"{f' / --tls-ca {ca}' if ca else ''} ({exc}): give a PEM certificate (chain) and its key"
        ) from None
    return ServerTls(cert, key, ca, tuple(sorted(_sans(loaded[0]))), False)


def server_tls(settings: Settings, host: str) -> ServerTls | None:
    """What this `provision serve` serves with: None for --insecure-http, the operator's certificate
    when given, else the home's CA and a server certificate for the advertised names (plus `host`
    when it is one specific address)."""
    if settings.insecure_http:
        if settings.tls_cert or settings.tls_key:
            raise InvalidInput("--insecure-http and --tls-cert/--tls-key exclude each other: choose one")
        return None
    if bool(settings.tls_cert) != bool(settings.tls_key):
        raise InvalidInput("--tls-cert and --tls-key go together: give both, or neither for the home's CA")
    if settings.tls_cert and settings.tls_key:
        return operator_tls(settings.tls_cert, settings.tls_key, settings.tls_ca)
    if settings.tls_ca:
        raise InvalidInput("--tls-ca names the CA of --tls-cert: give --tls-cert and --tls-key too")
    advertise = list(settings.advertise) or default_advertise()
    if host not in ("", "0.0.0.0", "::"):
        advertise.append(host)
    if settings.peer_address:  # the other hosts' processes check this name (api/tunnel_relay.py)
        advertise.append(settings.peer_address)
    return ensure_server_cert(TlsFiles(settings.tls_dir), advertise)


def node_trust(settings: Settings) -> str | None:
    """The PEM an enrollment bundle carries as `ca_certificate`, for the control plane these settings
    run: the home's CA, the operator's --tls-ca, or nothing (plain HTTP, or a publicly trusted
    certificate)."""
    if settings.insecure_http:
        return None
    path = settings.tls_ca if settings.tls_cert else TlsFiles(settings.tls_dir).ca_cert
    try:
        return path.read_text() if path else None
    except OSError:
        return None


def check_node_url(url: str, settings: Settings) -> str:
    """A bundle's URL must be https unless this control plane serves plain HTTP: a join token and the
    node credential must not cross a network unencrypted."""
    if not settings.insecure_http and not url.lower().startswith("https://"):
        raise InvalidInput(
            f"control plane URL {url!r} is not https: this control plane serves TLS, give its "
            "https:// URL (plain http only for one started with --insecure-http)",
            code="invalid_url",
        )
    return url
