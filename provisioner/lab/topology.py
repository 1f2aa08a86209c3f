"""The lab's plan as data: which namespaces exist, who sits where on the lab LAN, what each node is called.

Everything `provision lab up` builds and `provision lab down` removes is named here, so the two can
never disagree and a crashed `lab up` is cleaned by name even without its state file.

```
                    rigbase-lab-lan (bridge br0, 10.77.0.0/24, no host interface)
   ┌──────────────┬────────────────┬───────────────┬─────────────┬──────────────────────┐
 .1 router*     .2 cp            .3 client      .11 node1    .12 node2 …     .61 host1** .62 host2** …
 rigbase-lab-   rigbase-lab-cp    rigbase-lab-   rigbase-lab-  (each: swtpm,   rigbase-lab-host1 …
 router ── wan  (control plane's  client         node1          umockdev       (`provision serve`,
 (miniupnpd)    LAN socket, or    (operator's                   profile,       one per control-
                HAProxy**)        laptop)                       minion)        plane host)
 * with --upnp only   ** with --control-planes N > 1 (provisioner/lab/control_planes.py)
```
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from enum import StrEnum

from contracts.bundle import CONTROL_PLANE_PORT

NETNS_PREFIX = "rigbase-lab-"
LAN_CIDR = ipaddress.IPv4Network("10.77.0.0/24")
CP_PORT = (
    CONTROL_PLANE_PORT  # the control plane's port on the lab LAN (the host loopback port is picked free)
)
MIN_NODES, MAX_NODES, DEFAULT_NODES = 1, 16, 2
NODE_HOST_BASE = 10  # node K is .(10+K)
# `lab up --control-planes N`: N `provision serve` hosts on one PostgreSQL behind HAProxy, host K in its
# own namespace at .(60+K); one control plane is the single serve process on SQLite
MIN_CONTROL_PLANES, MAX_CONTROL_PLANES = 1, 5
CONTROL_PLANE_HOST_BASE = 60
REGION = "lab"
PROVIDER = "physical"
HARDWARE_PROFILE = "lab-gpu-node"
# Simulated Jetson devices (`lab up --devices N`): device K has the profile DEVICE_PROFILES[(K-1) % 4], its
# own namespace and the LAN address .(DEVICE_HOST_BASE+K). The Xavier NX has no TPM: it joins with a device
# key, so a lab of two devices or more shows both joins (its region allows devices without a TPM).
MAX_DEVICES, DEFAULT_DEVICES = 16, 0
DEVICE_HOST_BASE = 40
DEVICE_PROFILES = (
    "lab-jetson-agx-orin",
    "lab-jetson-xavier-nx",
    "lab-jetson-orin-nx",
    "lab-jetson-orin-nano",
)
# Devices need a central-storage region with an active storage node (docs/devices.md): a lab with devices
# makes its region central and node-1 its storage node; a lab without keeps local storage, node-1 compute.
STORAGE_NODE = "node-1"
# a directory of each device's region cache (CACHE/models/lab-demo) for `provision device-config add --model`
DEVICE_DEMO_MODEL = "lab-demo"
# Short heartbeats so the walkthrough shows state changes within seconds (production default: 30 s).
HEARTBEAT_SECONDS = 2
# A pending minion retries its join at most this far apart, so an adopted node joins within a second.
JOIN_RETRY_SECONDS = 1


class HostRole(StrEnum):
    LAN = "lan"  # the bridge
    CP = "cp"
    CLIENT = "client"
    ROUTER = "router"
    WAN = "wan"
    NODE = "node"
    DEVICE = "device"
    HOST = "host"  # a control-plane host of a lab with several (`--control-planes N`)


# host numbers on the LAN of the fixed members (the bridge namespace has no address)
HOSTS = {HostRole.ROUTER: 1, HostRole.CP: 2, HostRole.CLIENT: 3}

# exactly the names a lab makes: `lab down` deletes these and nothing else, so namespaces of tests
# (rigbase-<tag>-<role>-<random>) or other tools are never touched
NAME_PATTERN = re.compile(rf"^{NETNS_PREFIX}(lan|cp|client|router|wan|node\d+|device\d+|host\d+)$")
NUMBERED = (HostRole.NODE, HostRole.DEVICE, HostRole.HOST)


def netns_name(role: HostRole, k: int | None = None) -> str:
    return f"{NETNS_PREFIX}{role.value}{k if role in NUMBERED else ''}"


def address(role: HostRole, k: int | None = None) -> str:
    bases = {
        HostRole.NODE: NODE_HOST_BASE,
        HostRole.DEVICE: DEVICE_HOST_BASE,
        HostRole.HOST: CONTROL_PLANE_HOST_BASE,
    }
    host = bases[role] + k if role in bases and k is not None else HOSTS[role]
    return str(LAN_CIDR.network_address + host)


@dataclass(frozen=True)
class NodePlan:
    k: int

    @property
    def name(self) -> str:
        """The node's name in the control plane (a DNS label)."""
        return f"node-{self.k}"

    @property
    def netns(self) -> str:
        return netns_name(HostRole.NODE, self.k)

    @property
    def address(self) -> str:
        return address(HostRole.NODE, self.k)

    @property
    def profile(self) -> str:
        return HARDWARE_PROFILE


