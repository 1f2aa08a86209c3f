"""What the control plane asks a node to serve (Reservation) and what the node reports back (ReservationStatus).

Both are plain data so they travel in the heartbeat as JSON: `Reservation.from_dict` reads the
desired state from the heartbeat response, `ReservationStatus.to_dict` goes into the next heartbeat.
"""

from __future__ import annotations

import enum
import re
from dataclasses import asdict, dataclass
from typing import Any

DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class Protocol(str, enum.Enum):
    TCP = "tcp"
    UDP = "udp"


class ActualState(str, enum.Enum):
    """The node's observed state of one reservation (an observation, recomputed on every apply)."""

    PUBLISHED = "published"  # HOST.local answers with the node's LAN address; UPnP off or not needed
    MAPPED = "mapped"  # published, and the router forwards external PORT to node:PORT
    CONFLICT = "conflict"  # another host already answers for HOST.local; we stay silent
    ERROR = "error"  # something failed; `reason` says what (UPnP 718/606, no IGD, bad address…)


class UpnpState(str, enum.Enum):
    OFF = "off"  # the node has UPnP disabled (corporate firewall): nothing is sent
    MAPPED = "mapped"
    HELD_BY_OTHER_HOST = "held-by-other-host"  # UPnP error 718 ConflictInMappingEntry
    REFUSED = "refused"  # UPnP error 606 Action not authorized (router policy)
    NO_IGD = "no-igd"  # no Internet Gateway Device answered
    ERROR = "error"


class MdnsState(str, enum.Enum):
    PUBLISHED = "published"
    CONFLICT = "conflict"
    ERROR = "error"


@dataclass(frozen=True)
class Reservation:
    """Desired: publish HOST.local on the node's LAN and (UPnP on) forward external PORT to node:PORT."""

    name: str
    hostname: str
    port: int
    protocol: Protocol = Protocol.TCP

    def __post_init__(self) -> None:
        if not DNS_LABEL.match(self.hostname):
            raise ValueError(f"hostname {self.hostname!r} must be a DNS label (a-z, 0-9, '-'), e.g. 'jupyter'")
        if not 1024 <= self.port <= 65535:
            raise ValueError(f"port {self.port} must be between 1024 and 65535")
        object.__setattr__(self, "protocol", Protocol(self.protocol))

    @property
    def fqdn(self) -> str:
        return f"{self.hostname}.local."

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Reservation:
        return cls(data["name"], data["hostname"], int(data["port"]), Protocol(data.get("protocol", "tcp")))


@dataclass(frozen=True)
class ReservationStatus:
    """Actual state of one reservation on this node, as reported in the heartbeat."""

    name: str
    state: ActualState
    mdns: MdnsState | None
    upnp: UpnpState
    address: str | None = None  # the LAN address HOST.local resolves to
    external_address: str | None = None  # "IP:PORT" reachable from outside when mapped
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: (v.value if isinstance(v, enum.Enum) else v) for k, v in asdict(self).items()}
