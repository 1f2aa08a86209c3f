"""Run every benchmark module in bench/ (each exposes `main() -> None` and prints its own figures)."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time

import bench


def main() -> None:
    only = set(sys.argv[1:])
    for mod in sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_")):
        if only and mod.removeprefix("bench_") not in only:
            continue
        print(f"\n== {mod} ==", flush=True)
        started = time.perf_counter()
        importlib.import_module(f"bench.{mod}").main()
        print(f"   ({time.perf_counter() - started:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
