"""The `reservations` (and `upnp`) keys of the heartbeat, started lazily so the minion stays light.

`minion run` calls `setup` once (minion/join/run.py RUN_HOOKS). Nothing here imports zeroconf or
miniupnpc: the ReservationAgent is created on the first heartbeat that assigns a reservation, and
from then on the agent's own handler (agent.register_heartbeat_handler) serves the key. At shutdown
(minion.desired.shutdown()) the agent sends its goodbyes and removes its mappings, and the key is handed
back to the lazy starter here.

Settings: the LAN address is the one the kernel picks for mDNS multicast (the interface mDNS goes
out of), unless `configure(lan_address=…)` says otherwise (`minion run` passes $RIGBASE_LAN_ADDRESS from
its settings, minion/settings.py); UPnP follows the
node's setting in the control plane (desired key `upnp`, i.e. `provision node add --no-upnp`)."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.heartbeat_keys import HeartbeatKey
from minion import desired

MDNS_GROUP = ("224.0.0.251", 5353)


@dataclass
class ReservationAgentSettings:
    """What the lazily started ReservationAgent is created with; `configure` changes it at run time."""

    lan_address: str | None = None
    upnp: bool = False
    igd_cache: Path | None = None


SETTINGS = ReservationAgentSettings()
_agent: Any = None  # minion.reservations.agent.ReservationAgent once something was assigned


def multicast_source_address() -> str:
    """The address the kernel uses for mDNS multicast: connect() on UDP sends nothing, it only routes."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(MDNS_GROUP)
        return s.getsockname()[0]


def configure(
    *, lan_address: str | None = None, upnp: bool | None = None, igd_cache: Path | None = None
) -> None:
    """Called by `minion run` at start (igd_cache under its state dir) and on a DHCP address change."""
    if igd_cache is not None:
        SETTINGS.igd_cache = igd_cache
    if lan_address is not None and lan_address != SETTINGS.lan_address:
        SETTINGS.lan_address = lan_address
        if _agent is not None:
            _agent.set_address(lan_address)  # goodbyes from the old address, announce from the new
    if upnp is not None and upnp != SETTINGS.upnp:
        SETTINGS.upnp = upnp
        if _agent is not None:  # the agent maps only when built with UPnP on: rebuild on the next apply
            close()


def _start_agent() -> None:
    global _agent
    from minion.reservations.agent import ReservationAgent, register_heartbeat_handler

    address = SETTINGS.lan_address or multicast_source_address()
    _agent = ReservationAgent(address, upnp=SETTINGS.upnp, igd_cache=SETTINGS.igd_cache)
    if SETTINGS.upnp:
        _agent.start_renewer()
    register_heartbeat_handler(_agent)  # the agent's handler now serves desired["reservations"]
    desired.on_shutdown(close)


def close() -> None:
    """Goodbyes for every name, remove every mapping; the next assignment starts a fresh agent."""
    global _agent
    agent, _agent = _agent, None
    desired.register(HeartbeatKey.RESERVATIONS, apply_reservations)
    if agent is not None:
        agent.close()
        if close in desired.SHUTDOWN:
            desired.SHUTDOWN.remove(close)


def apply_upnp(value: Any) -> None:
    if isinstance(value, bool):
        configure(upnp=value)


def apply_reservations(value: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    if not value:
        return []  # nothing assigned and no agent yet: no socket, no zeroconf import
    _start_agent()
    handler = desired.handler_for(HeartbeatKey.RESERVATIONS)
    assert handler is not None and handler is not apply_reservations  # the agent registered its own
    return handler(value)


def register_handlers() -> None:
    """The lazy `upnp` and `reservations` handlers: no agent, no socket until something is assigned."""
    desired.register(HeartbeatKey.UPNP, apply_upnp)
    desired.register(HeartbeatKey.RESERVATIONS, apply_reservations)


def setup(ctx: Any) -> None:
    """`minion run`'s hook (ctx: minion.join.run.RunContext): the LAN address and the IGD cache, then the
    handlers."""
    configure(lan_address=ctx.lan_address, igd_cache=ctx.state.path / "igd-cache.json")
    register_handlers()
