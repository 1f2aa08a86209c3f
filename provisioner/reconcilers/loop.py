"""The reconciler loop: desired state recorded in the store is driven to actual state here.

Each reconciler is a function `(sessions) -> None` that looks at the store, does one bounded step of
slow work for whatever is behind (finalize a node, create a GCP storage node, refresh a region's
health) and records the result. Reconcilers are idempotent and keep no memory between passes, so a
control plane killed at any point simply picks up where the store says it was on the next pass
(Talos/Omni controllers work the same way).

The loop runs in the `provision serve` process, one daemon thread per reconciler so a slow playbook
never delays a region's health; `kick(name)` wakes one at once (e.g. right after a node enters
provisioning) instead of waiting for its period."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger("rigbase.reconcilers")

Reconcile = Callable[[sessionmaker[Session]], None]


@dataclass
class Reconciler:
    name: str
    fn: Reconcile
    period_s: float
    wake: threading.Event = field(default_factory=threading.Event)


# name → Reconciler; filled by `register` at import of the modules listed in RECONCILER_MODULES
REGISTRY: dict[str, Reconciler] = {}

# modules whose import registers reconcilers; one line each
RECONCILER_MODULES: list[str] = [
    "provisioner.reconcilers.gcp",
    "provisioner.reconcilers.node_finalize",  # provisioning → finalize playbook → maintenance | errored
    "provisioner.reconcilers.region_health",  # regions new/healthy/offline from heartbeats
]


def register(name: str, period_s: float) -> Callable[[Reconcile], Reconcile]:
    """Decorator: run `fn` every `period_s` seconds (and whenever `kick(name)` is called)."""

    def deco(fn: Reconcile) -> Reconcile:
        REGISTRY[name] = Reconciler(name, fn, period_s)
        return fn

    return deco


def kick(name: str) -> None:
    """Wake a reconciler now; harmless when the loop is not running (tests, the CLI)."""
    rec = REGISTRY.get(name)
    if rec is not None:
        rec.wake.set()


def kick_after_commit(session: Session, name: str) -> None:
    """Wake a reconciler once `session` commits: woken earlier, it would look at the store before the
    change that concerns it is visible and go back to sleep for a whole period."""
    from sqlalchemy import event

    event.listen(session, "after_commit", lambda _s: kick(name), once=True)


class ReconcilerLoop:
    """Owns the reconciler threads of one control-plane process."""

    def __init__(self, sessions: sessionmaker[Session], only: list[str] | None = None) -> None:
        import importlib

        for module in RECONCILER_MODULES:
            importlib.import_module(module)
        self.sessions = sessions
        self.reconcilers = [r for r in REGISTRY.values() if only is None or r.name in only]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for rec in self.reconcilers:
            t = threading.Thread(target=self._run, args=(rec,), name=f"reconcile-{rec.name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for rec in self.reconcilers:
            rec.wake.set()
        for t in self._threads:
            t.join(timeout)

    def run_once(self) -> None:
        """One pass of every reconciler in this thread: what tests call to step the world."""
        for rec in self.reconcilers:
            rec.fn(self.sessions)

    def _run(self, rec: Reconciler) -> None:
        while not self._stop.is_set():
            try:
                rec.fn(self.sessions)
            except Exception:  # noqa: BLE001 - one failing pass must not kill the loop; the next retries
                log.exception("reconciler %s failed; retrying in %.0f s", rec.name, rec.period_s)
            rec.wake.wait(rec.period_s)
            rec.wake.clear()
