"""The lab's plan as data: which namespaces exist, who sits where on the lab LAN, what each node is called.

Everything `provision lab up` builds and `provision lab down` removes is named here, so the two can
never disagree and a crashed `lab up` is cleaned by name even without its state file.

```
                    rigbase-lab-lan (bridge br0, 10.77.0.0/24, no host interface)
   ┌──────────────┬────────────────┬───────────────┬─────────────┬──────────────────────┐
 .1 router*     .2 cp            .3 client      .11 node1    .12 node2 …
 rigbase-lab-   rigbase-lab-cp    rigbase-lab-   rigbase-lab-  (each: swtpm, umockdev
 router ── wan  (control plane's  client         node1          profile, minion)
 (miniupnpd)    LAN socket)       (operator's laptop)
 * with --upnp only
```
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from enum import StrEnum

NETNS_PREFIX = "rigbase-lab-"
LAN_CIDR = ipaddress.IPv4Network("10.77.0.0/24")
CP_PORT = 8470  # the control plane's port on the lab LAN (the host loopback port is picked free)
MIN_NODES, MAX_NODES, DEFAULT_NODES = 1, 16, 2
NODE_HOST_BASE = 10  # node K is .(10+K)
REGION = "lab"
PROVIDER = "physical"
HARDWARE_PROFILE = "lab-gpu-node"
# Short heartbeats so the walkthrough shows state changes within seconds (production default: 30 s).
HEARTBEAT_SECONDS = 2
# A pending minion retries its join at most this far apart, so an adopted node joins within a second.
JOIN_RETRY_SECONDS = 1


class Role(StrEnum):
    LAN = "lan"  # the bridge
    CP = "cp"
    CLIENT = "client"
    ROUTER = "router"
    WAN = "wan"
    NODE = "node"


# host numbers on the LAN of the fixed members (the bridge namespace has no address)
HOSTS = {Role.ROUTER: 1, Role.CP: 2, Role.CLIENT: 3}

# exactly the names a lab makes: `lab down` deletes these and nothing else, so namespaces of tests
# (rigbase-<tag>-<role>-<random>) or other tools are never touched
NAME_PATTERN = re.compile(rf"^{NETNS_PREFIX}(lan|cp|client|router|wan|node\d+)$")


def netns_name(role: Role, k: int | None = None) -> str:
    return f"{NETNS_PREFIX}{role.value}{k if role is Role.NODE else ''}"


def address(role: Role, k: int | None = None) -> str:
    host = NODE_HOST_BASE + k if role is Role.NODE and k is not None else HOSTS[role]
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
        return netns_name(Role.NODE, self.k)

    @property
    def address(self) -> str:
        return address(Role.NODE, self.k)


@dataclass(frozen=True)
class LabPlan:
    nodes: int = DEFAULT_NODES
    upnp: bool = False

    def __post_init__(self) -> None:
        if not MIN_NODES <= self.nodes <= MAX_NODES:
            raise ValueError(f"--nodes {self.nodes} is out of range: use {MIN_NODES} to {MAX_NODES}")

    def node_plans(self) -> list[NodePlan]:
        return [NodePlan(k) for k in range(1, self.nodes + 1)]

    def fixed_namespaces(self) -> list[tuple[Role, str]]:
        roles = [Role.LAN, Role.CP, Role.CLIENT] + ([Role.ROUTER, Role.WAN] if self.upnp else [])
        return [(r, netns_name(r)) for r in roles]

    def namespaces(self) -> list[str]:
        return [n for _, n in self.fixed_namespaces()] + [p.netns for p in self.node_plans()]

    @property
    def cp_lan_url(self) -> str:
        return f"https://{address(Role.CP)}:{CP_PORT}"
