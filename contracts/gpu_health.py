"""A node's GPUs as NVML sees them, and what each one is fit for (docs/minion-jobs.md, "GPU health").

The minion reads NVML (minion/gpu/health.py) and reports a GpuHealthReport under the heartbeat's
`gpu_health` key; the control plane keeps it on the node, shows it (`provision node show`, the console)
and places jobs by it (provisioner/domain/placement.py): only `ok` GPUs are offered, and a `failed` GPU
takes its whole node out of placement until an operator resets or replaces it.

The states and which ones are offered are data here, so both ends read one table."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Final

from pydantic import Field

from contracts.jobs import MESSAGE_MAX, ByteCount
from contracts.messages import MinionMessage


class GpuState(StrEnum):
    OK = "ok"  # offered to jobs
    BUSY = "busy"  # a process outside rigbase's containers holds it: not offered while it does
    LOST = "lost"  # fell off the bus, or NVML cannot open it: not offered
    FAILED = "failed"  # uncorrectable ECC errors or a fatal Xid since the driver loaded: its node is out


OFFERED: Final = frozenset({GpuState.OK})
TAKES_NODE_OUT: Final = frozenset({GpuState.FAILED})

# Xid codes that mean the GPU needs a reset or more (NVIDIA's Xid catalogue): a job on it is lost, and
# the next one would be too. Others (13, 31, 43: an application's own fault) say nothing of the GPU.
FATAL_XIDS: Final = {
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "the GPU has fallen off the bus",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}

Reason = Annotated[str, Field(max_length=MESSAGE_MAX)]


class GpuHealth(MinionMessage):
    """One GPU: its facts, its last sample, what its counters say, and the state that follows."""

    index: int = Field(ge=0, le=63)
    uuid: str | None = Field(None, max_length=80)
    name: str | None = Field(None, max_length=96)
    pci_bus_id: str | None = Field(None, max_length=32)
    memory_bytes: ByteCount | None = None
    pcie_gen: int | None = Field(None, ge=1, le=9)  # the link's current generation and width
    pcie_width: int | None = Field(None, ge=1, le=32)
    mig: bool | None = None  # MIG mode on (the GPU is split into instances); None: not a MIG GPU
    ecc_uncorrected: int | None = Field(None, ge=0)  # volatile: since the driver loaded
    ecc_corrected: int | None = Field(None, ge=0)
    xid: int | None = Field(None, ge=0, le=1_000_000)  # the last fatal Xid seen, if any
    util_pct: float | None = Field(None, ge=0, le=100)
    memory_used_bytes: ByteCount | None = None
    power_w: float | None = Field(None, ge=0, le=10_000)
    temp_c: float | None = Field(None, ge=-50, le=200)
    outside_pids: list[int] = Field(
        default_factory=list, max_length=64
    )  # holders not in rigbase's containers
    state: GpuState
    reason: Reason | None = None  # why it is not ok, in one line


class GpuHealthReport(MinionMessage):
    """What the node's NVML says: the driver, every GPU, or why NVML could not be read (one line)."""

    driver_version: str | None = Field(None, max_length=32)
    gpus: list[GpuHealth] = Field(default_factory=list, max_length=64)
    problem: Reason | None = None  # no driver module, a library/module version mismatch, …
    # why the node has no CDI spec of its GPUs (a directory it cannot write, no libraries): none is offered
    cdi_problem: Reason | None = None

    def offered(self) -> int:
        if self.cdi_problem:  # podman cannot give a GPU without the spec
            return 0
        return sum(1 for g in self.gpus if g.state in OFFERED)

    def out_of_placement(self) -> str | None:
        """Why the node takes no job (a failed GPU), or None."""
        failed = [g for g in self.gpus if g.state in TAKES_NODE_OUT]
        if not failed:
            return None
        first = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        return f"GPU {first.index} failed: {first.reason or 'see provision node show'}{more}"
