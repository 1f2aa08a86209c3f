"""The job page's charts, as data uPlot draws (static/console.js): one x column and one column per series,
aligned, with null where a series has no point. Metrics are drawn by step (the order they came when a
line has none), one series per worker and name; usage by time, one series per worker."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from provisioner.services.jobs.job_metrics import Point
from provisioner.store.job_models import WorkerUsageSample

GIB = 2**30


def _aligned(xs: list[float], columns: dict[str, dict[float, float]]) -> dict[str, Any]:
    return {
        "labels": list(columns),
        "data": [xs, *([column.get(x) for x in xs] for column in columns.values())],
    }


def metric_series(points: Sequence[Point]) -> dict[str, Any]:
    columns: dict[str, dict[float, float]] = {}
    for order, p in enumerate(points):
        x = float(p.step if p.step is not None else order)
        columns.setdefault(f"{p.name} (worker {p.worker})", {})[x] = p.value
    xs = sorted({x for column in columns.values() for x in column})
    return _aligned(xs, columns)


def usage_series(samples: Sequence[WorkerUsageSample]) -> dict[str, Any]:
    cpu: dict[str, dict[float, float]] = {}
    memory: dict[str, dict[float, float]] = {}
    for s in samples:
        cpu.setdefault(f"CPU cores (worker {s.worker})", {})[s.at] = s.cpu_cores
        memory.setdefault(f"memory GiB (worker {s.worker})", {})[s.at] = round(s.memory_bytes / GIB, 3)
    xs = sorted({s.at for s in samples})
    return _aligned(xs, {**cpu, **memory})


def latest_points(points: Sequence[Point]) -> list[Point]:
    """Each (worker, name)'s last point, for the table beside the chart (and pages without script)."""
    last: dict[tuple[int, str], Point] = {}
    for p in points:
        last[(p.worker, p.name)] = p
    return [last[k] for k in sorted(last)]
