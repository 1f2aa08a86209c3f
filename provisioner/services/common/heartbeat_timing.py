"""How often a joined node reports and how often it must prove itself: the two knobs the join answer
and every heartbeat answer carry. One frozen value, built once by whoever runs the API (from the
settings, docs/control-plane.md) and passed down, so no service reads the environment per request."""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.attestation.continuous import DEFAULT_EVERY_HEARTBEATS, DEFAULT_QUOTE_GRACE_BEATS

DEFAULT_HEARTBEAT_S = 30.0  # three missed beats (90 s, the online window) before a node shows offline


@dataclass(frozen=True)
class HeartbeatTiming:
    interval_s: float = DEFAULT_HEARTBEAT_S  # sent to the node as `heartbeat_interval_s`
    quote_every: int = DEFAULT_EVERY_HEARTBEATS  # a fresh TPM quote every K-th heartbeat
    # beats a node may let pass after a quote was asked for before it goes errored
    quote_grace_beats: int = DEFAULT_QUOTE_GRACE_BEATS

    @property
    def quote_max_age_s(self) -> float:
        """How old the last verified quote may get before one is asked for whatever the beat count
        (twice the normal spacing): a node whose beats never carry a quote is caught by time too."""
        return 2 * self.quote_every * self.interval_s
