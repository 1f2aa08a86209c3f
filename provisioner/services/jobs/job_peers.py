"""What a worker knows of its job's other workers (docs/jobs.md "Peers"): its rank, the world, its group,
and where every peer listens, as rigbase's own variables, as torchrun reads them and as OpenPAI's
examples read them.

A worker listens for its peers on the port placement gave it (JobWorker.port, contracts.jobs.PEER_PORTS),
published on its node; a peer's address is its node's in the region (`address_of`). A gang's workers get
their peers only once every one of them is placed on a node with a known address: until then the worker is
not sent (`peers_ready`)."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from contracts.jobs import Peer
from contracts.jobspec import JobKind
from provisioner.services.fleet import node_address
from provisioner.store.job_models import Job, JobWorker
from provisioner.store.models import Node

# podman's, CNI's and docker's own bridges: private addresses, but no other node reaches them
VIRTUAL_PREFIXES = ("podman", "cni-", "docker", "virbr", "veth", "br-")


def _private_v4(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return ip.version == 4 and (ip.is_private or ip in CGNAT) and not (ip.is_loopback or ip.is_link_local)


CGNAT = ipaddress.ip_network("100.64.0.0/10")


PORT_LABEL = "port"  # the one port type a rigbase worker has (OpenPAI's portList label)


def address_of(node: Node | None) -> str | None:
    """Where workers of the region reach this node, from what it reports of itself (inventory
    `addresses`, minion/hardware/addresses.py): the address it beats from when that is its own (a control
    plane on the region's LAN sees it), else the first private IPv4 of a physical NIC, else of any
    interface but a container bridge; without those, the operator's `--hostname`, then the address it
    beats from."""
    if node is None:
        return None
    inventory = node.inventory or {}
    own = [
        (str(a.get("interface") or ""), str(a.get("address") or ""))
        for a in inventory.get("addresses") or []
        if isinstance(a, dict)
    ]
    observed = node_address.observed(node)
    if observed and any(address == observed for _, address in own):
        return observed
    nics = {str(n.get("name")) for n in inventory.get("nics") or [] if isinstance(n, dict)}
    for wanted in (lambda i: i in nics, lambda i: not i.startswith(VIRTUAL_PREFIXES)):
        for interface, address in own:
            if wanted(interface) and _private_v4(address):
                return address
    return node.hostname or observed


def _var(group: str) -> str:
    """A group's name inside a variable's name (a '-' may not be in one)."""
    return group.replace("-", "_")


def peers_ready(job: Job) -> bool:
    """Every worker of the job has a node with an address and a port (what a gang starts on)."""
    return all(w.port is not None and address_of(w.node) is not None for w in job.workers)


def peers_of(job: Job, worker: JobWorker) -> list[Peer]:
    """Where each other worker of a gang listens (an independent job's workers have no peers)."""
    return [
        Peer(address=str(address_of(w.node)), port=int(w.port))
        for w in job.workers
        if w.index != worker.index and w.port is not None and address_of(w.node) is not None
    ]


def environment(job: Job, worker: JobWorker, kind: JobKind, memory_mb: int) -> dict[str, str]:
    """The variables of `worker` about itself and its peers (module docstring)."""
    workers: Sequence[JobWorker] = sorted(job.workers, key=lambda w: w.index)
    env = {
        "RIGBASE_JOB_KIND": kind.value,
        "RIGBASE_WORKERS": str(len(workers)),
        "RIGBASE_RANK": str(worker.index),
        "RIGBASE_WORLD_SIZE": str(len(workers)),
        "RIGBASE_GROUP": worker.group_name,
        "RIGBASE_GROUP_INDEX": str(worker.group_index),
    }
    if worker.port is not None:
        env["RIGBASE_PORT"] = str(worker.port)
    if kind != JobKind.GANG:
        return env
    listening = [(w, address_of(w.node)) for w in workers]
    env["RIGBASE_PEERS"] = ",".join(f"{a}:{w.port}" for w, a in listening)
    rank0, addr0 = listening[0]
    env.update(
        {  # torchrun's (torch.distributed's env:// rendezvous)
            "MASTER_ADDR": str(addr0),
            "MASTER_PORT": str(rank0.port),
            "WORLD_SIZE": str(len(workers)),
            "RANK": str(worker.index),
            "LOCAL_RANK": "0",  # one worker per container
        }
    )
    groups = list(dict.fromkeys(w.group_name for w in workers))
    env.update(
        {  # OpenPAI's runtime variables, as its examples read them
            "PAI_JOB_NAME": job.name,
            "PAI_TASK_ROLE_COUNT": str(len(groups)),
            "PAI_TASK_ROLE_LIST": ",".join(groups),
            "PAI_CURRENT_TASK_ROLE_NAME": worker.group_name,
            "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX": str(worker.group_index),
        }
    )
    for group in groups:
        members = [(w, a) for w, a in listening if w.group_name == group]
        env[f"PAI_TASK_ROLE_TASK_COUNT_{_var(group)}"] = str(len(members))
        first = members[0][0]
        env[f"PAI_RESOURCE_{_var(group)}"] = f"{first.gpu_count},{first.cpu_count},{memory_mb},0"
        for w, a in members:
            key = f"{_var(group)}_{w.group_index}"
            env[f"PAI_HOST_IP_{key}"] = str(a)
            env[f"PAI_PORT_LIST_{key}_{PORT_LABEL}"] = str(w.port)
            env[f"PAI_{key}_{PORT_LABEL}_PORT"] = str(w.port)
    return env
