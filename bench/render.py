"""docs/performance.md from bench/results/*.json: one table of every figure (what, the figure, its target,
the ratio, the load average while it ran), the machine once at the top, and each bench's method once.
`make bench` runs it after the benches; `python -m bench.render` alone re-renders what is recorded."""

from __future__ import annotations

import pkgutil
from pathlib import Path
from typing import Any

import bench
from bench.results import RESULTS, load_all

OUT = Path(__file__).resolve().parents[1] / "docs" / "performance.md"


def _number(value: float) -> str:
    if value == 0 or abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _row(run: dict[str, Any], fig: dict[str, Any]) -> str:
    unit = f" {fig['unit']}" if fig["unit"] else ""
    target = ratio = "—"
    if fig["target"]:
        target = f"{fig['bound']} {_number(fig['target'])}{unit}"
        ratio = f"{fig['value'] / fig['target']:.2f}"
    what = fig["what"] + (f" ({fig['note']})" if fig["note"] else "")
    load = f"{run['load_at_start']:.1f}–{run['load_at_end']:.1f}"
    return f"| {run['bench']} | {what} | {_number(fig['value'])}{unit} | {target} | {ratio} | {load} |"


def render(runs: list[dict[str, Any]]) -> str:
    if not runs:
        return "# Performance\n\nNo benchmark has recorded figures yet: run `make bench`.\n"
    machine = runs[-1]["machine"]  # when each bench ran is in bench/results/ and git, not on this page
    lines = [
        "# Performance",
        "",
        f"Measured on {machine['cpus']} cores ({machine['cpu']}), {machine['memory_gib']} GiB of memory:",
        "the machine kind of CI. `make bench` runs every `bench/bench_*.py` and writes this page from",
        "`bench/results/`; `.venv/bin/python -m bench NAME` runs one and writes the page again. Only the",
        "latest figures are kept (older ones are in git's history). A ratio is the figure divided by its",
        "target: under 1 meets a `<` target, 1 or more meets a `≥` one. The load is the load average at the",
        "bench's start and end: a figure measured beside other work is an upper bound. This machine's speed",
        "moves from hour to hour, so compare figures within one run of a bench.",
        "",
        "| bench | what | figure | target | ratio | load |",
        "|---|---|---|---|---|---|",
    ]
    lines += [_row(run, fig) for run in runs for fig in run["figures"]]
    missing = sorted(set(_benches()) - {r["bench"] for r in runs})
    if missing:
        lines += [
            "",
            "Not recorded yet (no `bench/results/` file): "
            + ", ".join(f"`{name}`" for name in missing)
            + "; `.venv/bin/python -m bench NAME` measures one.",
        ]
    lines += ["", "## How each bench measures", ""]
    for run in runs:
        lines += [f"### {run['bench']}", "", run["method"], ""]
    return "\n".join(lines).rstrip() + "\n"


def _benches() -> list[str]:
    return [
        m.name.removeprefix("bench_")
        for m in pkgutil.iter_modules(bench.__path__)
        if m.name.startswith("bench_")
    ]


def main() -> None:
    OUT.write_text(render(load_all(RESULTS)))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
