"""Cloud Storage's resumable upload protocol, client side: send a file to an upload session URI the control
plane opened (provisioner/providers/gcp/images.py), in chunks, resuming from what the server already has.

The session URI is the only credential it needs (it is a bearer capability, valid for a week), so the
operator's machine uploads straight to Cloud Storage without the project's key. The protocol
(cloud.google.com/storage/docs/performing-resumable-uploads): `PUT` with `Content-Range: bytes */SIZE`
asks how far the server got (308 with `Range: bytes=0-N`, or 200/201 when complete); each chunk is a `PUT`
with `Content-Range: bytes FIRST-LAST/SIZE`, in multiples of 256 KiB except the last. The CRC32C was
declared when the session was opened: Cloud Storage refuses a finished object whose bytes differ."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from pathlib import Path

import httpx

from provisioner.client.errors import ControlPlaneError

QUANTUM = 256 * 1024  # Cloud Storage persists a resumable upload in multiples of this
CHUNK = 32 * QUANTUM  # 8 MiB: every chunk but the last must be a multiple of QUANTUM
_RANGE = re.compile(r"bytes=0-(\d+)")
INCOMPLETE = 308


def crc32c_and_sha256(path: Path) -> tuple[str, str]:
    """(CRC32C as Cloud Storage reports it: base64 of the big-endian 4 bytes, SHA-256 hex) in one read."""
    import hashlib

    import google_crc32c

    crc, sha = google_crc32c.Checksum(), hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            crc.update(chunk)
            sha.update(chunk)
    return base64.b64encode(crc.digest()).decode(), sha.hexdigest()


def _committed(response: httpx.Response, size: int) -> int:
    """Bytes the server holds after `response`: all of them when it answered 200/201."""
    if response.status_code in (200, 201):
        return size
    if response.status_code == INCOMPLETE:
        match = _RANGE.fullmatch(response.headers.get("range", ""))
        # Persisted bytes are whole quanta: anything else (gcp-storage-emulator answers "bytes=0-0" for an
        # empty session, where Cloud Storage sends no Range) is read as the quanta below it
        return (int(match.group(1)) + 1) // QUANTUM * QUANTUM if match else 0
    raise ControlPlaneError(
        f"Cloud Storage answered HTTP {response.status_code} to the upload: "
        f"{response.text.strip().splitlines()[0][:200] if response.text.strip() else 'no detail'}; "
        "run `provision image publish` again to resume",
        code="upload_failed",
        status=response.status_code,
    )


def upload(
    url: str,
    path: Path,
    *,
    on_progress: Callable[[int, int], None] = lambda done, total: None,
    client: httpx.Client | None = None,
    chunk_size: int = CHUNK,
) -> int:
    """Send `path` to the session at `url`, resuming after what it already has; returns the bytes sent.
    `chunk_size`: a multiple of QUANTUM."""
    if chunk_size % QUANTUM:
        raise ValueError(f"chunk_size must be a multiple of {QUANTUM}")
    size = path.stat().st_size
    http = client or httpx.Client(timeout=httpx.Timeout(120.0, connect=15.0))
    try:
        done = _committed(http.put(url, headers={"Content-Range": f"bytes */{size}"}), size)
        sent = 0
        with path.open("rb") as fh:
            while done < size:
                on_progress(done, size)
                fh.seek(done)
                chunk = fh.read(chunk_size)
                last = done + len(chunk) - 1
                response = http.put(
                    url, content=chunk, headers={"Content-Range": f"bytes {done}-{last}/{size}"}
                )
                now = _committed(response, size)
                if now <= done:
                    raise ControlPlaneError(
                        f"Cloud Storage kept none of the chunk at byte {done}: "
                        "run `provision image publish` again",
                        code="upload_failed",
                    )
                sent += now - done
                done = now
        on_progress(size, size)
        return sent
    except httpx.TransportError as exc:
        raise ControlPlaneError(
            f"the upload to Cloud Storage broke off ({type(exc).__name__}): run `provision image publish` "
            "again to resume where it stopped",
            code="upload_failed",
        ) from None
    finally:
        if client is None:
            http.close()
