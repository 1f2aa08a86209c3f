"""Reconcile the node's reservations to the desired set from the heartbeat; report what is actually true.

Integration is one call at start-up, `register_heartbeat_handler(agent)` (minion/desired.py then
calls it for the "reservations" key of every heartbeat response), which does:

    statuses = agent.apply([ReservationSpec.from_dict(d) for d in desired["reservations"]])
    actual["reservations"] = [s.to_dict() for s in statuses]

`apply` is idempotent: an unchanged reservation is left alone (no re-probe, no re-announce), so calling it
every heartbeat costs nothing. Answers that are facts (mDNS conflict, UPnP 718/606) are kept until the
desired reservation changes, instead of being retried every heartbeat; transient UPnP failures (no IGD,
router error) are retried on the next apply.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from contracts.heartbeat_keys import HeartbeatKey
from contracts.reservations import (
    MdnsState,
    ReportedState,
    ReservationRefusal,
    ReservationSpec,
    ReservationStatus,
    UpnpState,
)
from minion.reservations.mdns import PROBE_WINDOW_S, MdnsPublisher
from minion.reservations.upnp import DEFAULT_LEASE_S, UpnpMapper

log = logging.getLogger(__name__)

# UPnP outcomes that are settled until the desired reservation changes (not retried per heartbeat).
SETTLED_UPNP = {UpnpState.MAPPED, UpnpState.HELD_BY_OTHER_HOST, UpnpState.REFUSED, UpnpState.OFF}
# UPnP states that are no failure: mapped, or nothing asked of the router (node UPnP off, or LAN-only)
UPNP_FINE = {UpnpState.OFF, UpnpState.LAN_ONLY, UpnpState.MAPPED}
# Summary state by precedence: the first matching rule wins.
SUMMARY_RULES: tuple[tuple[str, ReportedState], ...] = (
    ("mdns-error", ReportedState.ERROR),
    ("mdns-conflict", ReportedState.CONFLICT),
    ("upnp-failed", ReportedState.ERROR),
    ("upnp-mapped", ReportedState.MAPPED),
    ("otherwise", ReportedState.PUBLISHED),
)


def summarize(mdns: MdnsState, upnp: UpnpState) -> ReportedState:
    facts = {
        "mdns-error": mdns is MdnsState.ERROR,
        "mdns-conflict": mdns is MdnsState.CONFLICT,
        "upnp-failed": upnp not in UPNP_FINE,
        "upnp-mapped": upnp is UpnpState.MAPPED,
        "otherwise": True,
    }
    return next(state for fact, state in SUMMARY_RULES if facts[fact])


class ReservationAgent:
    """One per node: mDNS on the LAN address always; a UPnP mapping only for a reservation that opts in
    (`expose_wan`) and only when the node has UPnP on. A reservation is LAN-only by default."""

    def __init__(
        self,
        lan_address: str,
        *,
        upnp: bool,
        igd_url: str | None = None,
        igd_cache: Path | None = None,
        lease_s: int = DEFAULT_LEASE_S,
        probe_window_s: float = PROBE_WINDOW_S,
    ) -> None:
        self.mdns = MdnsPublisher(lan_address, probe_window_s=probe_window_s)
        self.upnp = (
            UpnpMapper(lan_address, lease_s=lease_s, igd_url=igd_url, cache_path=igd_cache) if upnp else None
        )
        self.desired: dict[str, ReservationSpec] = {}
        self._lock = threading.RLock()
        self._renewer: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def lan_address(self) -> str:
        return self.mdns.address

    def apply(self, desired: list[ReservationSpec]) -> list[ReservationStatus]:
        """Make the node serve exactly `desired`; return the actual state of each, in `desired` order."""
        with self._lock:
            wanted = {r.name: r for r in desired}
            for name, current in list(self.desired.items()):
                new = wanted.get(name)
                if new is None or not new.same_name(current):
                    self._withdraw(name)
                elif new.expose_wan != current.expose_wan and self.upnp is not None:
                    self.upnp.unmap(name)  # the WAN opt-in changed: the name stays, the mapping is redone
            for res in desired:
                if res.name not in self.desired:
                    self.mdns.publish(res)
                self.desired[res.name] = res
                if self.upnp is not None and res.expose_wan:
                    mapping = self.upnp.mappings.get(res.name)
                    if mapping is None or mapping.state not in SETTLED_UPNP:
                        self.upnp.map(res)
            return [self.status(r.name) for r in desired]

    def _withdraw(self, name: str) -> None:
        self.desired.pop(name, None)
        self.mdns.unpublish(name)
        if self.upnp is not None:
            self.upnp.unmap(name)

    def status(self, name: str) -> ReservationStatus:
        mdns_state, mdns_reason = self.mdns.state(name) or (MdnsState.ERROR, "not published")
        mapping = self.upnp.mappings.get(name) if self.upnp is not None else None
        if mapping is not None:
            upnp_state = mapping.state
        elif (spec := self.desired.get(name)) is None or not spec.expose_wan:
            upnp_state = UpnpState.LAN_ONLY
        else:
            upnp_state = UpnpState.OFF
        state = summarize(mdns_state, upnp_state)
        reason = mdns_reason or (mapping.reason if mapping is not None else None)
        return ReservationStatus(
            name=name,
            state=state,
            mdns=mdns_state,
            upnp=upnp_state,
            address=self.lan_address if mdns_state is MdnsState.PUBLISHED else None,
            external_address=mapping.external_address if mapping is not None else None,
            reason=reason,
        )

    def statuses(self) -> list[ReservationStatus]:
        with self._lock:
            return [self.status(name) for name in self.desired]

    def set_address(self, lan_address: str) -> list[ReservationStatus]:
        """DHCP gave the node a new LAN address: re-announce the names, re-point the mappings."""
        with self._lock:
            self.mdns.set_address(lan_address)
            if self.upnp is not None:
                self.upnp.rebind(lan_address)
            return self.statuses()

    def renew(self, now: float | None = None) -> list[str]:
        """Renew UPnP leases that are past half their lifetime (called by the background renewer)."""
        with self._lock:
            return self.upnp.renew_due(now) if self.upnp is not None else []

    def start_renewer(self, interval_s: float = 5.0) -> None:
        def loop() -> None:
            while not self._stop.wait(interval_s):
                try:
                    self.renew()
                except Exception:
                    log.exception("UPnP lease renewal failed")

        self._renewer = threading.Thread(target=loop, name="upnp-renewer", daemon=True)
        self._renewer.start()

    def close(self) -> None:
        """Shutdown: goodbyes for every name, remove every mapping we hold."""
        self._stop.set()
        with self._lock:
            for name in list(self.desired):
                self._withdraw(name)
            self.mdns.close()


def register_heartbeat_handler(agent: ReservationAgent) -> None:
    """Hook the agent into the heartbeat (minion/desired.py): desired["reservations"] →
    actual["reservations"].

    An entry the node cannot parse is reported as `error` with the reason; the others still apply, so
    one bad reservation never blocks the rest.
    """
    from minion import desired

    def _apply(value: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        valid: list[ReservationSpec] = []
        rejected: list[ReservationRefusal] = []
        for item in value or []:
            try:
                valid.append(ReservationSpec.from_dict(item))
            except (KeyError, TypeError, ValueError) as exc:
                name = item.get("name") if isinstance(item, dict) else None
                rejected.append(ReservationRefusal(name, ReportedState.ERROR, f"invalid reservation: {exc}"))
        reports: list[ReservationStatus | ReservationRefusal] = [*agent.apply(valid), *rejected]
        return [r.to_dict() for r in reports]

    desired.register(HeartbeatKey.RESERVATIONS, _apply)
