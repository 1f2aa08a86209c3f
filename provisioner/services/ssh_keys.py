"""The control plane's SSH identity: the Ed25519 key pair the finalize playbook uses to reach real
nodes (docs/finalize.md "Real nodes over SSH").

Created on first use at the settings' `ssh_key_path` (<home>/ssh/id_ed25519, or RIGBASE_SSH_KEY when the
operator brings one; docs/control-plane.md);
its public half travels to each node in the successful join response (`ssh_authorized_key`), and the
minion installs it when started with `--authorized-keys`. Rotation: delete the private key; the next
join creates a new pair and every node that joins again gets the new public key."""

from __future__ import annotations

import os
from pathlib import Path

KEY_COMMENT = "rigbase-control-plane"


def _create(path: Path) -> None:
    """Write a fresh key to `path` unless one is there. The key goes to a private temp file first and is
    then hard-linked into place, which fails if the name exists: two workers racing on first use both
    end up reading the same, complete key (an O_EXCL create of `path` itself could be read half-written)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(pem)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another worker won the race: use its key
    finally:
        tmp.unlink(missing_ok=True)


def authorized_key_line(path: Path) -> str:
    """`ssh-ed25519 AAAA… rigbase-control-plane` for the private key at `path` (the runtime's `ssh_key`,
    which the finalize reconciler uses too), creating the key pair on first use."""
    from cryptography.hazmat.primitives import serialization

    if not path.exists():
        _create(path)
    key = serialization.load_ssh_private_key(path.read_bytes(), password=None)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return f"{public.decode()} {KEY_COMMENT}"
