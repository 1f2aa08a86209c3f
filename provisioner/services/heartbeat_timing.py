"""How often a joined node reports and how often it must prove itself: the two knobs the join answer
and every heartbeat answer carry. One frozen value, built once by whoever runs the API (from the
settings, docs/control-plane.md) and passed down, so no service reads the environment per request."""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.attestation.continuous import DEFAULT_EVERY_HEARTBEATS

DEFAULT_HEARTBEAT_S = 30.0  # three missed beats (90 s, the online window) before a node shows offline


@dataclass(frozen=True)
class HeartbeatTiming:
    interval_s: float = DEFAULT_HEARTBEAT_S  # sent to the node as `heartbeat_interval_s`
    quote_every: int = DEFAULT_EVERY_HEARTBEATS  # a fresh TPM quote every K-th heartbeat
