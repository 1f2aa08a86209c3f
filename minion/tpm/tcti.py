"""Which TPM to talk to. A TCTI string in tpm2-tss syntax (`device:/dev/tpmrm0`, `swtpm:path=…`,
`swtpm:host=127.0.0.1,port=2321`, `mssim:…`): the `--tcti` option (its default $RIGBASE_TCTI, read by
the CLI, minion/settings.py), else the kernel resource manager. The resource manager is the default
because it lets the minion share the TPM with other tools and cleans up transient objects a crashed
process leaves behind."""

from __future__ import annotations

DEFAULT_TCTI = "device:/dev/tpmrm0"


def resolve_tcti(explicit: str | None = None) -> str:
    """The TCTI string to use: the one given (`--tcti` / $RIGBASE_TCTI), else /dev/tpmrm0."""
    if explicit and explicit.strip():
        return explicit.strip()
    return DEFAULT_TCTI
