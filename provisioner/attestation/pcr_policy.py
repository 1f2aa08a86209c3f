"""What PCR values a region accepts. Two modes, chosen per region:

- `manifest`: the image builder's signed manifest says which values a node booted from the region's
  media must show (PCR 11, 4, …); only the PCRs the manifest names are compared.
- `record`: no manifest yet. The first attested values are recorded as the node's baseline (trust on
  first use, visible to the operator); every later quote must show the same values, a change is flagged.

Policies return a verdict instead of raising, so the verifier can put the refusal in the audit log.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from provisioner.attestation.refusals import Refusal, RefusalCode, refuse


class PcrPolicyMode(StrEnum):
    manifest = "manifest"
    record = "record"


@dataclass(frozen=True)
class PcrVerdict:
    refusal: Refusal | None = None
    # Values the caller must store as the node's baseline (record mode, first attestation only).
    record: dict[int, bytes] | None = None
    differing: tuple[int, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return self.refusal is None


class PcrPolicy(Protocol):
    @property
    def mode(self) -> PcrPolicyMode: ...  # read-only, so the frozen dataclasses below satisfy it

    def check(self, pcrs: Mapping[int, bytes]) -> PcrVerdict: ...


def _differing(expected: Mapping[int, bytes], actual: Mapping[int, bytes]) -> tuple[int, ...]:
    return tuple(sorted(i for i, value in expected.items() if actual.get(i) != value))


def _summary(indices: tuple[int, ...]) -> str:
    return "PCR " + ", ".join(map(str, indices))


@dataclass(frozen=True)
class ManifestPolicy:
    expected: Mapping[int, bytes]
    mode: PcrPolicyMode = PcrPolicyMode.manifest

    def check(self, pcrs: Mapping[int, bytes]) -> PcrVerdict:
        bad = _differing(self.expected, pcrs)
        if bad:
            return PcrVerdict(
                refuse(RefusalCode.pcr_manifest_mismatch, _summary(bad), pcrs=list(bad)), differing=bad
            )
        return PcrVerdict()


@dataclass(frozen=True)
class RecordPolicy:
    recorded: Mapping[int, bytes] | None = None  # None: nothing recorded yet, this is the first attestation
    mode: PcrPolicyMode = PcrPolicyMode.record

    def check(self, pcrs: Mapping[int, bytes]) -> PcrVerdict:
        if self.recorded is None:
            return PcrVerdict(record=dict(pcrs))
        bad = _differing(self.recorded, pcrs)
        if bad:
            return PcrVerdict(refuse(RefusalCode.pcr_changed, _summary(bad), pcrs=list(bad)), differing=bad)
        return PcrVerdict()
