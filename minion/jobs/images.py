"""What this node's images are, for the control plane's dry run (contracts.jobs.NodeImages): the
`localhost/` images podman holds, listed at most once a minute, and how the last pull from each registry
went, learnt from the workers' own starts (every registry image is pulled at each start,
container.pull_policy)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Final

from contracts.images import registry_of
from contracts.jobs import MAX_LOCAL_IMAGES, MAX_REGISTRIES, MESSAGE_MAX, NodeImages, RegistryPull
from minion.jobs.podman import Podman, PodmanError

LOCAL_EVERY_S: Final = 60.0  # `podman images` costs a process; images change rarely
# Words of podman's error when the image could not be fetched (not when the container failed to start)
PULL_FAILED: Final = ("docker://", "pull", "registry", "manifest unknown", "unauthorized")


def pull_failed(message: str) -> bool:
    lowered = message.lower()
    return any(word in lowered for word in PULL_FAILED)


class ImageBook:
    """Thread-safe: the workers record their starts, the heartbeat reads the report."""

    def __init__(self, podman: Podman) -> None:
        self.podman = podman
        self._pulls: dict[str, RegistryPull] = {}
        self._local: list[str] = []
        self._listed_at: float | None = None
        self._lock = threading.Lock()

    def started(self, image: str, error: str | None) -> None:
        """A worker's `podman run` of `image` returned; `error`: podman's, when it failed."""
        if image.startswith("localhost/"):
            if error is None:
                self._listed_at = None  # list again: it is here
            return
        if error is not None and not pull_failed(error):
            return  # it was fetched; the container itself failed
        pull = RegistryPull(
            ok=error is None, at=datetime.now(UTC), message=error[:MESSAGE_MAX] if error else None
        )
        with self._lock:
            self._pulls.pop(registry_of(image), None)
            self._pulls[registry_of(image)] = pull
            while len(self._pulls) > MAX_REGISTRIES:  # the oldest first
                self._pulls.pop(next(iter(self._pulls)))

    def report(self) -> NodeImages:
        now = time.monotonic()
        if self._listed_at is None or now - self._listed_at >= LOCAL_EVERY_S:
            self._listed_at = now
            try:
                out = self.podman.call(
                    ["images", "--filter", "reference=localhost/*", "--format", "{{.Repository}}:{{.Tag}}"]
                )
            except PodmanError:
                out = None
            if out is not None:
                names = sorted({line.strip() for line in out.splitlines() if line.startswith("localhost/")})
                self._local = [n for n in names if not n.endswith(":<none>")][:MAX_LOCAL_IMAGES]
        with self._lock:
            return NodeImages(local=list(self._local), pulls=dict(self._pulls))
