"""Which TPM to talk to. A TCTI string in tpm2-tss syntax (`device:/dev/tpmrm0`, `swtpm:path=…`,
`swtpm:host=127.0.0.1,port=2321`, `mssim:…`): the `--tcti` option wins, then $RIGBASE_TCTI, then the
kernel resource manager. The resource manager is the default because it lets the minion share the
TPM with other tools and cleans up transient objects a crashed process leaves behind."""

from __future__ import annotations

import os

DEFAULT_TCTI = "device:/dev/tpmrm0"
TCTI_ENV = "RIGBASE_TCTI"


def resolve_tcti(explicit: str | None = None) -> str:
    """The TCTI string to use: explicit argument, else $RIGBASE_TCTI, else /dev/tpmrm0."""
    for candidate in (explicit, os.environ.get(TCTI_ENV)):
        if candidate and candidate.strip():
            return candidate.strip()
    return DEFAULT_TCTI
