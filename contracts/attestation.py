"""What a quote covers, as both ends of the join agree on it (docs/join-protocol.md): the PCR bank, and
the PCRs every quote covers — firmware and boot chain (0-7), the UKI (11), the kernel command line and
credentials (12), shim/MOK state (14)."""

from __future__ import annotations

from typing import Final, Literal

PcrBank = Literal["sha256"]
PCR_BANK: Final[PcrBank] = "sha256"
ATTESTED_PCRS: Final[tuple[int, ...]] = (0, 1, 2, 3, 4, 5, 6, 7, 11, 12, 14)
