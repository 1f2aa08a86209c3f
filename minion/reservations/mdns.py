"""Publish reservation host names over mDNS with python-zeroconf, on the node's LAN address only.

Why bound to one address: the default zeroconf interface choice answers on every interface, which on a
real node includes container bridges and VPNs, and in tests would include the host's own network.

Per reservation we publish a service `NAME._rigbase._tcp.local.` (or `_udp`) whose SRV record carries
the port and whose A record maps HOST.local to the node's LAN address.

Conflicts: a reservation's host name is unique in its region (the control plane enforces it), but a
foreign device on the LAN may already answer for HOST.local. Before announcing we send one probe
query for HOST.local and listen for `probe_window_s`; a responder that owns the name answers at once
(RFC 6762 §8.1 asks for immediate answers to probes). One short probe instead of RFC's three 250 ms
probes keeps assign→resolvable fast; the listener stays on afterwards, so a responder that shows up
later is still detected. On a conflict we do not fight: we never announce (or we send goodbyes for our
own record) and report `conflict` so an operator can rename one side.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from zeroconf import (
    DNSAddress,
    DNSOutgoing,
    DNSQuestion,
    IPVersion,
    RecordUpdate,
    RecordUpdateListener,
    ServiceInfo,
    Zeroconf,
)
from zeroconf.const import _CLASS_IN, _CLASS_UNIQUE, _DNS_HOST_TTL, _FLAGS_QR_QUERY, _TYPE_A, _TYPE_ANY

from contracts.regional import Protocol
from contracts.reservations import MdnsState, ReservationSpec

log = logging.getLogger(__name__)

# The zeroconf releases whose internals this module reads (the `zeroconf.const` private constants of the
# probe, the outgoing queues of `_drop_pending_answers`), proven by tests/minion/test_mdns_netns.py.
# pyproject.toml pins zeroconf to them; tests/minion/test_zeroconf_pin.py fails on any other version.
ZEROCONF_TESTED: tuple[str, ...] = ("0.154.",)

SERVICE_TYPES = {Protocol.TCP: "_rigbase._tcp.local.", Protocol.UDP: "_rigbase._udp.local."}
PROBE_WINDOW_S = 0.05
# Records with a TTL at or below this are goodbyes (zeroconf keeps them 1 s): a leaving holder, not a rival.
GOODBYE_TTL = 1


@dataclass
class _Entry:
    reservation: ReservationSpec
    info: ServiceInfo | None  # None while probing or after a conflict
    state: MdnsState
    reason: str | None = None
    rival: str | None = None  # the other host's address when state is CONFLICT
    announcing: asyncio.Future[Any] | None = None  # the repeats of the announcement still to send


class _RivalListener(RecordUpdateListener):
    """Sees every A record the node receives; one for a name we serve, from another address, is a rival."""

    def __init__(self, publisher: MdnsPublisher) -> None:
        self.publisher = publisher

    def async_update_records(self, zc: Zeroconf, now: float, records: list[RecordUpdate]) -> None:
        for update in records:
            record = update.new
            if record.type != _TYPE_A or record.ttl <= GOODBYE_TTL:
                continue
            address = socket.inet_ntoa(record.address)  # type: ignore[attr-defined]
            if address != self.publisher.address:
                self.publisher._async_rival(record.name.lower(), address)


def _stop_announcing(entry: _Entry) -> None:
    """Cancel pending repeats of the announcement: one sent after our goodbye would re-add the name to
    every cache on the LAN for its full TTL (seen with avahi when unassign follows assign within 0.5 s)."""
    if entry.announcing is not None and not entry.announcing.done():
        entry.announcing.cancel()
    entry.announcing = None


def _drop_pending_answers(zc: Zeroconf, info: ServiceInfo) -> None:
    """Drop answers about `info` that zeroconf has queued (it delays multicast answers up to ~1 s,
    RFC 6762 §6/§14). Sent after our goodbye, such an answer would put the name back in every cache;
    zeroconf's unregister does not purge them, so we do.

    This reads zeroconf internals (``out_queue``/``out_delay_queue``, ``AnswerGroup.answers``; as of
    0.154). If a zeroconf upgrade changes them we log and carry on, so the goodbye
    itself still goes out; test_avahi_resolves_and_goodbye_withdraws shows whether it still works."""
    names = {info.name.lower(), (info.server or "").lower()}
    try:
        for queue in (zc.out_queue, zc.out_delay_queue):
            for group in queue.queue:
                for record in [r for r in group.answers if r.name.lower() in names]:
                    del group.answers[record]
    except (AttributeError, TypeError) as exc:
        log.warning("cannot purge zeroconf's queued answers (internals changed?): %s", exc)


class MdnsPublisher:
    """Owns one Zeroconf instance bound to the node's LAN address; publishes and withdraws reservations."""

    def __init__(self, address: str, *, probe_window_s: float = PROBE_WINDOW_S) -> None:
        self.address = address
        self.probe_window_s = probe_window_s
        self._entries: dict[str, _Entry] = {}  # by reservation name
        self._lock = threading.Lock()
        self._zc: Zeroconf | None = None
        self._start()

    # -- lifecycle -------------------------------------------------------------------------------
    def _start(self) -> None:
        self._zc = Zeroconf(interfaces=[self.address], ip_version=IPVersion.V4Only)
        self._zc.add_listener(_RivalListener(self), None)

    def close(self) -> None:
        """Goodbyes for everything we publish, then release the sockets."""
        if self._zc is None:
            return
        for name in list(self._entries):
            self.unpublish(name)
        self._zc.close()
        self._zc = None

    def set_address(self, address: str) -> dict[str, MdnsState]:
        """The node's LAN address changed: goodbyes from the old address, re-announce from the new one."""
        if address == self.address:
            return self.states()
        reservations = [e.reservation for e in self._entries.values()]
        self.close()
        self._entries.clear()
        self.address = address
        self._start()
        for res in reservations:
            self.publish(res)
        return self.states()

    # -- publishing ------------------------------------------------------------------------------
    def _run(self, coro: Coroutine[Any, Any, Any], timeout: float = 10) -> Any:
        assert self._zc is not None and self._zc.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._zc.loop).result(timeout)

    def publish(self, res: ReservationSpec) -> MdnsState:
        """Probe for HOST.local, then announce it; returns PUBLISHED or CONFLICT (see module doc)."""
        current = self._entries.get(res.name)
        if current is not None and current.reservation == res and current.state is MdnsState.PUBLISHED:
            return current.state
        if current is not None:
            self.unpublish(res.name)
        entry = _Entry(res, None, MdnsState.PUBLISHED)
        with self._lock:
            self._entries[res.name] = entry
        try:
            self._run(self._async_publish(entry))
        except Exception as exc:
            log.warning("mDNS publish of %s failed: %s", res.fqdn, exc)
            entry.state, entry.reason = MdnsState.ERROR, f"mDNS publish failed: {exc}"
        return entry.state

    async def _async_publish(self, entry: _Entry) -> None:
        zc = self._zc
        assert zc is not None
        res = entry.reservation
        # An RFC 6762 probe: QTYPE ANY for the name, our proposed record in the authority section.
        # Responders answer probes for names they own at once (plain queries may be rate-limited).
        out = DNSOutgoing(_FLAGS_QR_QUERY)
        # QU bit (RFC 6762 §8.1): a responder that multicast the name within the last second (avahi
        # keeps a 1 s history and stays silent) still answers us by unicast at once.
        out.add_question(DNSQuestion(res.fqdn, _TYPE_ANY, _CLASS_IN | _CLASS_UNIQUE))
        # …and A as well: python-zeroconf answers a host name only for an A/AAAA question, not for ANY.
        out.add_question(DNSQuestion(res.fqdn, _TYPE_A, _CLASS_IN | _CLASS_UNIQUE))
        proposed = DNSAddress(
            res.fqdn, _TYPE_A, _CLASS_IN | _CLASS_UNIQUE, _DNS_HOST_TTL, socket.inet_aton(self.address)
        )
        # add_authorative_answer() accepts only PTR records; the list takes any record on the wire
        out.authorities.append(proposed)  # type: ignore[arg-type]
        zc.async_send(out)
        await asyncio.sleep(self.probe_window_s)
        if entry.state is MdnsState.CONFLICT:
            return
        info = ServiceInfo(
            SERVICE_TYPES[res.protocol],
            f"{res.name}.{SERVICE_TYPES[res.protocol]}",
            port=res.port,
            addresses=[socket.inet_aton(self.address)],
            server=res.fqdn,
            properties={"reservation": res.name, "protocol": res.protocol.value},
        )
        entry.info = info
        # cooperating_responders: the instance name is ours by construction (reservation names are
        # unique in the region); the host name was probed above. Returns once the first announcement
        # is queued; the two repeats follow in the background.
        # (a Task at run time; ensure_future returns it unchanged and gives it its Future type)
        entry.announcing = asyncio.ensure_future(
            await zc.async_register_service(info, cooperating_responders=True)
        )

    def _async_rival(self, fqdn: str, address: str) -> None:
        """Runs in zeroconf's loop when another address answers for a name we probe or serve.

        While probing: the name is taken; we never announce and report `conflict`. Already published
        (the other host skipped probing, or appeared after a network merge): we report `conflict` but
        keep answering; withdrawing would hand the name to the host that broke the protocol, and
        renaming is the operator's call, not ours.
        """
        for entry in self._entries.values():
            if entry.reservation.fqdn != fqdn or entry.state is MdnsState.CONFLICT:
                continue
            log.warning("%s is also answered by %s: reporting a conflict", fqdn, address)
            entry.state, entry.rival = MdnsState.CONFLICT, address
            if entry.info is None:
                entry.reason = (
                    f"another host ({address}) already answers for {fqdn.rstrip('.')}; rename one of them"
                )
            else:
                entry.reason = (
                    f"another host ({address}) started answering for {fqdn.rstrip('.')} too; "
                    "rename one of them"
                )

    def unpublish(self, name: str) -> None:
        """Send goodbyes (TTL 0) so every cache on the LAN drops HOST.local → this node at once."""
        with self._lock:
            entry = self._entries.pop(name, None)
        if entry is None or entry.info is None or self._zc is None:
            return
        info = entry.info

        async def _goodbye() -> None:
            assert self._zc is not None
            _stop_announcing(entry)
            _drop_pending_answers(self._zc, info)
            if self._zc.registry.async_get_info_name(info.name):
                await self._zc.async_unregister_service(info)

        try:
            self._run(_goodbye())
        except Exception as exc:
            log.warning("mDNS goodbye for %s failed: %s", entry.reservation.fqdn, exc)

    # -- reporting -------------------------------------------------------------------------------
    def state(self, name: str) -> tuple[MdnsState, str | None] | None:
        entry = self._entries.get(name)
        return None if entry is None else (entry.state, entry.reason)

    def states(self) -> dict[str, MdnsState]:
        return {name: e.state for name, e in self._entries.items()}

    def names(self) -> set[str]:
        return set(self._entries)
