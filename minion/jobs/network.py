"""The network a customer's job reaches (docs/minion-jobs.md, "What a job can and cannot reach").

Jobs run on a podman bridge network of the minion's own (ContainerSettings.jobs_network, its own IPv4
subnet), and one nftables table (`inet rigbase_jobs` for the network `rigbase-jobs`) narrows it:

- the node itself (the input hook: every address the node has, its services, its sshd, the bridge's
  gateway) is closed to the subnet, except the answers to connections the node opened (a published port);
- link-local addresses, where a cloud's metadata server answers (169.254.169.254 holds a GCE VM's
  bundle and the region's join token), are closed always;
- the private and shared address ranges (the LAN, a region's datastores and peers) are closed unless the
  region allows its jobs the LAN (`provision region update R --jobs-lan`: JobsDesired.network.lan);
  the address and port of each peer of a gang running here (WorkerAssignment.peers) stay open, so the
  workers of a distributed job on other nodes reach each other on the ports rigbase gave them and nothing
  else of the LAN;
- everything else (the internet: registries, package mirrors, model hubs) is open, and so is DNS (port
  53) wherever the node's resolvers are: on a LAN router, or on GCE at the metadata server's address,
  whose HTTP stays closed.

Rules only drop: podman's own (CNI) chains still accept and masquerade as they do, and replies to
connections that were allowed (an endpoint's clients on the LAN) pass. The table is replaced whole in one
`nft -f` transaction, so a change never leaves the rules half-applied."""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from contracts.jobs import JobNetwork, Peer
from minion.jobs.podman import Podman, PodmanError

NFT_TIMEOUT_S: Final = 30.0
# what "the LAN" is to a job: RFC 1918, carrier-grade NAT (RFC 6598) and the benchmarking range a lab
# may use (RFC 2544); link-local is closed on its own rule, whatever the region allows
LAN_RANGES: Final = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "198.18.0.0/15")
LINK_LOCAL: Final = "169.254.0.0/16"


class NetworkRefused(Exception):
    """The jobs network or its rules cannot be put in place; the message says what to do."""


PeerPort = tuple[str, int]  # an IPv4 address and a TCP port


def ruleset(table: str, subnet: str, *, lan: bool, peers: Sequence[PeerPort] = ()) -> str:
    """The nft script that replaces `table` with the rules for `subnet` (an `add` first, so the
    `delete` finds a table on the first run too); `peers` stay open when the LAN is closed."""
    lan_rule = "" if lan else f"        ip saddr {subnet} ip daddr {{ {', '.join(LAN_RANGES)} }} drop\n"
    if peers and not lan:
        listed = ", ".join(f"{address} . {port}" for address, port in sorted(set(peers)))
        lan_rule = f"        ip saddr {subnet} ip daddr . tcp dport {{ {listed} }} accept\n" + lan_rule
    return (
        f"add table inet {table}\n"
        f"delete table inet {table}\n"
        f"table inet {table} {{\n"
        "    chain node {\n"
        "        type filter hook input priority filter - 10; policy accept;\n"
        f"        ip saddr {subnet} ct state established,related accept\n"
        f"        ip saddr {subnet} drop\n"
        "    }\n"
        "    chain onward {\n"
        "        type filter hook forward priority filter - 10; policy accept;\n"
        f"        ip saddr {subnet} ct state established,related accept\n"
        f"        ip saddr {subnet} meta l4proto {{ tcp, udp }} th dport 53 accept\n"
        f"        ip saddr {subnet} ip daddr {LINK_LOCAL} drop\n"
        f"{lan_rule}"
        "    }\n"
        "}\n"
    )


def peer_ports(peers: Iterable[Peer]) -> tuple[PeerPort, ...]:
    """The IPv4 (address, port) of each peer; a peer given by name is resolved (one that does not resolve
    stays closed: its worker's connection fails, and says so in its log)."""
    out: set[PeerPort] = set()
    for peer in peers:
        try:
            out.add((str(ipaddress.IPv4Address(peer.address)), peer.port))
            continue
        except ValueError:
            pass
        try:
            found = socket.getaddrinfo(peer.address, peer.port, socket.AF_INET, socket.SOCK_STREAM)
        except OSError:
            continue
        out |= {(str(info[4][0]), peer.port) for info in found}
    return tuple(sorted(out))


def table_of(network: str) -> str:
    return "rigbase_" + network.removeprefix("rigbase-").replace("-", "_")


@dataclass
class JobsNetwork:
    """The minion's jobs network: made once, its rules applied whenever the region's policy changes."""

    podman: Podman
    name: str
    subnet: str
    nft: str = "nft"
    applied: tuple[JobNetwork, tuple[PeerPort, ...]] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        net = ipaddress.ip_network(self.subnet)  # a bad setting fails at start, not at the first job
        if net.version != 4 or not net.is_private:
            raise ValueError(f"jobs subnet {self.subnet}: use a private IPv4 subnet, e.g. 10.89.0.0/24")

    @property
    def table(self) -> str:
        return table_of(self.name)

    def ensure(self, policy: JobNetwork, peers: tuple[PeerPort, ...] = ()) -> None:
        """The network exists and the rules for `policy` and `peers` are in force (a no-op when they
        already are)."""
        with self.lock:
            if self.applied == (policy, peers):
                return
            self._ensure_network()
            script = ruleset(self.table, self.subnet, lan=policy.lan, peers=peers)
            try:
                done = subprocess.run(
                    [self.nft, "-f", "-"], input=script, capture_output=True, text=True, timeout=NFT_TIMEOUT_S
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise NetworkRefused(f"cannot run {self.nft} ({exc}): install nftables on the node") from None
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                raise NetworkRefused(f"nft refused the jobs network's rules: {last}")
            self.applied = (policy, peers)

    def _ensure_network(self) -> None:
        try:
            found = json.loads(self.podman.call(["network", "ls", "--format", "json"]) or "[]")
        except (PodmanError, ValueError) as exc:
            raise NetworkRefused(f"cannot list podman's networks: {exc}") from None
        for net in found:
            if net.get("name") == self.name:
                subnets = [s.get("subnet") for s in net.get("subnets") or []]
                if subnets != [self.subnet]:
                    raise NetworkRefused(
                        f"podman network {self.name} has subnet(s) {subnets}, not {self.subnet}: "
                        f"remove it (podman network rm {self.name}) or set RIGBASE_JOBS_SUBNET"
                    )
                return
        try:  # no DNS server of podman's on the gateway: the node's own addresses are closed to jobs
            self.podman.call(["network", "create", "--subnet", self.subnet, "--disable-dns", self.name])
        except PodmanError as exc:
            raise NetworkRefused(f"cannot create podman network {self.name}: {exc}") from None

    def remove(self) -> None:
        """Take the rules and the network away (tests; a node being retired)."""
        with self.lock:
            subprocess.run(
                [self.nft, "delete", "table", "inet", self.table], capture_output=True, check=False
            )
            try:
                self.podman.call(["network", "rm", "--force", self.name])
            except PodmanError:
                pass
            self.applied = None
