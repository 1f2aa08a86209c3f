"""TPM attestation, control-plane side (pure Python + `cryptography`; no TPM library needed here).

Entry points: `verifier.JoinVerifier` (the two join steps), `continuous.verify_fresh_quote` (every K
heartbeats), `wire` (the JSON messages), `refusals.RefusalCode` (every reason a node is refused).
"""
