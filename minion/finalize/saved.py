"""The last finalize work applied successfully, with its bundle, on the state partition: what
`minion finalize apply-saved` applies again at boot (the root is read-only; what finalize wrote under
/etc is gone after a reboot), and which generation the minion reports as applied."""

from __future__ import annotations

from pydantic import ValidationError

from contracts.finalize import FinalizeWork
from minion.durable import write_atomic
from minion.finalize.paths import FinalizePaths


def save(paths: FinalizePaths, work: FinalizeWork, bundle: bytes) -> None:
    """Bundle first, then the work that names it: a crash in between leaves the previous work, whose
    digest no longer matches the bundle, which load() then refuses rather than apply a mix."""
    write_atomic(paths.saved_bundle, bundle)
    write_atomic(paths.saved_work, work.model_dump_json().encode())


def load(paths: FinalizePaths) -> tuple[FinalizeWork, bytes] | None:
    """The saved work and bundle; None when nothing was ever applied (or the files are unreadable)."""
    try:
        work = FinalizeWork.model_validate_json(paths.saved_work.read_bytes())
        bundle = paths.saved_bundle.read_bytes()
    except (OSError, ValidationError):
        return None
    return work, bundle


def applied_generation(paths: FinalizePaths) -> str | None:
    saved = load(paths)
    return saved[0].generation if saved else None
