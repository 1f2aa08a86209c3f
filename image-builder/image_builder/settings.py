"""The image builder's settings: the environment it reads, read once per `image-builder` command.

image_builder/cli.py's callback loads `BuilderSettings.from_env()` and the commands pass paths and the
epoch down; no other module reads the environment. `RIGBASE_HOME` is the state directory `provision`
uses too (docs/control-plane.md); `SOURCE_DATE_EPOCH` is the reproducible-builds convention
(https://reproducible-builds.org/specs/source-date-epoch/). Table: docs/image-builder.md."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

HOME_ENV = "RIGBASE_HOME"
EPOCH_ENV = "SOURCE_DATE_EPOCH"


def default_home() -> Path:
    return Path.home() / ".local" / "share" / "rigbase"


@dataclass(frozen=True)
class BuilderSettings:
    home: Path
    # the build's timestamps; None: the checkout's last commit time (build.default_epoch)
    source_date_epoch: int | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> BuilderSettings:
        """Unset or empty RIGBASE_HOME means ~/.local/share/rigbase; a SOURCE_DATE_EPOCH that is not a
        whole number of seconds is ignored, as the specification asks."""
        home = environ.get(HOME_ENV)
        epoch = environ.get(EPOCH_ENV, "")
        return cls(
            home=Path(home) if home else default_home(),
            source_date_epoch=int(epoch) if epoch.isdigit() else None,
        )

    def state_dir(self) -> Path:
        """The home, created 0700 on first use (it holds the signing key)."""
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        return self.home

    def signing_key(self) -> Path:
        """Where `image-builder keygen` writes the key and `build` reads it unless --key says otherwise."""
        return self.state_dir() / "image-builder" / "signing-key.pem"

    def cache_dir(self) -> Path:
        """Shared by the CLI, the image tests and the benchmark: the debootstrap stage is keyed by inputs."""
        return self.state_dir() / "cache" / "image-builder"
