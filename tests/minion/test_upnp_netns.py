"""UPnP port mappings against a real miniupnpd router between a WAN and a LAN namespace. A reservation is
LAN-only unless it opts in (`expose_wan`), and the node maps only with UPnP on (docs/reservations.md)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from provisioner.lab.netns import Netns
from tests.fixtures.netns import AgentProcess, UpnpLan

WEB = {"name": "web", "hostname": "web", "port": 8080, "expose_wan": True}


def _router_mapping(ns: Netns, lan_address: str, igd_url: str, port: int, proto: str = "TCP") -> tuple | None:
    """The router's own answer for external `port` (internal host, port, description, enabled, lease)."""

    def ask() -> tuple | None:
        import miniupnpc

        client = miniupnpc.UPnP(multicastif=lan_address)
        client.selectigd(igd_url)
        return client.getspecificportmapping(port, proto)

    return ns.call(ask)


def _ssdp_searches(router_log: Path) -> int:
    return router_log.read_text().count("SSDP M-SEARCH")


def _add_requests(router_log: Path) -> int:
    return router_log.read_text().count("#AddPortMapping")


def _serve_once(ns: Netns, address: str, port: int) -> object:
    """A TCP listener in the node namespace that answers one connection with a greeting."""
    import subprocess
    import sys

    code = (
        "import socket,sys\n"
        f"s=socket.create_server(('{address}',{port}))\n"
        "print('ready',flush=True)\n"
        "c,a=s.accept(); c.sendall(b'hello from node '+a[0].encode()); c.close()\n"
    )
    proc = ns.popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _connect(ns: Netns, host: str, port: int) -> bytes:
    def go() -> bytes:
        with socket.create_connection((host, port), timeout=5) as s:
            return s.recv(100)

    return ns.call(go)


def test_mapping_added_reachable_from_wan_and_removed(upnp_lan: UpnpLan, tmp_path: Path) -> None:
    gw = upnp_lan.router
    cache = tmp_path / "igd-url"
    agent = AgentProcess(
        upnp_lan.node_a, upnp_lan.addr_a, "--upnp", "--igd-cache", str(cache), "--lease", "120"
    )
    server = _serve_once(upnp_lan.node_a, upnp_lan.addr_a, 8080)
    try:
        [status] = agent.apply(WEB)
        assert status["state"] == "mapped", status
        assert status["external_address"] == f"{gw.reported_ip}:8080"  # reported only, never contacted
        assert cache.read_text().strip() == gw.root_desc_url  # SSDP once, then the cached URL
        host, iport, _desc, enabled, lease = _router_mapping(
            upnp_lan.node_a, upnp_lan.addr_a, gw.root_desc_url, 8080
        )
        assert (host, iport, enabled) == (upnp_lan.addr_a, 8080, True) and 0 < lease <= 120
        # A real TCP connection from the WAN side reaches the node through the router's DNAT.
        greeting = _connect(gw.wan, gw.wan_router_ip, 8080)
        assert greeting == f"hello from node {gw.wan_peer_ip}".encode()
        assert agent.apply() == []  # unassign removes the mapping
        assert _router_mapping(upnp_lan.node_a, upnp_lan.addr_a, gw.root_desc_url, 8080) is None
    finally:
        agent.close()
        server.kill()  # type: ignore[attr-defined]


def test_cached_igd_url_skips_ssdp(upnp_lan: UpnpLan, tmp_path: Path) -> None:
    gw = upnp_lan.router
    log = gw.state_dir / "miniupnpd.log"
    cache = tmp_path / "igd-url"
    first = AgentProcess(upnp_lan.node_a, upnp_lan.addr_a, "--upnp", "--igd-cache", str(cache))
    first.apply(WEB)
    first.close()
    searches = _ssdp_searches(log)
    assert searches >= 1 and cache.exists()
    second = AgentProcess(upnp_lan.node_a, upnp_lan.addr_a, "--upnp", "--igd-cache", str(cache))
    try:
        assert second.apply(WEB)[0]["state"] == "mapped"
        assert _ssdp_searches(log) == searches  # straight to selectigd(cached URL)
    finally:
        second.close()


