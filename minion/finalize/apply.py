"""Apply one finalize work with its bundle's bytes: check the digest, unpack, run, and save it as the
node's applied configuration when it succeeded. Shared by the agent (bytes just downloaded) and
`minion finalize apply-saved` (bytes from the state partition)."""

from __future__ import annotations

from typing import Unpack

from contracts.finalize import FinalizeOutcome, FinalizeWork
from minion.finalize import saved
from minion.finalize.bundle import BundleProblem, check_digest, unpack
from minion.finalize.paths import FinalizePaths
from minion.finalize.runner import RunOptions, RunResult, run_work


def apply_work(
    work: FinalizeWork, bundle: bytes, paths: FinalizePaths, **options: Unpack[RunOptions]
) -> RunResult:
    """A bundle whose SHA-256 is not the work's digest fails before anything is unpacked or run. `options`
    go to run_work as they are (its keyword arguments)."""
    try:
        check_digest(bundle, work.bundle_digest)
        project = unpack(bundle, paths.bundle_dir(work.bundle_digest))
    except BundleProblem as exc:
        return RunResult(FinalizeOutcome(ok=False, message=str(exc)))
    result = run_work(work, project, paths, **options)
    if result.outcome.ok:
        saved.save(paths, work, bundle)
    return result
