"""What a benchmark measured, as data: each bench calls `figure()` for every result it prints, and
bench/__main__.py writes them to bench/results/NAME.json when the bench ends (bench/render.py then
writes docs/performance.md from every results file). A ratio is always the figure divided by its target,
so below 1 is better for a bound ("< 25 ms") and above 1 for a rate ("≥ 200 /s")."""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


@dataclass(frozen=True)
class Figure:
    what: str
    value: float
    unit: str
    target: float | None = None
    bound: str = "<"  # "<": the figure must stay under the target; "≥": reach it
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return None if not self.target else self.value / self.target


@dataclass
class Run:
    bench: str
    method: str
    started_at: str
    load_at_start: float
    figures: list[Figure] = field(default_factory=list)


_current: Run | None = None


def machine() -> dict[str, Any]:
    """The machine, named once at the top of docs/performance.md."""
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or platform.machine(),
    )
    memory_kib = int(Path("/proc/meminfo").read_text().split()[1])
    return {"cpus": os.cpu_count(), "cpu": model, "memory_gib": round(memory_kib / 2**20)}


def begin(bench: str, method: str) -> None:
    global _current
    started = datetime.now(UTC).isoformat(timespec="seconds")
    _current = Run(bench, method.strip(), started, round(os.getloadavg()[0], 2))


def figure(
    what: str,
    value: float,
    unit: str,
    *,
    target: float | None = None,
    bound: str = "<",
    note: str = "",
) -> Figure:
    """Record one result of the running bench (nothing is kept when a bench runs outside `python -m
    bench`, e.g. imported by a test)."""
    made = Figure(what, float(value), unit, target, bound, note)
    if _current is not None:
        _current.figures.append(made)
    return made


def end(directory: Path = RESULTS) -> Path | None:
    """Write the running bench's figures (a bench that recorded none writes nothing)."""
    global _current
    run, _current = _current, None
    if run is None or not run.figures:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{run.bench}.json"
    document = {
        **asdict(run),
        "load_at_end": round(os.getloadavg()[0], 2),
        "ended_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
    }
    path.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    return path


def load_all(directory: Path = RESULTS) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]
