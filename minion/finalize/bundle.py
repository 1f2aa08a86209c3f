"""The playbook bundle: downloaded over the minion's own connection with the node credential, checked
against the digest the heartbeat answer named, unpacked into the state directory.

A bundle is a gzip'd tar of the control plane's playbook directory (services/fleet/finalize_bundle.py):
regular files and directories with relative names only. Anything else (an absolute name, `..`, a link, a
device) is refused, so a bundle can never write outside its own directory."""

from __future__ import annotations

import hashlib
import io
import shutil
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any

from contracts.finalize import BUNDLE_MAX_BYTES, FinalizeWork


class BundleProblem(RuntimeError):
    """The bundle cannot be used; the message is the one-line reason the outcome reports."""


def download(http: Any, work: FinalizeWork, credential: str) -> bytes:
    """GET the bundle (`http`: the minion's httpx client, ControlPlane.http), at most BUNDLE_MAX_BYTES,
    and check its SHA-256. Transport errors propagate (httpx.TransportError): the caller retries later."""
    chunks: list[bytes] = []
    size = 0
    headers = {"Authorization": f"Bearer {credential}"}
    with http.stream("GET", work.bundle_path, headers=headers) as response:
        if response.status_code != 200:
            response.read()
            raise BundleProblem(
                f"the control plane answered HTTP {response.status_code} for playbook bundle "
                f"{work.bundle_digest[:12]}: {response.text[:200]}"
            )
        for chunk in response.iter_bytes():
            size += len(chunk)
            if size > BUNDLE_MAX_BYTES:
                raise BundleProblem(f"playbook bundle is larger than {BUNDLE_MAX_BYTES} bytes; refused")
            chunks.append(chunk)
    data = b"".join(chunks)
    check_digest(data, work.bundle_digest)
    return data


def check_digest(data: bytes, expected: str) -> None:
    got = hashlib.sha256(data).hexdigest()
    if got != expected:
        raise BundleProblem(f"playbook bundle digest mismatch: expected {expected} got {got}")


def _members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    members = tar.getmembers()
    for m in members:
        name = PurePosixPath(m.name)
        if name.is_absolute() or ".." in name.parts or not (m.isfile() or m.isdir()):
            raise BundleProblem(f"playbook bundle member {m.name!r} is not a plain relative path; refused")
    return members


def unpack(data: bytes, dest: Path) -> Path:
    """Unpack into `dest` (replaced whole: a half-unpacked bundle from a killed run is never used)."""
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            members = _members(tar)
            tmp.mkdir(parents=True, mode=0o700)
            # The members are checked above (plain files and directories, relative, no ".."). The "data"
            # filter adds owner/mode hygiene where tarfile has it: 3.11.4+, while Debian 12, the node's OS,
            # ships 3.11.2 (found by the VM test: extractall() refused the keyword on the node).
            safe: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(tmp, members=members, **safe)
    except (tarfile.TarError, OSError, EOFError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BundleProblem(f"playbook bundle cannot be unpacked ({exc})") from None
    except BundleProblem:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest
