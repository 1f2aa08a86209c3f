"""What dpkg holds as installed in a tree, read from its status file (no chroot needed)."""

from __future__ import annotations

from pathlib import Path


def package_versions(root: Path) -> dict[str, str]:
    """name → version of every package dpkg holds as installed in the tree."""
    status = (root / "var/lib/dpkg/status").read_text(errors="replace")
    found: dict[str, str] = {}
    for stanza in status.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line[0].isspace()
        )
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            found[fields["Package"]] = fields.get("Version", "")
    return found
