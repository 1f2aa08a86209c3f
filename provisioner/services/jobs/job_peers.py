"""What a worker knows of its job's other workers (docs/jobs.md "Peers"): its rank, the world, its group,
and where every peer listens, as rigbase's own variables, as torchrun reads them and as OpenPAI's
examples read them.

A worker listens for its peers on the port placement gave it (JobWorker.port, contracts.jobs.PEER_PORTS),
published on its node; a peer's address is its node's in the region (the operator's `--hostname`, else
the address its minion beats from). A gang's workers get their peers only once every one of them is
placed on a node with a known address: until then the worker is not sent (`peers_ready`)."""

from __future__ import annotations

from collections.abc import Sequence

from contracts.jobs import Peer
from contracts.jobspec import JobKind
from provisioner.services.fleet import node_address
from provisioner.store.job_models import Job, JobWorker
from provisioner.store.models import Node


def address_of(node: Node | None) -> str | None:
    """Where workers of the region reach this node."""
    if node is None:
        return None
    return node.hostname or node_address.observed(node)


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


PORT_LABEL = "port"  # the one port type a rigbase worker has (OpenPAI's portList label)
