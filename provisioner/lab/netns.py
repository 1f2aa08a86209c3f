"""Network namespaces for the local lab and for tests: virtual LANs that never touch the host's interfaces.

Why this module exists: mDNS and SSDP are multicast protocols, and the host's own interfaces are
multicast-capable, so anything that announces or discovers must run inside namespaces we create and
own. Every namespace made here has a name starting with ``rigbase-``; teardown kills the processes
left inside and deletes the namespace, which also deletes every veth end and bridge inside it, so
nothing is left behind. Leftovers of a crashed run are removed by their owner (``provision lab down``
knows its fixed names; a test's Lab deletes what it recorded), never by deleting every ``rigbase-*``
namespace, which would break runs going on in parallel.

Shared by the tests (tests/fixtures/netns.py) and ``provision lab`` (provisioner/lab/lifecycle.py).
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import pickle
import secrets
import signal
import subprocess
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from contracts.processes import terminate

PREFIX = "rigbase-"
NETNS_DIR = Path("/run/netns")
MULTICAST_NET = "224.0.0.0/4"
CLONE_NEWNET = 0x40000000

T = TypeVar("T")


class NetnsError(RuntimeError):
    """An `ip` command failed; the message carries the command and its stderr."""


def _ip(*args: str) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def setns(path: Path) -> None:
    """Move the calling thread into the network namespace at `path` (os.setns is Python 3.12+)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def unique_name(tag: str) -> str:
    """`rigbase-<tag>-<random>`: unique per run so parallel runs and stale leftovers never collide."""
    return f"{PREFIX}{tag}-{secrets.token_hex(3)}"


