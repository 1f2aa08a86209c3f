"""Apply one finalize work with its bundle's bytes: check the digest, unpack, run, and save it as the
node's applied configuration when it succeeded. Shared by the agent (bytes just downloaded) and
`minion finalize apply-saved` (bytes from the state partition)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from contracts.finalize import FinalizeEvent, FinalizeOutcome, FinalizeWork
from minion.finalize import saved
from minion.finalize.bundle import BundleProblem, check_digest, unpack
from minion.finalize.paths import FinalizePaths
from minion.finalize.runner import RunResult, run_work


def apply_work(
    work: FinalizeWork,
    bundle: bytes,
    paths: FinalizePaths,
    *,
    host_root: Path | None = None,
    collections: Path | None = None,
    on_event: Callable[[FinalizeEvent], None] | None = None,
    timeout: int | None = None,
) -> RunResult:
    """A bundle whose SHA-256 is not the work's digest fails before anything is unpacked or run."""
    try:
        check_digest(bundle, work.bundle_digest)
        project = unpack(bundle, paths.bundle_dir(work.bundle_digest))
    except BundleProblem as exc:
        return RunResult(FinalizeOutcome(ok=False, message=str(exc)))
    result = run_work(
        work, project, paths, host_root=host_root, collections=collections, on_event=on_event, timeout=timeout
    )
    if result.outcome.ok:
        saved.save(paths, work, bundle)
    return result
