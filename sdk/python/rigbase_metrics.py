"""Report metrics from a rigbase job: `rigbase_metrics.log(step=10, loss=0.31)`.

It prints one `rigbase:metric {...}` line to standard output, which the node ships with the job's log and
the control plane reads as metric points (`provision job metrics NAME`). Standard library only, so it
installs in any image with Python 3.8 or newer: `pip install rigbase-metrics`, or copy this one file.
The line's form is the control plane's contract (contracts/metrics.py in rigbase): the two must agree."""

from __future__ import annotations

import json
import math
import sys
import threading
from typing import TextIO

__all__ = ["PREFIX", "line", "log"]

PREFIX = "rigbase:metric"
_lock = threading.Lock()  # one whole line at a time from a program's threads


def line(step: int | None = None, **values: int | float) -> str:
    """The metric line for `values` at `step` (what `log` prints), or ValueError naming what is wrong."""
    if not values:
        raise ValueError("name at least one metric, e.g. log(step=1, loss=0.5)")
    data: dict = {} if step is None else {"step": int(step)}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"metric {name!r} must be a finite number, not {value!r}")
        data[name] = value
    return f"{PREFIX} {json.dumps(data, allow_nan=False, separators=(',', ':'))}"


def log(step: int | None = None, *, file: TextIO | None = None, **values: int | float) -> None:
    """Print the metric line for `values` at `step` and flush it, so it reaches the log at once."""
    text = line(step, **values)
    out = file if file is not None else sys.stdout
    with _lock:
        out.write(text + "\n")
        out.flush()
