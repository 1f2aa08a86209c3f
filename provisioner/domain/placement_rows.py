"""The match table `provision job create --dry-run` prints, as ChainOpera Launch prints it after
"Searched and matched the following GPU resource for your job:" (provider, instance, vCPUs, memory,
GPUs, region, cost, selected), built from a Placement so the CLI only renders cells."""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.domain.placement import Candidate, Placement, held_share

MATCH_HEADERS: tuple[str, ...] = (
    "Provider",
    "Instance",
    "vCPU(s)",
    "Memory(GiB)",
    "GPU(s)",
    "Region",
    "Cost",
    "Data",
    "Selected",
)
SELECTED_MARK = "√"  # Launch's mark for the row the job will run on


@dataclass(frozen=True)
class MatchRow:
    """One candidate as the job would see it. cost_per_hour: what the job would pay per hour there
    (price per GPU-hour x the job's GPUs; 0 for a CPU-only job, which pays no GPU-hour price)."""

    provider: str
    instance: str
    vcpus: int
    memory_gib: float
    gpus: str  # "TYPE:TOTAL (FREE free)", "-" without GPUs
    region: str
    cost_per_hour: float
    selected: bool
    data: str = "-"  # "cached" (it holds all of the job's objects), "2/3 cached", "fetch"; "-": no data

    def cells(self) -> tuple[str, ...]:
        """The row as MATCH_HEADERS' strings."""
        return (
            self.provider,
            self.instance,
            str(self.vcpus),
            f"{self.memory_gib:.2f}",
            self.gpus,
            self.region,
            f"{self.cost_per_hour:.2f}",
            self.data,
            SELECTED_MARK if self.selected else "",
        )


def _gpus(c: Candidate) -> str:
    if not c.gpu_type or c.gpus_total == 0:
        return "-"
    return f"{c.gpu_type}:{c.gpus_total} ({c.gpus_free} free)"


def _data(placement: Placement, c: Candidate) -> str:
    wanted = len(placement.request.data)
    if not wanted:
        return "-"
    held = held_share(placement.request, c)
    return "cached" if held == wanted else f"{held}/{wanted} cached" if held else "fetch"


def match_rows(placement: Placement, limit: int | None = 10) -> list[MatchRow]:
    """The best `limit` fitting candidates (all with None), the first one selected."""
    gpus = placement.request.gpu_count
    shown = placement.ranked if limit is None else placement.ranked[:limit]
    return [
        MatchRow(
            provider=c.provider,
            instance=c.name,
            vcpus=c.vcpus,
            memory_gib=c.memory_gib,
            gpus=_gpus(c),
            region=c.region,
            cost_per_hour=c.price_per_gpu_hour * gpus,
            selected=i == 0,
            data=_data(placement, c),
        )
        for i, c in enumerate(shown)
    ]
