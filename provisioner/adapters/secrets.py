"""Secrets at rest (GCP service-account keys, SMB passwords, join tokens kept for VMs).

A Fernet key in the control plane's home (`Settings.secret_key`, mode 0600) seals values before they
reach the store, so a copied database alone reveals nothing. The API never returns sealed values. The
key file's path is given once, when the control plane builds its runtime (services/common/runtime.py)."""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from contracts.errors import Unavailable


@dataclass(frozen=True)
class Sealer:
    """Seals and unseals with the key at `key_path`, created on first use."""

    key_path: Path

    def ensure_key(self) -> Path:
        """The key file, made race-free if it is not there yet (a deployment copies it to every host)."""
        path = self.key_path
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
        return path

    def _fernet(self) -> Fernet:
        return Fernet(self.ensure_key().read_bytes().strip())

    def derive(self, label: bytes) -> bytes:
        """A key for one purpose (`label`), derived from this one (created on first use): the same on
        every host that holds the same key file."""
        return hmac.new(self.ensure_key().read_bytes().strip(), label, hashlib.sha256).digest()

    def seal(self, plaintext: bytes) -> str:
        """Encrypt for storage; the result is ASCII and safe for a text column."""
        return self._fernet().encrypt(plaintext).decode("ascii")

    def unseal(self, token: str) -> bytes:
        try:
            return self._fernet().decrypt(token.encode("ascii"))
        except InvalidToken as exc:
            raise Unavailable(
                f"a stored secret cannot be decrypted with {self.key_path}: restore that key file from backup"
            ) from exc
