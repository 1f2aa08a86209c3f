"""Backups of a control plane: a consistent snapshot of the SQLite store plus the key material under the
home (the sealed-secrets key, the TLS CA and server certificate, the client config), in one file encrypted
with a passphrase. `restore` writes them into an empty home; the restored control plane accepts the same
nodes' heartbeats with no re-enrolment (node credentials are stored hashed in the store, secrets sealed
with the restored key).

The file: the line `rigbase-backup 1`, a 16-byte scrypt salt, a 12-byte nonce, then AES-256-GCM over a
gzip'd tar (the header line is authenticated too). scrypt (n=2^15, r=8, p=1) makes each passphrase guess
cost about 32 MiB and tens of milliseconds. On PostgreSQL the store is backed up with `pg_dump`
(docs/control-plane.md, "Backups"); the file then holds the key material only."""

from __future__ import annotations

import io
import os
import secrets
import sqlite3
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt
from sqlalchemy.engine import make_url

from contracts.errors import Conflict, InvalidInput
from provisioner.settings import Settings

MAGIC = b"rigbase-backup 1\n"
STORE_MEMBER = "rigbase.db"
MIN_PASSPHRASE = 12
# What a home holds besides the store that a restored control plane needs: files, and whole directories.
KEY_FILES = ("secret.key", "client.json")
KEY_DIRS = ("tls",)


@dataclass(frozen=True)
class BackupSummary:
    path: Path
    members: list[str]
    store: str  # "sqlite" (included) or "postgresql" (not included: pg_dump it)
    size: int


def _key(passphrase: str, salt: bytes) -> bytes:
    if len(passphrase) < MIN_PASSPHRASE:
        raise InvalidInput(f"the backup passphrase must have at least {MIN_PASSPHRASE} characters")
    return Scrypt(salt=salt, length=32, n=2**15, r=8, p=1).derive(passphrase.encode())


def _sqlite_path(settings: Settings) -> Path | None:
    url = make_url(settings.database)
    if url.get_backend_name() != "sqlite":
        return None
    if not url.database or url.database == ":memory:":
        raise InvalidInput("an in-memory store has nothing to back up")
    return Path(url.database)


def _snapshot(db: Path, into: Path) -> None:
    """SQLite's online backup: a consistent copy even while `provision serve` writes to the store."""
    if not db.exists():
        raise InvalidInput(f"no store at {db}: is RIGBASE_HOME the control plane's home?")
    source = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    target = sqlite3.connect(into)
    try:
        source.backup(target)
    finally:
        target.close()
        source.close()


def _private_write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def backup(settings: Settings, output: Path, passphrase: str) -> BackupSummary:
    """Write the encrypted backup of the control plane at `settings.home` to `output` (mode 0600)."""
    salt, nonce = secrets.token_bytes(16), secrets.token_bytes(12)
    key = _key(passphrase, salt)
    home = settings.home
    db = _sqlite_path(settings)
    members: list[str] = []
    buffer = io.BytesIO()
    with (
        tempfile.TemporaryDirectory(prefix="rigbase-backup-") as tmp,
        tarfile.open(fileobj=buffer, mode="w:gz") as tar,
    ):
        if db is not None:
            snapshot = Path(tmp) / STORE_MEMBER
            _snapshot(db, snapshot)
            tar.add(snapshot, arcname=STORE_MEMBER)
            members.append(STORE_MEMBER)
        for name in KEY_FILES:
            if (home / name).is_file():
                tar.add(home / name, arcname=name)
                members.append(name)
        for name in KEY_DIRS:
            if (home / name).is_dir():
                tar.add(home / name, arcname=name)
                members.append(name + "/")
    if not members:  # (secret.key exists once something was sealed; a store or a client config always)
        raise InvalidInput(f"{home} holds no control plane: is RIGBASE_HOME the control plane's home?")
    sealed = MAGIC + salt + nonce + AESGCM(key).encrypt(nonce, buffer.getvalue(), MAGIC)
    _private_write(output, sealed)
    return BackupSummary(output, members, "sqlite" if db is not None else "postgresql", len(sealed))


def _safe_members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    allowed = {STORE_MEMBER, *KEY_FILES}
    out = []
    for member in tar.getmembers():
        top = member.name.split("/", 1)[0]
        if (
            member.name.startswith("/")
            or ".." in member.name.split("/")
            or not (member.isfile() or member.isdir())
        ):
            raise InvalidInput(
                f"the backup holds an unexpected entry {member.name!r}: it was not made by rigbase"
            )
        if member.name not in allowed and top not in KEY_DIRS:
            raise InvalidInput(
                f"the backup holds an unexpected entry {member.name!r}: it was not made by rigbase"
            )
        out.append(member)
    return out


def restore(settings: Settings, source: Path, passphrase: str) -> BackupSummary:
    """Restore `source` into `settings.home`, which must be empty (or absent): nothing is overwritten."""
    try:
        blob = source.read_bytes()
    except OSError as exc:
        raise InvalidInput(f"cannot read {source} ({exc.strerror})") from None
    if not blob.startswith(MAGIC) or len(blob) < len(MAGIC) + 28 + 16:
        raise InvalidInput(f"{source} is not a rigbase backup (made by `provision backup`)")
    home = settings.home
    if home.exists() and any(home.iterdir()):
        raise Conflict(f"{home} is not empty: restore into a new, empty RIGBASE_HOME")
    salt = blob[len(MAGIC) : len(MAGIC) + 16]
    nonce = blob[len(MAGIC) + 16 : len(MAGIC) + 28]
    try:
        plain = AESGCM(_key(passphrase, salt)).decrypt(nonce, blob[len(MAGIC) + 28 :], MAGIC)
    except InvalidTag:
        raise InvalidInput(
            f"{source} cannot be decrypted: wrong passphrase, or the file was changed"
        ) from None
    with tarfile.open(fileobj=io.BytesIO(plain), mode="r:gz") as tar:
        members = _safe_members(tar)
        db = _sqlite_path(settings)
        if any(m.name == STORE_MEMBER for m in members) and db is None:
            raise InvalidInput("this backup holds a SQLite store but the control plane is set to PostgreSQL")
        settings.ensure_home()
        for member in members:
            if member.isdir():
                (home / member.name).mkdir(mode=0o700, parents=True, exist_ok=True)
                continue
            data = tar.extractfile(member)
            assert data is not None
            target = db if member.name == STORE_MEMBER and db is not None else home / member.name
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            _private_write(target, data.read())
    return BackupSummary(
        source, [m.name for m in members], "sqlite" if db is not None else "postgresql", len(blob)
    )
