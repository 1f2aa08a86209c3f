"""Secrets at rest (GCP service-account keys, SMB passwords, node credentials' private parts).

A Fernet key in $RIGBASE_HOME/secret.key (mode 0600) seals values before they reach the store, so
a copied database alone reveals nothing. The API never returns sealed values."""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from provisioner.config import rigbase_home
from provisioner.errors import Unavailable


def _key_path() -> Path:
    return rigbase_home() / "secret.key"


def _fernet() -> Fernet:
    path = _key_path()
    if not path.exists():
        key = Fernet.generate_key()
        # O_EXCL: two workers starting at once must not write two different keys
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(key)
    return Fernet(path.read_bytes().strip())


def seal(plaintext: bytes) -> str:
    """Encrypt for storage; the result is ASCII and safe for a text column."""
    return _fernet().encrypt(plaintext).decode("ascii")


def unseal(token: str) -> bytes:
    try:
        return _fernet().decrypt(token.encode("ascii"))
    except InvalidToken as exc:
        raise Unavailable(
            f"a stored secret cannot be decrypted with {_key_path()}: restore that key file from backup"
        ) from exc
