"""mDNS publishing against real peers on a virtual LAN: a second zeroconf process and avahi-daemon."""

from __future__ import annotations

from pathlib import Path

from tests.fixtures.netns import AgentProcess, MdnsLan, resolve, start_avahi

JUPYTER = {"name": "nb", "hostname": "jupyter", "port": 8888}


def _service_port(ns, lan_address: str, instance: str) -> int | None:
    def lookup() -> int | None:
        from zeroconf import IPVersion, Zeroconf

        zc = Zeroconf(interfaces=[lan_address], ip_version=IPVersion.V4Only)
        try:
            info = zc.get_service_info("_rigbase._tcp.local.", instance, timeout=3000)
            return None if info is None else info.port
        finally:
            zc.close()

    return ns.call(lookup)


def test_zeroconf_peer_resolves_name_and_service_port(mdns_lan: MdnsLan) -> None:
    agent = AgentProcess(mdns_lan.node_a, mdns_lan.addr_a)
    try:
        [status] = agent.apply(JUPYTER)
        assert status["state"] == "published" and status["address"] == mdns_lan.addr_a
        lines = resolve(mdns_lan.peer, mdns_lan.addr_peer, "jupyter", until=mdns_lan.addr_a)
        assert lines[-1]["addresses"] == [mdns_lan.addr_a]
        assert _service_port(mdns_lan.peer, mdns_lan.addr_peer, "nb._rigbase._tcp.local.") == 8888
    finally:
        agent.close()


def test_avahi_resolves_and_goodbye_withdraws(mdns_lan: MdnsLan, tmp_path: Path) -> None:
    avahi = start_avahi(mdns_lan.peer, tmp_path / "avahi", "observer")
    agent = AgentProcess(mdns_lan.node_a, mdns_lan.addr_a)
    try:
        agent.apply(JUPYTER)
        assert avahi.resolve("jupyter.local") == mdns_lan.addr_a
        assert agent.apply() == []  # unassign: goodbyes go out
        # avahi cached the name for its 120 s TTL; a goodbye (TTL 0) means "drop it in 1 s" (RFC 6762
        # §10.1). After that, avahi has to ask the LAN again and nobody answers. Without the goodbye
        # it would answer from its cache for two minutes.
        assert avahi.resolve_until("jupyter.local", None, within=2) is None
    finally:
        agent.close()
        avahi.stop()


def test_move_between_nodes_reaches_resolvers(mdns_lan: MdnsLan, tmp_path: Path) -> None:
    avahi = start_avahi(mdns_lan.peer, tmp_path / "avahi", "observer")
    a = AgentProcess(mdns_lan.node_a, mdns_lan.addr_a)
    b = AgentProcess(mdns_lan.node_b, mdns_lan.addr_b)
    try:
        a.apply(JUPYTER)
        assert avahi.resolve("jupyter.local") == mdns_lan.addr_a
        assert resolve(mdns_lan.peer, mdns_lan.addr_peer, "jupyter", until=mdns_lan.addr_a)[-1][
            "addresses"
        ] == [mdns_lan.addr_a]
        a.apply()
        [status] = b.apply(JUPYTER)
        assert status["state"] == "published", status  # A's goodbye is not mistaken for a rival
        # The name moved: both an avahi cache and a zeroconf resolver answer with B's address only.
        # (How fast, < 2 s, is measured in bench/bench_reservations.py; here only the answer counts.)
        assert avahi.resolve_until("jupyter.local", mdns_lan.addr_b, within=5) == mdns_lan.addr_b
        lines = resolve(mdns_lan.peer, mdns_lan.addr_peer, "jupyter", until=mdns_lan.addr_b, timeout=5)
        assert lines[-1]["addresses"] == [mdns_lan.addr_b]
    finally:
        a.close()
        b.close()
        avahi.stop()


