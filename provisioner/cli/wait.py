"""`--wait`: poll a resource until its state reaches one of `done`, showing progress on stderr.

`poll` is the one loop (GET, read the state, stop on done / failed / timeout); `wait_for_state` shows
it as a Rich status line for plain resources, and the GCP commands print one line per change of the
VM's progress (provisioner/cli/gcp.py), which stays readable in CI logs."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Any

from provisioner.cli.common import fail
from provisioner.client import Client

Answer = dict[str, Any]
# (what the errors call it, its state, the state's detail: a progress line or a reason) of one answer
Read = Callable[[Answer], tuple[str, str, str | None]]
# told the name, state, detail and seconds waited so far, after every answer
Show = Callable[[str, str, str | None, float], None]


def poll(
    client: Client,
    path: str,
    read: Read,
    *,
    done: Collection[str],
    failed: Collection[str] = (),
    timeout: float,
    show: Show,
    interval: float = 1.0,
    **params: Any,
) -> Answer:
    """GET `path` until its state is in `done` (the answer is returned); refused (exit 1) naming the state
    when it lands in `failed`, or when `timeout` seconds pass."""
    started = time.monotonic()
    while True:
        answer = client.get(path, **params)
        name, state, detail = read(answer)
        show(name, state, detail, time.monotonic() - started)
        if state in done:
            return answer
        if state in failed:
            fail(f"{name} is {state}: {detail or 'see its history'}")
        if time.monotonic() - started > timeout:
            fail(f"{name} is still {state} after {timeout:.0f} s: check it later with `show`")
        time.sleep(interval)


def wait_for_state(
    client: Client,
    path: str,
    *,
    done: Collection[str],
    failed: Collection[str] = (),
    timeout: float,
    interval: float = 1.0,
    **params: Any,
) -> Answer:
    """A resource answering {name, state, reason}, shown as one Rich status line."""
    from rich.console import Console

    def read(obj: Answer) -> tuple[str, str, str | None]:
        return obj.get("name", path), obj.get("state", "?"), obj.get("reason")

    with Console(stderr=True).status("waiting") as status:

        def show(name: str, state: str, _detail: str | None, elapsed: float) -> None:
            status.update(f"{name}: {state} ({elapsed:.0f} s)")

        return poll(
            client,
            path,
            read,
            done=done,
            failed=failed,
            timeout=timeout,
            show=show,
            interval=interval,
            **params,
        )
