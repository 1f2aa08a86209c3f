"""ReservationAgent: reconciling to the desired set, the summary-state rules, and the desired-state format."""

from __future__ import annotations

import json

import pytest

from contracts.reservations import (
    MdnsState,
    Protocol,
    ReportedState,
    ReservationSpec,
    ReservationStatus,
    UpnpState,
)
from minion.reservations.agent import summarize
from provisioner.lab.netns import Lab, Netns
from tests.fixtures.netns import AgentProcess, MdnsLan


@pytest.mark.parametrize(
    ("mdns", "upnp", "expected"),
    [
        (MdnsState.PUBLISHED, UpnpState.OFF, ReportedState.PUBLISHED),
        (MdnsState.PUBLISHED, UpnpState.LAN_ONLY, ReportedState.PUBLISHED),
        (MdnsState.PUBLISHED, UpnpState.MAPPED, ReportedState.MAPPED),
        (MdnsState.PUBLISHED, UpnpState.HELD_BY_OTHER_HOST, ReportedState.ERROR),
        (MdnsState.PUBLISHED, UpnpState.REFUSED, ReportedState.ERROR),
        (MdnsState.PUBLISHED, UpnpState.NO_IGD, ReportedState.ERROR),
        (MdnsState.CONFLICT, UpnpState.MAPPED, ReportedState.CONFLICT),
        (MdnsState.ERROR, UpnpState.MAPPED, ReportedState.ERROR),
    ],
)
def test_summary_state_rules(mdns: MdnsState, upnp: UpnpState, expected: ReportedState) -> None:
    assert summarize(mdns, upnp) is expected


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"name": "a", "hostname": "Bad_Name", "port": 8080}, "DNS label"),
        ({"name": "a", "hostname": "-x", "port": 8080}, "DNS label"),
        ({"name": "a", "hostname": "ok", "port": 0}, "between 1 and 65535"),
        ({"name": "a", "hostname": "ok", "port": 70000}, "between 1 and 65535"),
        ({"name": "a", "hostname": "ok", "port": 8080, "expose_wan": "yes"}, "true or false"),
    ],
)
def test_invalid_desired_reservation_is_refused(data: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReservationSpec.from_dict(data)


def test_status_serializes_for_the_heartbeat() -> None:
    res = ReservationSpec.from_dict({"name": "nb", "hostname": "jupyter", "port": 8888, "protocol": "udp"})
    assert res.protocol is Protocol.UDP and res.fqdn == "jupyter.local."
    # a control plane older than the WAN opt-in sends no `expose_wan`: LAN-only, the safe default
    assert res.expose_wan is False
    exposed = ReservationSpec.from_dict({**res.__dict__, "protocol": "udp", "expose_wan": True})
    assert exposed.expose_wan is True and exposed.same_name(res) and exposed != res
    status = ReservationStatus(
        "nb", ReportedState.MAPPED, MdnsState.PUBLISHED, UpnpState.MAPPED, "10.0.0.5", "203.0.114.7:8888"
    )
    assert json.loads(json.dumps(status.to_dict()))["state"] == "mapped"


def _reconcile(address: str) -> dict:
    """Inside the node namespace: drive one in-process agent through a sequence of desired sets."""
    from minion.reservations.agent import ReservationAgent

    agent = ReservationAgent(address, upnp=False)
    a = ReservationSpec("a", "alpha", 2000)
    b = ReservationSpec("b", "beta", 2001)
    try:
        first = agent.apply([a, b])
        entry_b = agent.mdns._entries["b"]
        second = agent.apply([b])  # a is withdrawn, b untouched
        untouched = agent.mdns._entries["b"] is entry_b
        moved = agent.apply([ReservationSpec("b", "beta", 2002)])  # same name, new port: re-published
        entry_moved = agent.mdns._entries["b"]
        # only the WAN opt-in changes: the name is not withdrawn and re-announced (no UPnP here: lan-only)
        opted = agent.apply([ReservationSpec("b", "beta", 2002, expose_wan=True)])
        kept = agent.mdns._entries["b"] is entry_moved
        return {
            "first": [s.state.value for s in first],
            "second": [s.name for s in second],
            "names_after_second": sorted(agent.mdns.names()),
            "untouched": untouched,
            "republished": agent.mdns._entries["b"] is not entry_b,
            "moved_port": agent.mdns._entries["b"].info.port if agent.mdns._entries["b"].info else None,
            "moved": [s.state.value for s in moved],
            "moved_upnp": [s.upnp.value for s in moved],
            "opted": [(s.state.value, s.upnp.value) for s in opted],
            "kept": kept,
        }
    finally:
        agent.close()


@pytest.fixture
def lan_node(lab: Lab) -> tuple[Netns, str]:
    """One node namespace on a LAN of its own; the agent runs in-process there via Netns.call."""
    node = lab.netns("node")
    return node, lab.lan("10.79.0.0/24").attach(node, 10)


def test_apply_reconciles_to_the_desired_set(lan_node: tuple[Netns, str]) -> None:
    node, address = lan_node
    result = node.call(_reconcile, address)
    assert result["first"] == ["published", "published"]
    assert result["second"] == ["b"] and result["names_after_second"] == ["b"]
    assert result["untouched"] and result["republished"]
    assert result["moved_port"] == 2002 and result["moved"] == ["published"]
    assert result["moved_upnp"] == ["lan-only"]  # not asked for the WAN
    assert result["opted"] == [("published", "off")] and result["kept"]  # asked, but the node's UPnP is off


def test_serve_rejects_bad_requests_with_a_reason(mdns_lan: MdnsLan) -> None:
    agent = AgentProcess(mdns_lan.node_a, mdns_lan.addr_a)
    try:
        assert (
            "DNS label"
            in agent.request(op="apply", desired=[{"name": "x", "hostname": "NO!", "port": 2000}])["error"]
        )
        assert "unknown op" in agent.request(op="explode")["error"]
        assert agent.status() == []  # nothing half-applied
    finally:
        agent.close()


def _through_heartbeat(address: str) -> list:
    from minion import desired
    from minion.reservations.agent import ReservationAgent, register_heartbeat_handler

    agent = ReservationAgent(address, upnp=False)
    register_heartbeat_handler(agent)
    try:
        return desired.apply(
            {
                "reservations": [
                    {"name": "nb", "hostname": "jupyter", "port": 8888},
                    {"name": "bad", "hostname": "NOT OK", "port": 8889},
                ]
            }
        )["reservations"]
    finally:
        agent.close()


def test_heartbeat_handler_applies_and_reports(lan_node: tuple[Netns, str]) -> None:
    node, address = lan_node
    ok, bad = node.call(_through_heartbeat, address)
    assert (ok["name"], ok["state"], ok["address"], ok["upnp"]) == ("nb", "published", address, "lan-only")
    assert (bad["name"], bad["state"]) == ("bad", "error") and "DNS label" in bad["reason"]
