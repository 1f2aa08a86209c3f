"""What a customer's job reaches on the network (tenancy finding 6; minion/jobs/network.py), with real
podman, real nftables and peers in a network namespace this test creates.

The namespace stands for everything outside the node: one veth pair, the node's end 198.18.231.1 (its LAN
address, where a node service listens), the far end 198.18.231.2 (a LAN peer: a datastore, another node),
and on the far end too 169.254.169.254 (a cloud's metadata server) and 203.0.113.7 (the internet). Every
packet stays on this machine."""

from __future__ import annotations

import secrets
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from contracts.jobs import JobNetwork, Peer
from minion.jobs.agent import JobsAgent
from minion.jobs.network import JobsNetwork, NetworkRefused, ruleset
from minion.jobs.podman import Podman
from minion.settings import ContainerSettings
from tests.minion.test_jobs_podman import (  # noqa: F401  (fixtures)
    RUNTIME,
    Agents,
    LogStore,
    agents,
    ended_and_shipped,
    gpu_kind,
    image,
    jobs_network_named,
    server,
    settings,
    store,
    until,
    worker,
)

NODE, LAN_PEER, METADATA, INTERNET = "198.18.231.1", "198.18.231.2", "169.254.169.254", "203.0.113.7"
PORT = 18080
TARGETS = {"node": NODE, "lan": LAN_PEER, "metadata": METADATA, "internet": INTERNET}


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def outside() -> Iterator[str]:
    """The namespace with the peers, each answering on PORT with the address it was reached at, and a
    service of the node's own on its LAN address."""
    if shutil.which("nft") is None or shutil.which("socat") is None:
        pytest.skip("nftables and socat are needed: scripts/install-deps.sh installs them")
    tag = secrets.token_hex(2)
    ns, host_end, far_end = f"rjn-{tag}", f"rjn{tag}h", f"rjn{tag}p"
    _ip("netns", "add", ns)
    servers: list[subprocess.Popen[bytes]] = []
    try:
        _ip("link", "add", host_end, "type", "veth", "peer", "name", far_end)
        _ip("link", "set", far_end, "netns", ns)
        _ip("addr", "add", f"{NODE}/24", "dev", host_end)
        _ip("link", "set", host_end, "up")
        for address in (f"{LAN_PEER}/24", f"{METADATA}/32", f"{INTERNET}/32"):
            _ip("-n", ns, "addr", "add", address, "dev", far_end)
        _ip("-n", ns, "link", "set", far_end, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "route", "add", "default", "via", NODE)
        for address in (METADATA, INTERNET):
            _ip("route", "add", f"{address}/32", "via", LAN_PEER, "dev", host_end)
        answer = "SYSTEM:echo reached-$SOCAT_SOCKADDR"
        servers.append(
            subprocess.Popen(
                ["ip", "netns", "exec", ns, "socat", f"TCP-LISTEN:{PORT},fork,reuseaddr", answer],
                stderr=subprocess.DEVNULL,
            )
        )
        servers.append(  # the node's own service, on the node's LAN address only
            subprocess.Popen(
                ["socat", f"TCP-LISTEN:{PORT},bind={NODE},fork,reuseaddr", answer], stderr=subprocess.DEVNULL
            )
        )
        yield ns
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait(5)
        for address in (METADATA, INTERNET):
            subprocess.run(["ip", "route", "del", f"{address}/32"], capture_output=True)
        subprocess.run(["ip", "link", "del", host_end], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture(scope="module")
def jobs_network() -> Iterator[tuple[str, str]]:
    yield from jobs_network_named("rigbase-jt-net", "10.231.3.0/24")


PROBE = "; ".join(
    f'timeout 3 bash -c "exec 3<>/dev/tcp/{address}/{PORT}; cat <&3" >/dev/null 2>&1 '
    f"&& echo {name}=open || echo {name}=closed"
    for name, address in TARGETS.items()
)


def reached(agent_store: LogStore, job: str) -> dict[str, str]:
    lines = [line.split("=", 1) for line in agent_store.text(job).splitlines() if "=" in line]
    return {name: state for name, state in lines if name in TARGETS}


def run_probe(agent: JobsAgent, job: str, lan: bool, peers: list[Peer] | None = None) -> None:
    until(
        agent,
        [worker(job, PROBE, peers=peers or [])],
        ended_and_shipped,
        timeout=60,
        network=JobNetwork(lan=lan),
    )


@pytest.mark.usefixtures("outside", "image")
def test_a_job_reaches_the_internet_and_the_lan_only_where_its_region_allows_never_the_node_or_metadata(
    agents: Agents,  # noqa: F811
    store: LogStore,  # noqa: F811
) -> None:
    """Tenancy finding 6: jobs on podman's default network reached the LAN and, on GCE, the metadata server
    that holds the region's join token. A job now reaches the internet; the LAN only once its region allows
    it; the node's own services and the metadata server never."""
    agent = agents()
    # the second: the region's owner ran `provision region update R --jobs-lan`
    for job, lan in (("job-closed", False), ("job-lan", True)):
        run_probe(agent, job, lan=lan)
        expected = {"node": "closed", "lan": "open" if lan else "closed", "metadata": "closed"}
        assert reached(store, job) == {**expected, "internet": "open"}, store.text(job)


@pytest.mark.usefixtures("outside", "image")
def test_a_gangs_peers_are_open_on_their_own_ports_while_the_rest_of_the_lan_stays_closed(
    agents: Agents,  # noqa: F811
    store: LogStore,  # noqa: F811
) -> None:
    """A distributed job's workers on other nodes reach each other over the LAN of a region whose jobs may
    not reach the LAN: the address and port of each peer (WorkerAssignment.peers) are open, nothing else."""
    agent = agents()
    run_probe(agent, "job-peer", lan=False, peers=[Peer(address=LAN_PEER, port=PORT)])
    assert reached(store, "job-peer") == {
        "node": "closed",
        "lan": "open",
        "metadata": "closed",
        "internet": "open",
    }, store.text("job-peer")
    # the same peer's address on another port is not the peer: closed
    run_probe(agent, "job-other-port", lan=False, peers=[Peer(address=LAN_PEER, port=PORT + 1)])
    assert reached(store, "job-other-port")["lan"] == "closed", store.text("job-other-port")


def test_the_rules_replace_themselves_whole_and_a_bad_subnet_is_refused(
    jobs_network: tuple[str, str],
) -> None:
    script = ruleset("rigbase_x", "10.231.9.0/24", lan=True)
    assert script.startswith("add table inet rigbase_x\ndelete table inet rigbase_x\n")
    assert "192.168.0.0/16" not in script and "169.254.0.0/16 drop" in script
    assert "192.168.0.0/16" in ruleset("rigbase_x", "10.231.9.0/24", lan=False)
    peers = ruleset("rigbase_x", "10.231.9.0/24", lan=False, peers=[("10.0.0.9", 29500)] * 2)
    assert peers.count("10.0.0.9 . 29500") == 1 and peers.index("accept") < peers.index("192.168.0.0/16")
    podman = Podman(ContainerSettings(**RUNTIME))  # type: ignore[arg-type]
    for bad in ("8.8.8.0/24", "fd00::/64", "10.0.0.1/33"):
        with pytest.raises(ValueError):
            JobsNetwork(podman, "rigbase-bad", bad)
    # a network of that name with another subnet is not taken over
    name, _ = jobs_network
    other = JobsNetwork(podman, name, "10.231.4.0/24")
    JobsNetwork(podman, name, jobs_network[1]).ensure(JobNetwork())
    with pytest.raises(NetworkRefused, match="RIGBASE_JOBS_SUBNET"):
        other.ensure(JobNetwork())