def test_lease_renewed_before_expiry(upnp_lan: UpnpLan) -> None:
    gw = upnp_lan.router
    agent = AgentProcess(
        upnp_lan.node_a, upnp_lan.addr_a, "--upnp", "--igd-url", gw.root_desc_url, "--lease", "60"
    )
    try:
        agent.apply(WEB)
        time.sleep(2.1)  # let the router's lease count down (it reports whole seconds)
        *_, before = _router_mapping(upnp_lan.node_a, upnp_lan.addr_a, gw.root_desc_url, 8080)
        assert before <= 58
        assert agent.request(op="renew", ahead_s=0)["renewed"] == []  # not due yet: half the lease is 30 s
        assert agent.request(op="renew", ahead_s=31)["renewed"] == ["web"]  # 31 s later it is
        *_, after = _router_mapping(upnp_lan.node_a, upnp_lan.addr_a, gw.root_desc_url, 8080)
        assert after > before
    finally:
        agent.close()


def test_port_held_by_another_host_is_reported_718_not_retried(upnp_lan: UpnpLan) -> None:
    gw = upnp_lan.router
    log = gw.state_dir / "miniupnpd.log"
    other = AgentProcess(upnp_lan.node_b, upnp_lan.addr_b, "--upnp", "--igd-url", gw.root_desc_url)
    agent = AgentProcess(upnp_lan.node_a, upnp_lan.addr_a, "--upnp", "--igd-url", gw.root_desc_url)
    try:
        assert other.apply({**WEB, "name": "b-web", "hostname": "bweb"})[0]["state"] == "mapped"
        [status] = agent.apply(WEB)
        assert (status["state"], status["upnp"]) == ("error", "held-by-other-host")
        assert "718" in status["reason"] and status["mdns"] == "published"
        requests = _add_requests(log)
        assert agent.apply(WEB)[0]["upnp"] == "held-by-other-host"  # next heartbeat: same answer…
        assert _add_requests(log) == requests  # …without asking the router again
        host, *_ = _router_mapping(upnp_lan.node_a, upnp_lan.addr_a, gw.root_desc_url, 8080)
        assert host == upnp_lan.addr_b  # and B's mapping was not disturbed
    finally:
        agent.close()
        other.close()


def test_router_refusal_is_reported_606(upnp_lan: UpnpLan) -> None:
    gw = upnp_lan.router
    agent = AgentProcess(upnp_lan.node_a, upnp_lan.addr_a, "--upnp", "--igd-url", gw.root_desc_url)
    try:
        high = {"name": "high", "hostname": "high", "port": 30000, "expose_wan": True}
        [status] = agent.apply(high)  # the router's policy allows < 20000
        assert (status["state"], status["upnp"]) == ("error", "refused")
        assert "606" in status["reason"] and status["external_address"] is None
    finally:
        agent.close()


def test_upnp_off_sends_nothing_to_the_router(upnp_lan: UpnpLan) -> None:
    log = upnp_lan.router.state_dir / "miniupnpd.log"
    before = log.read_text()
    agent = AgentProcess(upnp_lan.node_a, upnp_lan.addr_a)
    try:
        [status] = agent.apply(WEB)
        assert (status["state"], status["upnp"], status["external_address"]) == ("published", "off", None)
    finally:
        agent.close()
    assert upnp_lan.addr_a not in log.read_text()[len(before) :]


