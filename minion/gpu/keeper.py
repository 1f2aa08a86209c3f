"""Keeps the node's CDI spec in step with its driver: written at start, written again when the driver's
version or its GPUs change, removed when the driver is gone; a spec of the same kind written by the
operator's own NVIDIA Container Toolkit is left to do the job (minion/gpu/cdi.py)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from minion.gpu import cdi
from minion.gpu.csv_mode import csv_files
from minion.gpu.driver import VERSION_FILES, NoDriver

log = logging.getLogger(__name__)

CHECK_EVERY_S: Final = 30.0  # how often a beat looks at the driver (two small reads when nothing changed)


@dataclass
class CdiKeeper:
    directory: Path  # where the minion writes its spec (/var/run/cdi: a tmpfs podman reads)
    spec_dirs: tuple[Path, ...]  # every directory podman reads specs from
    root: Path = Path("/")
    note: str | None = None  # why the node has no spec of ours (no driver, a directory it cannot write)
    _seen: tuple[str, ...] | None = None
    _checked: float = -CHECK_EVERY_S
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _fingerprint(self) -> tuple[str, ...]:
        version = ""
        for name in VERSION_FILES:
            try:
                version = (self.root / name).read_text().strip()
                break
            except OSError:
                continue
        nodes = sorted(p.name for p in (self.root / "dev").glob("nvidia[0-9]*"))
        csvs = [f"{f.name}:{f.stat().st_mtime_ns}" for f in csv_files(self.root)]  # a Jetson's L4T update
        return (version, *nodes, *csvs)

    def refresh(self, *, now: float | None = None) -> str | None:
        """The spec brought up to date (at most every CHECK_EVERY_S); returns `note`."""
        with self._lock:
            clock = time.monotonic() if now is None else now
            if clock - self._checked < CHECK_EVERY_S:
                return self.note
            self._checked = clock
            seen = self._fingerprint()
            if seen == self._seen:
                return self.note
            self._seen = seen
            self.note = self._write()
            return self.note

    def _write(self) -> str | None:
        ours = self.directory / cdi.SPEC_NAME
        if (theirs := cdi.foreign_spec(list(self.spec_dirs))) is not None:
            ours.unlink(missing_ok=True)
            log.info("GPUs: the CDI spec %s is the operator's; none of ours is written", theirs)
            return None
        from minion.gpu.nvml import driver_view

        try:
            document, what = cdi.node_spec(self.root, driver_view() if self.root == Path("/") else None)
        except NoDriver as exc:
            ours.unlink(missing_ok=True)
            return str(exc)
        try:
            path = cdi.write(document, self.directory)
        except OSError as exc:
            return (
                f"cannot write the CDI spec in {self.directory} ({exc.strerror}): its GPUs cannot be given "
                "to jobs; make it a writable directory (a tmpfs) or set RIGBASE_JOBS_CDI_SPEC_DIRS"
            )
        log.info("GPUs: wrote %s for %s", path, what)
        return None
