"""Job metrics as a worker reports them: one line of its output (docs/job-metrics.md).

    rigbase:metric {"step": 10, "loss": 0.31, "accuracy": 0.87}

The line starts with METRIC_PREFIX and a space, then one JSON object: `step` (optional, a whole number)
and up to MAX_NAMES_PER_LINE metric names with finite numbers. The log shipping carries it like any other
line; the control plane reads it from the stored log, so a metric needs no route, credential or library of
its own in the image (sdk/python/rigbase_metrics.py writes the same lines for Python code).

What the control plane refuses is counted and named, never fatal: the job runs on."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Final

METRIC_PREFIX: Final = "rigbase:metric"
STEP_KEY: Final = "step"
MAX_LINE_BYTES: Final = 4096  # a longer line is not read as a metric (one notice, counted as refused)
MAX_NAMES_PER_LINE: Final = 32
MAX_STEP: Final = 2**53  # what a float and JSON carry exactly
MAX_ABS_VALUE: Final = 1e300  # finite and far from overflow in sums and charts
METRIC_POINTS_PER_JOB: Final = 100_000  # past this a job's points are counted and dropped
# a name as dashboards and Prometheus-style tools accept it: letters, digits and _ . / - :
NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_./:-]{0,63}", re.ASCII)


@dataclass(frozen=True, slots=True)
class MetricPoint:
    name: str
    value: float
    step: int | None


class MetricRefused(ValueError):
    """A metric line that is not one (the message says what to fix)."""


def is_metric_line(line: str) -> bool:
    return line.startswith(METRIC_PREFIX + " ")


def _step(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise MetricRefused(f"'{STEP_KEY}' must be a whole number, not {json.dumps(value)[:40]}")
    if not 0 <= value < MAX_STEP:
        raise MetricRefused(f"'{STEP_KEY}' must be from 0 to 2^53")
    return int(value)


def _value(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MetricRefused(f"metric '{name}' must be a number, not {json.dumps(value)[:40]}")
    number = float(value)
    if not math.isfinite(number) or abs(number) > MAX_ABS_VALUE:
        raise MetricRefused(f"metric '{name}' must be a finite number within ±1e300")
    return number


def parse_line(line: str) -> list[MetricPoint]:
    """The points of one metric line (is_metric_line), or MetricRefused naming what is wrong."""
    if len(line.encode()) > MAX_LINE_BYTES:
        raise MetricRefused(f"a metric line holds at most {MAX_LINE_BYTES} bytes: report fewer names")
    body = line[len(METRIC_PREFIX) + 1 :].strip()
    try:
        # NaN and Infinity are not JSON: refuse them rather than let Python's reader take them
        data = json.loads(body, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise MetricRefused(f"not valid JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(data, dict):
        raise MetricRefused('a metric line holds a JSON object, e.g. {"step": 1, "loss": 0.5}')
    step = _step(data.pop(STEP_KEY, None))
    if not data:
        raise MetricRefused("a metric line names at least one metric besides 'step'")
    if len(data) > MAX_NAMES_PER_LINE:
        raise MetricRefused(f"a metric line holds at most {MAX_NAMES_PER_LINE} metrics")
    points = []
    for name, value in data.items():
        if not NAME.fullmatch(name):
            raise MetricRefused(
                f"metric name {json.dumps(name)[:70]} is not valid: letters, digits and _ . / - :, "
                "starting with a letter or _, at most 64"
            )
        points.append(MetricPoint(name=name, value=_value(name, value), step=step))
    return points


def _refuse_constant(constant: str) -> object:
    raise MetricRefused(f"{constant} is not a number JSON carries: report a finite value")


def format_line(values: dict[str, float], step: int | None = None) -> str:
    """The line for these values (what the SDK prints); parse_line(format_line(v, s)) gives them back."""
    data: dict[str, float | int] = {} if step is None else {STEP_KEY: step}
    data.update(values)
    return f"{METRIC_PREFIX} {json.dumps(data, allow_nan=False, separators=(',', ':'))}"
