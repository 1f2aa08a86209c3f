"""Install the control plane's SSH public key (the join answer's `ssh_authorized_key`) so the finalize
playbook can reach this node over SSH — only where the operator asked with `--authorized-keys PATH`
(the boot image's unit passes /root/.ssh/authorized_keys; lab minions run on the control plane's own
host and must never touch its files, so they pass nothing and nothing is written).

The line is recognised by its comment: a changed key (rotation) replaces it, every other line stays."""

from __future__ import annotations

import os
from pathlib import Path

KEY_COMMENT = "rigbase-control-plane"  # the control plane's provisioner/services/ssh_keys.py writes it


class AuthorizedKeyError(ValueError):
    pass


def _ours(line: str) -> bool:
    return line.split()[-1:] == [KEY_COMMENT]


def install(path: Path, key_line: str) -> bool:
    """Put `key_line` into `path` (one line, idempotent); True when the file changed. The file is
    replaced atomically with mode 0600, its directory created 0700."""
    key_line = key_line.strip()
    if "\n" in key_line or not key_line.startswith("ssh-") or not _ours(key_line):
        raise AuthorizedKeyError(
            f"the control plane sent an unexpected SSH key line ({key_line[:40]!r}); "
            "upgrade the minion or the control plane so they match"
        )
    try:
        old = path.read_text().splitlines()
    except FileNotFoundError:
        old = []
    kept = [line for line in old if not _ours(line)]
    new = [*kept, key_line]
    if new == old and path.stat().st_mode & 0o777 == 0o600:
        return False
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.rigbase-tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("\n".join(new) + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return True


def install_from_join(path: Path | None, node: dict[str, object]) -> str | None:
    """After a successful join: install the answer's key when `--authorized-keys` was given. Returns a
    warning to print when it could not be (the join itself stands; finalize will report unreachable)."""
    if path is None:
        return None
    key_line = node.get("ssh_authorized_key")
    if not isinstance(key_line, str) or not key_line:
        return (
            f"the control plane sent no SSH key, {path} not written: upgrade the control plane, "
            "or install its key by hand"
        )
    try:
        install(path, key_line)
    except (OSError, AuthorizedKeyError) as exc:
        return f"cannot write the control plane's SSH key to {path} ({exc}); fix the path or its permissions"
    return None
