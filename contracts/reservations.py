"""The heartbeat's `reservations` key: what the control plane asks a node to serve (ReservationSpec, in
`desired`) and what the node reports back (ReservationStatus, in `actual`).

Both are plain data so they travel in the heartbeat as JSON: `ReservationSpec.to_dict` writes and
`ReservationSpec.from_dict` reads the desired state, `ReservationStatus.to_dict` goes into the next
heartbeat and `ReservationStatus.from_dict` reads it on the control plane."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from typing import Any

from contracts.identity import is_dns_label
from contracts.regional import Protocol, ReportedState

__all__ = [
    "MdnsState",
    "Protocol",
    "ReportedState",
    "ReservationRefusal",
    "ReservationSpec",
    "ReservationStatus",
    "UpnpState",
]


class UpnpState(enum.StrEnum):
    OFF = "off"  # the node has UPnP disabled (corporate firewall): nothing is sent
    LAN_ONLY = "lan-only"  # the reservation does not ask for a WAN mapping (expose_wan off): nothing is sent
    MAPPED = "mapped"
    HELD_BY_OTHER_HOST = "held-by-other-host"  # UPnP error 718 ConflictInMappingEntry
    REFUSED = "refused"  # UPnP error 606 Action not authorized (router policy)
    NO_IGD = "no-igd"  # no Internet Gateway Device answered
    ERROR = "error"


class MdnsState(enum.StrEnum):
    PUBLISHED = "published"
    CONFLICT = "conflict"
    ERROR = "error"


@dataclass(frozen=True)
class ReservationSpec:
    """Desired: publish HOST.local on the node's LAN and, only when the reservation opts in (`expose_wan`)
    and the node has UPnP on, forward the router's external PORT to node:PORT. LAN-only by default."""

    name: str
    hostname: str
    port: int
    protocol: Protocol = Protocol.TCP
    expose_wan: bool = False

    def __post_init__(self) -> None:
        if not is_dns_label(self.hostname):
            raise ValueError(
                f"hostname {self.hostname!r} must be a DNS label (a-z, 0-9, '-'), e.g. 'jupyter'"
            )
        if not 1 <= self.port <= 65535:
            raise ValueError(f"port {self.port} must be between 1 and 65535")
        object.__setattr__(self, "protocol", Protocol(self.protocol))
        if not isinstance(self.expose_wan, bool):
            raise ValueError(f"expose_wan {self.expose_wan!r} must be true or false")

    @property
    def fqdn(self) -> str:
        return f"{self.hostname}.local."

    def same_name(self, other: ReservationSpec) -> bool:
        """Publishes the same mDNS name and service (only the WAN opt-in may differ)."""
        return (self.name, self.hostname, self.port, self.protocol) == (
            other.name,
            other.hostname,
            other.port,
            other.protocol,
        )

    def to_dict(self) -> dict[str, Any]:
        return {k: (v.value if isinstance(v, enum.Enum) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReservationSpec:
        # `expose_wan` absent (a control plane older than the opt-in): no WAN mapping, the safe default
        return cls(
            data["name"],
            data["hostname"],
            int(data["port"]),
            Protocol(data.get("protocol", "tcp")),
            data.get("expose_wan", False),
        )


@dataclass(frozen=True)
class ReservationStatus:
    """Actual state of one reservation on this node, as reported in the heartbeat."""

    name: str
    state: ReportedState
    mdns: MdnsState | None
    upnp: UpnpState
    address: str | None = None  # the LAN address HOST.local resolves to
    external_address: str | None = None  # "IP:PORT" reachable from outside when mapped
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: (v.value if isinstance(v, enum.Enum) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class ReservationRefusal:
    """An entry of desired["reservations"] the node could not read, reported back with the reason so one
    bad reservation never blocks the rest. `name` is None when the entry had none."""

    name: str | None
    state: ReportedState
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "state": self.state.value, "reason": self.reason}
