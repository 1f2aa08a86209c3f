"""The reconciler loop: desired state recorded in the store is driven to actual state here.

Each reconciler is a function `(sessions) -> None` that looks at the store, does one bounded step of
slow work for whatever is behind (finalize a node, create a GCP storage node, refresh a region's
health) and records the result. Reconcilers are idempotent and keep no memory between passes, so a
control plane killed at any point simply picks up where the store says it was on the next pass
(Talos/Omni controllers work the same way).

The loop runs in the `provision serve` process, one daemon thread per reconciler so a slow playbook
never delays a region's health; a wake-up runs one at once (e.g. right after a node enters
provisioning) instead of waiting for its period. Services ask for that with
`services.wakeups.wake_after_commit(session, Wake.X)`; a running loop subscribes to those wake-ups."""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session, sessionmaker

from provisioner.reconcilers.leader import Leadership
from provisioner.services.common import wakeups
from provisioner.services.common.wakeups import Wake

log = logging.getLogger("rigbase.reconcilers")

Reconcile = Callable[[sessionmaker[Session]], None]


@dataclass
class Reconciler:
    name: Wake
    fn: Reconcile
    period_s: float
    wake: threading.Event = field(default_factory=threading.Event)


# name → Reconciler; filled by `register` at import of the modules listed in RECONCILER_MODULES
REGISTRY: dict[Wake, Reconciler] = {}

# modules whose import registers reconcilers; one line each
RECONCILER_MODULES: list[str] = [
    "provisioner.reconcilers.gcp",
    "provisioner.reconcilers.gcp_burst",  # jobs' burst VMs: create, delete when done, reap; quota cache
    "provisioner.reconcilers.finalize",  # provisioning without a finalize report for too long → errored
    "provisioner.reconcilers.region_health",  # regions new/healthy/offline from heartbeats
    "provisioner.reconcilers.jobs",  # place waiting jobs; workers of lost nodes fail or re-queue
    "provisioner.reconcilers.metering",  # job hours to the ledger, earned credits to balances
    "provisioner.reconcilers.objects",  # remote sources of datasets, models and checkpoints → the store
]


def register(name: Wake, period_s: float) -> Callable[[Reconcile], Reconcile]:
    """Decorator: run `fn` every `period_s` seconds (and whenever `name` is woken)."""

    def deco(fn: Reconcile) -> Reconcile:
        REGISTRY[name] = Reconciler(name, fn, period_s)
        return fn

    return deco


class ReconcilerLoop:
    """Owns the reconciler threads of one control-plane process."""

    def __init__(
        self, sessions: sessionmaker[Session], only: list[Wake] | None = None, *, elect: bool = True
    ) -> None:
        """`elect`: run passes only while this process leads (reconcilers/leader.py); tests stepping
        the world with run_once() need no election."""
        for module in RECONCILER_MODULES:
            importlib.import_module(module)
        self.sessions = sessions
        bind = sessions.kw.get("bind")
        self.leadership = Leadership(bind) if elect and bind is not None else None
        self.reconcilers = [r for r in REGISTRY.values() if only is None or r.name in only]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # reconciler → (wall time its last pass ended, how long it took): the fleet metrics' lag
        self.passes: dict[Wake, tuple[float, float]] = {}

    def start(self) -> None:
        if self.leadership is not None:
            self.leadership.start()
        wakeups.subscribe(self.wake)
        for rec in self.reconcilers:
            t = threading.Thread(target=self._run, args=(rec,), name=f"reconcile-{rec.name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 5.0) -> None:
        wakeups.unsubscribe(self.wake)
        self._stop.set()
        for rec in self.reconcilers:
            rec.wake.set()
        for t in self._threads:
            t.join(timeout)
        if self.leadership is not None:
            self.leadership.stop()

    def wake(self, which: Wake) -> None:
        """Wake one of this loop's reconcilers now (the wake-up subscriber)."""
        for rec in self.reconcilers:
            if rec.name == which:
                rec.wake.set()

    def run_once(self) -> None:
        """One pass of every reconciler in this thread: what tests call to step the world."""
        for rec in self.reconcilers:
            rec.fn(self.sessions)

    def _run(self, rec: Reconciler) -> None:
        while not self._stop.is_set():
            if self.leadership is not None and not self.leadership.wait(1.0):
                continue  # another process leads; check again (and stop promptly when asked)
            began = time.monotonic()
            try:
                rec.fn(self.sessions)
            except Exception:
                log.exception("reconciler %s failed; retrying in %.0f s", rec.name, rec.period_s)
            else:
                self.passes[rec.name] = (time.time(), time.monotonic() - began)
            rec.wake.wait(rec.period_s)
            rec.wake.clear()
