"""`--wait`: poll a resource until its state reaches one of `done`, with a progress line on stderr."""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any

from rich.console import Console

from provisioner.cli.client import Client
from provisioner.cli.common import fail


def wait_for_state(client: Client, path: str, *, done: Collection[str], failed: Collection[str] = (),
                   timeout: float, interval: float = 1.0, **params: Any) -> dict[str, Any]:
    started = time.monotonic()
    with Console(stderr=True).status("waiting") as status:
        while True:
            obj = client.get(path, **params)
            state = obj.get("state", "?")
            status.update(f"{obj.get('name', path)}: {state} ({time.monotonic() - started:.0f} s)")
            if state in done:
                return obj
            if state in failed:
                fail(f"{obj.get('name', path)} is {state}: {obj.get('reason') or 'see its history'}")
            if time.monotonic() - started > timeout:
                fail(f"{obj.get('name', path)} is still {state} after {timeout:.0f} s: check it later with `show`")
            time.sleep(interval)
