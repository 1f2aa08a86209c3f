"""The shared contract of rigbase's three programs (provisioner, minion, image_builder).

Everything two programs must agree on lives here — identities, wire messages with their protocol version,
the enrollment bundle, the image manifest, regional shapes, the error base — and this package imports only
the standard library, pydantic and cryptography, never one of the programs (import-linter checks it)."""
