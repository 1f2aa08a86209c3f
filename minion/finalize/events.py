"""ansible-runner events as the contract's FinalizeEvent: which events the node's history keeps."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from contracts.finalize import FAILING, MESSAGE_MAX, TASK_NAME_MAX, FinalizeEvent, TaskStatus

# ansible-runner event name → our status; runner_on_ok is split into ok/changed by the result
EVENT_STATUS: Final[dict[str, TaskStatus]] = {
    "playbook_on_task_start": TaskStatus.STARTED,
    "playbook_on_handler_task_start": TaskStatus.STARTED,
    "runner_on_ok": TaskStatus.OK,
    "runner_on_skipped": TaskStatus.SKIPPED,
    "runner_on_failed": TaskStatus.FAILED,
    "runner_on_unreachable": TaskStatus.UNREACHABLE,
}


def to_event(raw: Mapping[str, Any]) -> FinalizeEvent | None:
    """An ansible-runner event as a FinalizeEvent, or None for events the history doesn't keep
    (play starts, per-item results, stats, verbose output)."""
    status = EVENT_STATUS.get(raw.get("event", ""))
    if status is None:
        return None
    data = raw.get("event_data", {})
    res = data.get("res") or {}
    if status is TaskStatus.OK and res.get("changed"):
        status = TaskStatus.CHANGED
    if status is TaskStatus.FAILED and data.get("ignore_errors"):
        status = TaskStatus.IGNORED
    task = str(data.get("task") or data.get("name") or "?")[:TASK_NAME_MAX]
    return FinalizeEvent(
        task=task,
        status=status,
        message=failure_message(res) if status in FAILING | {TaskStatus.IGNORED} else None,
        handler=raw.get("event") == "playbook_on_handler_task_start" or bool(data.get("is_handler")),
    )


def failure_message(res: Mapping[str, Any]) -> str:
    """The most useful line Ansible gave for a failure (assert's fail_msg, a module's msg, stderr)."""
    for key in ("msg", "stderr", "module_stderr", "stdout"):
        value = res.get(key)
        if value:
            return " ".join(str(value).split())[:MESSAGE_MAX]
    return "the task failed without a message"