@dataclass(frozen=True)
class DevicePlan:
    """A simulated Jetson (service `device`): named device-K in the control plane."""

    k: int

    @property
    def name(self) -> str:
        return f"device-{self.k}"

    @property
    def netns(self) -> str:
        return netns_name(HostRole.DEVICE, self.k)

    @property
    def address(self) -> str:
        return address(HostRole.DEVICE, self.k)

    @property
    def profile(self) -> str:
        return DEVICE_PROFILES[(self.k - 1) % len(DEVICE_PROFILES)]


@dataclass(frozen=True)
class HostPlan:
    """A control-plane host of a lab with several: `provision serve` in its own namespace."""

    k: int

    @property
    def name(self) -> str:
        return f"host{self.k}"

    @property
    def netns(self) -> str:
        return netns_name(HostRole.HOST, self.k)

    @property
    def address(self) -> str:
        return address(HostRole.HOST, self.k)


@dataclass(frozen=True)
class LabPlan:
    nodes: int = DEFAULT_NODES
    upnp: bool = False
    devices: int = DEFAULT_DEVICES
    control_planes: int = MIN_CONTROL_PLANES

    def __post_init__(self) -> None:
        if not MIN_NODES <= self.nodes <= MAX_NODES:
            raise ValueError(f"--nodes {self.nodes} is out of range: use {MIN_NODES} to {MAX_NODES}")
        if not 0 <= self.devices <= MAX_DEVICES:
            raise ValueError(f"--devices {self.devices} is out of range: use 0 to {MAX_DEVICES}")
        if not MIN_CONTROL_PLANES <= self.control_planes <= MAX_CONTROL_PLANES:
            raise ValueError(
                f"--control-planes {self.control_planes} is out of range: "
                f"use {MIN_CONTROL_PLANES} to {MAX_CONTROL_PLANES}"
            )

    def host_plans(self) -> list[HostPlan]:
        """The control-plane hosts of a lab with several; none for the single serve process."""
        if self.control_planes == MIN_CONTROL_PLANES:
            return []
        return [HostPlan(k) for k in range(1, self.control_planes + 1)]

    def node_plans(self) -> list[NodePlan]:
        return [NodePlan(k) for k in range(1, self.nodes + 1)]

    def device_plans(self) -> list[DevicePlan]:
        return [DevicePlan(k) for k in range(1, self.devices + 1)]

    def member_plans(self) -> list[NodePlan | DevicePlan]:
        """Every simulated machine: the nodes, then the devices."""
        return [*self.node_plans(), *self.device_plans()]

    @property
    def storage_mode(self) -> str:
        return "central" if self.devices else "local"

    def fixed_namespaces(self) -> list[tuple[HostRole, str]]:
        roles = [HostRole.LAN, HostRole.CP, HostRole.CLIENT] + (
            [HostRole.ROUTER, HostRole.WAN] if self.upnp else []
        )
        return [(r, netns_name(r)) for r in roles]

    def namespaces(self) -> list[str]:
        members = [p.netns for p in self.member_plans()] + [h.netns for h in self.host_plans()]
        return [n for _, n in self.fixed_namespaces()] + members

    @property
    def cp_lan_url(self) -> str:
        return f"https://{address(HostRole.CP)}:{CP_PORT}"