@dataclass
class Netns:
    """One network namespace named `rigbase-…`; loopback is brought up on create."""

    name: str

    def __post_init__(self) -> None:
        if not self.name.startswith(PREFIX):
            raise ValueError(f"namespace name {self.name!r} must start with {PREFIX!r}")

    @property
    def path(self) -> Path:
        return NETNS_DIR / self.name

    def exists(self) -> bool:
        return self.path.exists()

    def create(self) -> Netns:
        _ip("netns", "add", self.name)
        self.ip("link", "set", "lo", "up")
        return self

    def ip(self, *args: str) -> str:
        """Run `ip` inside this namespace (`ip -n NAME …`)."""
        return _ip("-n", self.name, *args)

    def argv(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]

    def run(
        self, argv: Sequence[str], *, check: bool = True, timeout: float | None = 30, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a command inside the namespace and wait for it; stdout/stderr are captured as text."""
        return subprocess.run(
            self.argv(argv), capture_output=True, text=True, check=check, timeout=timeout, input=input
        )

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start a long-running command inside the namespace (a daemon, a peer process)."""
        return subprocess.Popen(self.argv(argv), **kwargs)

    def call(self, fn: Callable[..., T], *args: Any, timeout: float = 30, **kwargs: Any) -> T:
        """Run a Python callable in a forked child that has entered this namespace; return its result.

        A fork keeps the caller's own threads and sockets in their namespace: setns() only moves the
        calling thread, and the child is single-threaded, so nothing leaks either way.
        """
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            os.close(read_fd)
            try:
                setns(self.path)
                payload = pickle.dumps((True, fn(*args, **kwargs)))
            except BaseException as exc:
                payload = pickle.dumps((False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
            with os.fdopen(write_fd, "wb") as out:
                out.write(payload)
            os._exit(0)
        os.close(write_fd)
        deadline = time.monotonic() + timeout
        chunks = []
        with os.fdopen(read_fd, "rb") as inp:
            chunks.append(inp.read())
        while True:
            done, _status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise TimeoutError(f"callable in {self.name} ran past {timeout} s")
            time.sleep(0.005)
        ok, value = pickle.loads(b"".join(chunks))
        if not ok:
            raise NetnsError(f"callable in {self.name} failed: {value}")
        return value

    def add_address(self, ifname: str, cidr: str) -> None:
        self.ip("addr", "add", cidr, "dev", ifname)

    def add_route(self, dest: str, *, dev: str | None = None, via: str | None = None) -> None:
        args = ["route", "replace", dest]
        if via:
            args += ["via", via]
        if dev:
            args += ["dev", dev]
        self.ip(*args)

    def add_multicast_route(self, dev: str) -> None:
        """224.0.0.0/4 via the LAN interface: zeroconf and SSDP need it when no default route exists."""
        self.add_route(MULTICAST_NET, dev=dev)

    def enable_forwarding(self) -> None:
        self.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])

    def pids(self) -> list[int]:
        out = _ip("netns", "pids", self.name) if self.exists() else ""
        return [int(p) for p in out.split()]

    def _signal_all(self, sig: int) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def delete(self) -> None:
        """Kill whatever still runs inside, then delete the namespace (and every interface in it)."""
        if not self.exists():
            return
        terminate(self._signal_all, lambda: bool(self.pids()), grace_s=2.0)
        _ip("netns", "delete", self.name)


def veth(a: Netns, if_a: str, b: Netns, if_b: str) -> None:
    """A veth pair with one end in each namespace; created inside `a` so the host never holds an end."""
    a.ip("link", "add", if_a, "type", "veth", "peer", "name", if_b, "netns", b.name)
    a.ip("link", "set", if_a, "up")
    b.ip("link", "set", if_b, "up")


@dataclass
class VirtualLan:
    """A layer-2 segment: a bridge `br0` inside its own namespace, one veth port per attached namespace.

    A bridge (rather than a veth pair) lets more than two hosts share one multicast domain, which is
    what mDNS conflict tests and "move a name from node A to node B" need.
    """

    bridge: Netns
    network: ipaddress.IPv4Network
    members: dict[str, str] = field(default_factory=dict)  # namespace name -> address

    def attach(self, ns: Netns, host: int, *, ifname: str = "lan0", multicast_route: bool = True) -> str:
        """Connect `ns` to the LAN as host number `host` of the network; return its address."""
        address = str(self.network.network_address + host)
        port = f"p{len(self.members)}"
        veth(self.bridge, port, ns, ifname)
        self.bridge.ip("link", "set", port, "master", "br0")
        ns.add_address(ifname, f"{address}/{self.network.prefixlen}")
        if multicast_route:
            ns.add_multicast_route(ifname)
        self.members[ns.name] = address
        return address


class Lab:
    """Owns every namespace it makes; `close()` (or leaving the `with` block) removes them all."""

    def __init__(self, tag: str = "lab") -> None:
        self.tag = tag
        self.namespaces: list[Netns] = []

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def netns(self, role: str) -> Netns:
        ns = Netns(unique_name(f"{self.tag}-{role}")).create()
        self.namespaces.append(ns)
        return ns

    def lan(self, cidr: str = "10.77.0.0/24") -> VirtualLan:
        bridge = self.netns("lan")
        bridge.ip("link", "add", "br0", "type", "bridge")
        # No snooping: every member must see every multicast frame, like a plain switch.
        bridge.ip("link", "set", "br0", "type", "bridge", "mcast_snooping", "0")
        bridge.ip("link", "set", "br0", "up")
        return VirtualLan(bridge, ipaddress.IPv4Network(cidr))

    def close(self) -> None:
        errors = []
        for ns in reversed(self.namespaces):
            try:
                ns.delete()
            except NetnsError as exc:
                errors.append(str(exc))
        self.namespaces.clear()
        if errors:
            raise NetnsError("; ".join(errors))


def list_namespaces(prefix: str = PREFIX) -> list[str]:
    names = [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]
    return [n for n in names if n.startswith(prefix)]


# -- a UPnP router between a WAN and the LAN (`provision lab up --upnp`, tests) --------------------------

# miniupnpd-nftables expects these chains; Debian's nft_init.sh needs iptables, so we create them here.
NFT_RULESET = """
table inet filter {{
  chain forward {{ type filter hook forward priority 0; policy drop;
    ct state established,related accept; jump miniupnpd; iifname "{lan_if}" accept; }}
  chain miniupnpd {{ }}
  chain prerouting {{ type nat hook prerouting priority -100; policy accept; jump prerouting_miniupnpd; }}
  chain prerouting_miniupnpd {{ }}
  chain postrouting {{ type nat hook postrouting priority 100; policy accept;
    jump postrouting_miniupnpd; oifname "{wan_if}" masquerade; }}
  chain postrouting_miniupnpd {{ }}
}}
"""

MINIUPNPD_CONF = """ext_ifname={wan_if}
ext_ip={reported_ip}
listening_ip={lan_if}
http_port={http_port}
enable_upnp=yes
enable_natpmp=no
secure_mode=yes
system_uptime=yes
uuid=3d3cec3a-8cf0-11e0-98ee-00{uuid_tail}
lease_file={state_dir}/leases
{rules}
deny 0-65535 0.0.0.0/0 0-65535
"""


@dataclass
class UpnpRouter:
    """miniupnpd in a router namespace: LAN side on the virtual LAN, WAN side on TEST-NET-1 (192.0.2.0/24).

    miniupnpd refuses private or reserved external addresses, so `reported_ip` (public-looking) is only
    *reported* through ext_ip; nothing ever connects to it. WAN peers reach the router at `wan_router_ip`.
    """

    router: Netns
    wan: Netns
    lan_ip: str
    wan_router_ip: str
    wan_peer_ip: str
    reported_ip: str
    http_port: int
    state_dir: Path
    process: subprocess.Popen[Any] | None = None

    @property
    def root_desc_url(self) -> str:
        return f"http://{self.lan_ip}:{self.http_port}/rootDesc.xml"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def add_upnp_router(
    lab: Lab,
    lan: VirtualLan,
    state_dir: Path,
    *,
    host: int = 1,
    allow: Sequence[str] = ("1024-65535",),
    reported_ip: str = "203.0.114.7",
    http_port: int = 5000,
) -> UpnpRouter:
    """Router + WAN namespaces, forwarding, an nftables ruleset and a running miniupnpd.

    `allow` lists internal port ranges LAN hosts may map; every other request is denied (UPnP 606).
    LAN members should route via `router.lan_ip` (their default route) for replies to reach the WAN.
    """
    router, wan = lab.netns("router"), lab.netns("wan")
    lan_ip = lan.attach(router, host, multicast_route=False)
    veth(router, "wan0", wan, "eth0")
    router.add_address("wan0", "192.0.2.1/24")
    wan.add_address("eth0", "192.0.2.2/24")
    router.enable_forwarding()
    state_dir.mkdir(parents=True, exist_ok=True)
    ruleset = state_dir / "ruleset.nft"
    ruleset.write_text(NFT_RULESET.format(lan_if="lan0", wan_if="wan0"))
    router.run(["nft", "-f", str(ruleset)])
    rules = "\n".join(f"allow {ports} {lan.network} {ports}" for ports in allow)
    conf = state_dir / "miniupnpd.conf"
    conf.write_text(
        MINIUPNPD_CONF.format(
            wan_if="wan0",
            lan_if="lan0",
            reported_ip=reported_ip,
            http_port=http_port,
            uuid_tail=secrets.token_hex(5),
            state_dir=state_dir,
            rules=rules,
        )
    )
    log = open(state_dir / "miniupnpd.log", "w")
    # its own session: the lab's router outlives the `provision lab up` that started it (and its terminal)
    proc = router.popen(
        ["miniupnpd", "-f", str(conf), "-d", "-P", str(state_dir / "miniupnpd.pid")],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    gw = UpnpRouter(router, wan, lan_ip, "192.0.2.1", "192.0.2.2", reported_ip, http_port, state_dir, proc)
    wait_for_tcp(router, lan_ip, http_port, proc, state_dir / "miniupnpd.log")
    return gw


def wait_for_tcp(
    ns: Netns, host: str, port: int, proc: subprocess.Popen[Any], log: Path, timeout: float = 10
) -> None:
    def connect() -> bool:
        import socket

        with socket.socket() as s:
            s.settimeout(0.2)
            return s.connect_ex((host, port)) == 0

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise NetnsError(f"{proc.args!r} exited with {proc.returncode}: {log.read_text()[-500:]}")
        if ns.call(connect):
            return
        time.sleep(0.05)
    raise NetnsError(f"nothing listened on {host}:{port} in {ns.name} after {timeout} s")