def test_lan_only_by_default_even_with_upnp_on(upnp_lan: UpnpLan) -> None:
    """No `expose_wan`: the name is published, the router is never asked; opting in maps the port, opting
    out again removes the mapping while the name stays published (no goodbye, no re-probe)."""
    gw = upnp_lan.router
    log = gw.state_dir / "miniupnpd.log"
    lan_only = {k: v for k, v in WEB.items() if k != "expose_wan"}
    agent = AgentProcess(upnp_lan.node_a, upnp_lan.addr_a, "--upnp", "--igd-url", gw.root_desc_url)
    try:
        requests = _add_requests(log)
        [status] = agent.apply(lan_only)
        assert (status["state"], status["mdns"], status["upnp"], status["external_address"]) == (
            "published",
            "published",
            "lan-only",
            None,
        )
        assert agent.apply(lan_only)[0]["upnp"] == "lan-only"  # and on the next heartbeat
        assert _add_requests(log) == requests  # nothing was asked of the router
        assert _router_mapping(upnp_lan.node_a, upnp_lan.addr_a, gw.root_desc_url, 8080) is None
        assert agent.apply(WEB)[0]["state"] == "mapped"  # `provision reservation update --expose-wan`
        assert _router_mapping(upnp_lan.node_a, upnp_lan.addr_a, gw.root_desc_url, 8080) is not None
        [status] = agent.apply(lan_only)  # `--no-expose-wan`
        assert (status["state"], status["upnp"]) == ("published", "lan-only")
        assert _router_mapping(upnp_lan.node_a, upnp_lan.addr_a, gw.root_desc_url, 8080) is None
    finally:
        agent.close()


def test_shutdown_removes_mappings(upnp_lan: UpnpLan) -> None:
    gw = upnp_lan.router
    agent = AgentProcess(upnp_lan.node_a, upnp_lan.addr_a, "--upnp", "--igd-url", gw.root_desc_url)
    agent.apply(WEB, {"name": "dns", "hostname": "dns", "port": 15353, "protocol": "udp", "expose_wan": True})
    assert _router_mapping(upnp_lan.node_a, upnp_lan.addr_a, gw.root_desc_url, 15353, "UDP") is not None
    agent.close()
    assert _router_mapping(upnp_lan.node_a, upnp_lan.addr_a, gw.root_desc_url, 8080) is None
    assert _router_mapping(upnp_lan.node_a, upnp_lan.addr_a, gw.root_desc_url, 15353, "UDP") is None


def test_address_change_retries_until_the_old_lease_ends(upnp_lan: UpnpLan) -> None:
    """DHCP renumbering: the old address is gone before the agent hears of it, so (secure mode) nobody
    may delete the old mapping; the router answers 718 for the new address until the old lease ends.
    That is our own leftover, not another host's: reported as a transient error and retried."""
    gw = upnp_lan.router
    node = upnp_lan.node_a
    agent = AgentProcess(node, upnp_lan.addr_a, "--upnp", "--igd-url", gw.root_desc_url, "--lease", "3")
    try:
        assert agent.apply(WEB)[0]["state"] == "mapped"
        node.run(["sysctl", "-qw", "net.ipv4.conf.lan0.promote_secondaries=1"])
        node.add_address("lan0", "10.78.0.50/24")
        node.ip("addr", "del", f"{upnp_lan.addr_a}/24", "dev", "lan0")
        node.add_route("default", via=gw.lan_ip)  # the default route went with the old primary address
        [status] = agent.request(op="set_address", address="10.78.0.50")["statuses"]
        assert (status["state"], status["upnp"]) == ("error", "error"), status
        assert f"previous address {upnp_lan.addr_a}" in status["reason"]
        deadline = time.monotonic() + 10
        while (status := agent.apply(WEB)[0])["state"] != "mapped" and time.monotonic() < deadline:
            time.sleep(0.5)  # each heartbeat retries; miniupnpd drops the old mapping when its lease ends
        assert status["state"] == "mapped", status
        host, *_ = _router_mapping(node, "10.78.0.50", gw.root_desc_url, 8080)
        assert host == "10.78.0.50"
    finally:
        agent.close()
