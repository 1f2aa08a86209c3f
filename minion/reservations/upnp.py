"""Forward reservation ports through the LAN's router with UPnP IGD (miniupnpc).

Discovery is SSDP (about a second) and is done once: the IGD's root description URL is cached (in
memory and, given `cache_path`, on disk), and later sessions go straight to `selectigd(url)`
(milliseconds). If the cached URL stops answering we fall back to SSDP once.

Router answers that are a fact about the network, not a transient failure, become reported state and
are not retried: 718 ConflictInMappingEntry (another LAN host holds the external port) and 606 Action
not authorized (router policy). Mappings carry a lease; `renew_due()` re-adds them at half the lease,
so a crashed node's mapping expires on its own instead of pointing at a reused address forever.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from contracts.reservations import ReservationSpec, UpnpState

log = logging.getLogger(__name__)

# Short enough that a crashed or renumbered node's leftover mapping (which secure-mode routers let
# nobody else delete) is gone within minutes; renewed at half, so ~2 requests per 15 min per port.
DEFAULT_LEASE_S = 900
DISCOVER_DELAY_MS = 500
# miniupnpc exposes only the control URL after discovery, not the root description URL it came from;
# these are the root description paths of common IGD firmwares (miniupnpd first: most home routers).
ROOT_DESC_PATHS = ("/rootDesc.xml", "/igd.xml", "/gatedesc.xml", "/description.xml")

# miniupnpc raises Exception(strupnperror(code)); the text is all we get, so map it back to meaning.
UPNP_ERRORS: dict[str, tuple[UpnpState, str]] = {
    "ConflictInMappingEntry": (
        UpnpState.HELD_BY_OTHER_HOST,
        "UPnP 718: another host already maps external port {port}",
    ),
    "Action not authorized": (UpnpState.REFUSED, "UPnP 606: the router refused to map external port {port}"),
}


@dataclass
class Mapping:
    reservation: ReservationSpec
    state: UpnpState
    reason: str | None = None
    external_address: str | None = None
    renew_at: float = 0.0


class UpnpMapper:
    """Maps reservation ports on the IGD for one node (`lan_address`); use only when UPnP is on."""

    def __init__(
        self,
        lan_address: str,
        *,
        lease_s: int = DEFAULT_LEASE_S,
        cache_path: Path | None = None,
        igd_url: str | None = None,
        description: str = "rigbase",
    ) -> None:
        self.lan_address = lan_address
        self.lease_s = lease_s
        self.cache_path = cache_path
        self.description = description
        self.igd_url = igd_url or self._read_cache()
        self._upnp: object | None = None  # miniupnpc.UPnP once an IGD is selected
        self._lock = threading.Lock()
        self.mappings: dict[str, Mapping] = {}
        # Mappings we could not remove when the address changed (the old address was already gone):
        # the router keeps them until their lease ends, and answers 718 for the new address until then.
        self._stale: dict[str, str] = {}  # reservation name -> previous LAN address

    # -- IGD -------------------------------------------------------------------------------------
    def _read_cache(self) -> str | None:
        if self.cache_path and self.cache_path.exists():
            return self.cache_path.read_text().strip() or None
        return None

    def _write_cache(self, url: str) -> None:
        self.igd_url = url
        if self.cache_path:
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            self.cache_path.write_text(url + "\n")

    def _new_client(self) -> object:
        import miniupnpc  # only nodes with UPnP on load the C extension

        # multicastif keeps SSDP on the LAN interface; never on the other interfaces of the node.
        return miniupnpc.UPnP(multicastif=self.lan_address, discoverdelay=DISCOVER_DELAY_MS)

    def igd(self) -> object:
        """The selected IGD client: cached URL first (no SSDP), SSDP discovery as the fallback."""
        if self._upnp is not None:
            return self._upnp
        if self.igd_url:
            client = self._new_client()
            try:
                client.selectigd(self.igd_url)  # type: ignore[attr-defined]
                self._upnp = client
                return client
            except Exception as exc:
                log.info("cached IGD %s did not answer (%s); discovering again", self.igd_url, exc)
        client = self._new_client()
        if client.discover() == 0:  # type: ignore[attr-defined]
            raise LookupError("no UPnP Internet Gateway Device answered on the LAN")
        control_url = client.selectigd()  # type: ignore[attr-defined]
        self._upnp = client
        self._remember_root_desc(control_url)
        return client

    def _remember_root_desc(self, control_url: str) -> None:
        parts = urlsplit(control_url)
        for path in ROOT_DESC_PATHS:
            url = f"{parts.scheme}://{parts.netloc}{path}"
            try:
                if self._new_client().selectigd(url) == control_url:  # type: ignore[attr-defined]
                    self._write_cache(url)
                    return
            except Exception:
                continue
        log.info("IGD root description URL not found under %s; SSDP will run again next time", parts.netloc)

    # -- mappings --------------------------------------------------------------------------------
    def map(self, res: ReservationSpec) -> Mapping:
        """Add (or refresh) external PORT → lan_address:PORT with a lease; failures become state."""
        with self._lock:
            mapping = self._add(res)
            self.mappings[res.name] = mapping
            return mapping

    def _add(self, res: ReservationSpec) -> Mapping:
        try:
            client = self.igd()
        except LookupError as exc:
            return Mapping(res, UpnpState.NO_IGD, str(exc))
        proto = res.protocol.value.upper()
        try:
            client.addportmapping(  # type: ignore[attr-defined]
                res.port,
                proto,
                self.lan_address,
                res.port,
                f"{self.description} {res.name}",
                "",
                self.lease_s,
            )
            external_ip = client.externalipaddress()  # type: ignore[attr-defined]
        except Exception as exc:
            state, template = UPNP_ERRORS.get(str(exc), (UpnpState.ERROR, "UPnP error: {error}"))
            if state is UpnpState.HELD_BY_OTHER_HOST and res.name in self._stale:
                # Our own old mapping, not another host's: transient, so left unsettled and retried.
                state = UpnpState.ERROR
                template = (
                    f"the router still maps port {{port}} to this node's previous address "
                    f"{self._stale[res.name]} until that lease ends (at most {self.lease_s} s); retrying"
                )
            if state is UpnpState.ERROR:
                self._upnp = None  # the router may have restarted: select it again next time
            return Mapping(res, state, template.format(port=res.port, error=exc))
        self._stale.pop(res.name, None)
        return Mapping(
            res, UpnpState.MAPPED, None, f"{external_ip}:{res.port}", time.monotonic() + self.lease_s / 2
        )

    def unmap(self, name: str) -> bool:
        """Remove the mapping if we hold it (a refused or conflicting one was never ours to remove).
        Returns False when the router could not be told; the lease then ends it."""
        with self._lock:
            self._stale.pop(name, None)
            mapping = self.mappings.pop(name, None)
            if mapping is None or mapping.state is not UpnpState.MAPPED:
                return True
            res = mapping.reservation
            try:
                self.igd().deleteportmapping(res.port, res.protocol.value.upper())  # type: ignore[attr-defined]
                return True
            except Exception as exc:
                log.warning("removing UPnP mapping for port %s failed: %s", res.port, exc)
                return False

    def renew_due(self, now: float | None = None) -> list[str]:
        """Re-add every mapping past half its lease; returns the names renewed."""
        now = time.monotonic() if now is None else now
        due = [
            m.reservation for m in self.mappings.values() if m.state is UpnpState.MAPPED and m.renew_at <= now
        ]
        for res in due:
            self.map(res)
        return [r.name for r in due]

    def rebind(self, lan_address: str) -> None:
        """The node's LAN address changed: drop our mappings (they point at the old address), re-add them."""
        reservations = [m.reservation for m in self.mappings.values()]
        held = {name for name, m in self.mappings.items() if m.state is UpnpState.MAPPED}
        previous = self.lan_address
        for name in list(self.mappings):
            if not self.unmap(name) and name in held:
                self._stale[name] = previous
        self.lan_address = lan_address
        self._upnp = None  # miniupnpc keeps the old address as its multicast interface and lanaddr
        for res in reservations:
            self.map(res)

    def close(self) -> None:
        for name in list(self.mappings):
            self.unmap(name)