def test_conflict_with_another_agent_is_reported_not_fought(mdns_lan: MdnsLan) -> None:
    b = AgentProcess(mdns_lan.node_b, mdns_lan.addr_b)
    a = AgentProcess(mdns_lan.node_a, mdns_lan.addr_a)
    try:
        assert b.apply(JUPYTER)[0]["state"] == "published"
        [status] = a.apply({**JUPYTER, "name": "other"})
        assert status["state"] == "conflict"
        assert mdns_lan.addr_b in status["reason"]
        assert status["address"] is None
        # B keeps the name: A never announced it.
        assert resolve(mdns_lan.peer, mdns_lan.addr_peer, "jupyter", timeout=1)[-1]["addresses"] == [
            mdns_lan.addr_b
        ]
        # The conflict is settled state: the next heartbeat's apply does not re-probe or flip it.
        assert a.apply({**JUPYTER, "name": "other"})[0]["state"] == "conflict"
    finally:
        a.close()
        b.close()


def test_conflict_with_avahi_host_name(mdns_lan: MdnsLan, tmp_path: Path) -> None:
    avahi = start_avahi(mdns_lan.peer, tmp_path / "avahi", "printer")
    assert avahi.resolve("printer.local") == mdns_lan.addr_peer  # avahi owns its name (and has settled)
    agent = AgentProcess(mdns_lan.node_a, mdns_lan.addr_a)
    try:
        [status] = agent.apply({"name": "p", "hostname": "printer", "port": 9100})
        assert status["state"] == "conflict", status
        assert mdns_lan.addr_peer in status["reason"]
        # We did not fight: avahi kept its name instead of renaming itself to printer-2.
        assert "Host name conflict" not in avahi.log
        assert avahi.resolve("printer.local") == mdns_lan.addr_peer
    finally:
        agent.close()
        avahi.stop()


def test_address_change_reannounces(mdns_lan: MdnsLan) -> None:
    agent = AgentProcess(mdns_lan.node_a, mdns_lan.addr_a)
    try:
        agent.apply(JUPYTER)
        assert resolve(mdns_lan.peer, mdns_lan.addr_peer, "jupyter", until=mdns_lan.addr_a)
        # DHCP hands out a new address: it appears on the interface, the old one goes (networkd-style:
        # the new one survives the removal of the old primary).
        mdns_lan.node_a.run(["sysctl", "-qw", "net.ipv4.conf.lan0.promote_secondaries=1"])
        mdns_lan.node_a.add_address("lan0", "10.77.0.50/24")
        [status] = agent.request(op="set_address", address="10.77.0.50")["statuses"]
        mdns_lan.node_a.ip("addr", "del", f"{mdns_lan.addr_a}/24", "dev", "lan0")
        assert status["state"] == "published" and status["address"] == "10.77.0.50"
        lines = resolve(mdns_lan.peer, mdns_lan.addr_peer, "jupyter", until="10.77.0.50", timeout=3)
        assert lines[-1]["addresses"] == ["10.77.0.50"]
    finally:
        agent.close()


def test_lab_teardown_leaves_nothing_behind() -> None:
    """The namespaces (and their veths, bridge and processes) these tests rely on are all removed."""
    import subprocess
    import sys

    import pytest

    from provisioner.lab.netns import Lab, Netns, NetnsError, list_namespaces

    with pytest.raises(ValueError, match="rigbase-"):
        Netns("not-ours")
    with Lab("t-teardown") as lab:
        lan = lab.lan("10.99.0.0/24")
        ns = lab.netns("x")
        lan.attach(ns, 5)
        sleeper = ns.popen([sys.executable, "-c", "import time; time.sleep(60)"])
        names = [n.name for n in lab.namespaces]
        assert set(names) <= set(list_namespaces())
        with pytest.raises(NetnsError, match="ZeroDivisionError"):
            ns.call(lambda: 1 / 0)
        assert ns.call(lambda: open("/proc/net/dev").read().count("lan0")) == 1  # really inside
    assert sleeper.wait(5) is not None  # killed with its namespace
    assert not set(names) & set(list_namespaces())
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert "lan0" not in links and " p0" not in links  # no veth end leaked to the host
