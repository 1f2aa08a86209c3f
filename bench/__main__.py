"""Run every benchmark module in bench/ (each exposes `main() -> None`, prints its own figures and records
them with bench.results.figure), then write docs/performance.md from the recorded figures."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
import time

import bench
from bench import render, results


def main() -> None:
    only = {a for a in sys.argv[1:] if not a.startswith("-")}
    for mod in sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_")):
        name = mod.removeprefix("bench_")
        if only and name not in only:
            continue
        print(f"\n== {mod} ==", flush=True)
        started = time.perf_counter()
        module = importlib.import_module(f"bench.{mod}")
        results.begin(name, inspect.getdoc(module) or "")
        module.main()
        results.end()
        print(f"   ({time.perf_counter() - started:.1f} s)", flush=True)
    render.main()


if __name__ == "__main__":
    main()
