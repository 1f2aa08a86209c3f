"""Nodes and how they come to be: join and attestation, trust roots (TPM CAs, image keys), finalize,
heartbeats, pending minions and the fleet status."""
