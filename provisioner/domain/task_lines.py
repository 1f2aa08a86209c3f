"""A playbook task's line in a node's history, written from a minion's FinalizeReport and read back by
`provision node history`, which folds a play's task lines into one unless `--tasks` is given."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Any, Final

from contracts.finalize import TaskStatus
from provisioner.domain.text import printable

_LINE: Final = re.compile(r"task (?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"): (?P<status>[a-z]+)(?::|$)")


def task_line(task: str, status: TaskStatus, message: str | None) -> str:
    return printable(f"task {task!r}: {status.value}" + (f": {message}" if message else ""))


def task_status(reason: str | None) -> TaskStatus | None:
    """The status a task line records, or None for any other line."""
    found = _LINE.match(reason or "")
    if found is None:
        return None
    try:
        return TaskStatus(found["status"])
    except ValueError:
        return None


def fold_tasks(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """History rows with each run of task lines as one row: when the first ran, and the count by status."""
    out: list[dict[str, Any]] = []
    run: list[tuple[dict[str, Any], TaskStatus]] = []

    def flush() -> None:
        if run:
            first = run[0][0]
            counts = Counter(status.value for _, status in run)
            said = ", ".join(f"{n} {status}" for status, n in counts.most_common())
            out.append(first | {"reason": f"{len(run)} playbook task(s): {said} (--tasks lists them)"})
            run.clear()

    for row in rows:
        status = task_status(row.get("reason"))
        if status is None:
            flush()
            out.append(row)
        else:
            run.append((row, status))
    flush()
    return out
