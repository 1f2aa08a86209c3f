"""Waiting on Compute operations, explicitly and politely.

ExtendedOperation.result() polls through an internal client built WITHOUT our client_options (it would
go to the real endpoint, and it polls as fast as it likes). We call ZoneOperationsClient.wait /
GlobalOperationsClient.wait ourselves: Compute long-polls server-side (up to ~2 minutes per call), and a
floor of MIN_INTERVAL_S (0.55 s) between calls keeps us under 2 calls per second even when a server
returns at once."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from contracts.errors import Unavailable

if TYPE_CHECKING:  # pragma: no cover
    from provisioner.providers.gcp.clients import GcpContext

MIN_INTERVAL_S = 0.55  # ≤ 2 calls/s with room for timer jitter (0.5 would sit exactly on the limit)


def wait(
    ctx: GcpContext,
    operation: str,
    *,
    zone: str | None = None,
    timeout_s: float = 900.0,
    min_interval_s: float = MIN_INTERVAL_S,
    on_progress: Callable[[Any], None] | None = None,
) -> Any:
    """Wait for a zonal (zone=…) or global operation until DONE; returns the DONE operation."""
    from google.cloud import compute_v1

    done = compute_v1.Operation.Status.DONE
    deadline = time.monotonic() + timeout_s
    while True:
        started = time.monotonic()
        if zone:
            op = ctx.zone_operations.wait(project=ctx.project, zone=zone, operation=operation)
        else:
            op = ctx.global_operations.wait(project=ctx.project, operation=operation)
        if op.status == done:
            return op
        if on_progress:
            on_progress(op)
        if time.monotonic() >= deadline:
            raise Unavailable(
                f"operation {operation} is still {op.status.name} after {timeout_s:.0f} s: "
                "run the command again to keep waiting"
            )
        time.sleep(max(0.0, min_interval_s - (time.monotonic() - started)))


def error_of(op: Any) -> tuple[str, str] | None:
    """(code, message) of a finished operation's first error, or None when it succeeded."""
    if op.error and op.error.errors:
        e = op.error.errors[0]
        return e.code, e.message or op.http_error_message
    if op.http_error_status_code and op.http_error_status_code >= 400:
        return str(op.http_error_status_code), op.http_error_message
    return None
