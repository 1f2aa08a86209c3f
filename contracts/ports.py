"""The port a control plane listens on unless told otherwise: `provision serve`, the lab's LAN address and
the QEMU guests' forwarded control plane all use it, so a bundle's URL names it. Apart from the bundle's
models, so a `provision` command can name it without building them."""

from __future__ import annotations

from typing import Final

CONTROL_PLANE_PORT: Final = 8470
