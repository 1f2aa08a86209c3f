"""The boot path behind PCR 4 (docs/join-protocol.md, "Boot path (PCR 4)"): PCR 4 alone depends on every
boot option the firmware tried, so instead of comparing it with one predicted value the verifier replays
the firmware's TCG event log the node sends with its quote. The log must replay to the quoted PCR 4 (else
it is not this boot's log), and in a region with registered image manifests every EFI application the
firmware ran must be one of the manifests' `pe_hashes` (systemd-boot, the UKI, the kernel)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from contracts.eventlog import BOOT_PCR, EventLogError, boot_applications, parse_event_log, replay
from provisioner.attestation.refusals import Refusal, RefusalCode, refuse


@dataclass(frozen=True)
class BootPathPolicy:
    """What a region expects of the boot path. `pe_hashes`: the Authenticode digests (lowercase hex) its
    registered manifests name, any of which may run; None where no manifest is registered — a log is then
    optional, but one that is sent must still replay to the quoted PCR 4."""

    pe_hashes: frozenset[str] | None = None


def check_boot_path(
    event_log: bytes | None, pcrs: Mapping[int, bytes], policy: BootPathPolicy
) -> Refusal | None:
    """None when the boot path passes; otherwise the refusal, in the order no log → log does not replay
    to the quote → an application the manifests do not name. `pcrs`: values the quote verified."""
    if event_log is None:
        return refuse(RefusalCode.no_event_log) if policy.pe_hashes is not None else None
    quoted = pcrs.get(BOOT_PCR)
    try:
        events = parse_event_log(event_log)
    except EventLogError as exc:
        return refuse(RefusalCode.event_log_mismatch, f"the log is unreadable: {exc}")
    replayed = replay(events, BOOT_PCR)
    if quoted is None or replayed != quoted.hex():
        shown = quoted.hex()[:16] + "…" if quoted is not None else "nothing"
        return refuse(
            RefusalCode.event_log_mismatch,
            f"the log replays to {replayed[:16]}…, the quote shows {shown}",
            replayed=replayed,
        )
    if policy.pe_hashes is None:
        return None
    loaded = boot_applications(events)
    unknown = [d for d in loaded if d not in policy.pe_hashes]
    if unknown:
        return refuse(RefusalCode.unknown_boot_application, f"sha256 {unknown[0]}", digests=unknown)
    if not loaded:
        return refuse(RefusalCode.unknown_boot_application, "the log names no EFI application at all")
    return None
