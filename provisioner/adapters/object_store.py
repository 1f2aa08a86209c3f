"""Where the control plane keeps object bytes (docs/data.md, "Where objects live"): an S3-compatible bucket
(AWS, or MinIO, Ceph RGW, SeaweedFS or Garage run by the operator) through boto3, a Cloud Storage bucket
through google-cloud-storage, or, embedded, a directory under RIGBASE_HOME behind the same interface, as
SQLite stands in for PostgreSQL.

Keys are `PREFIX/projects/PROJECT/chunks/SHA256` and `PREFIX/projects/PROJECT/manifests/DIGEST`: content
addressed within a project. Chunks are not shared across projects, so no account can learn from a
"which chunks are missing?" answer that another account holds a file."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from contracts.data_objects import Manifest
from contracts.errors import InvalidInput


class ObjectStore(Protocol):
    def has(self, key: str) -> bool: ...

    def size(self, key: str) -> int | None:
        """The bytes under `key`, None when there are none."""
        ...

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes:
        """The bytes under `key`; KeyError when there are none."""
        ...

    def delete(self, key: str) -> None: ...

    def describe(self) -> str: ...

    def presign(self, key: str, expires_s: int) -> str | None:
        """A URL that reads `key` for `expires_s` seconds without credentials; None: the store has none."""
        ...


def chunk_key(project_id: str, sha256: str) -> str:
    return f"projects/{project_id}/chunks/{sha256}"


def manifest_key(project_id: str, digest: str) -> str:
    return f"projects/{project_id}/manifests/{digest.removeprefix('sha256:')}"


@dataclass(frozen=True)
class DirectoryStore:
    """The embedded store: one file per key below `root`, written whole (a temporary file, renamed)."""

    root: Path

    def _path(self, key: str) -> Path:
        return self.root / key

    def has(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int | None:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            return None

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".put-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise KeyError(key) from None

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def presign(self, key: str, expires_s: int) -> str | None:
        return None  # a directory has no URLs: nodes read through the control plane

    def describe(self) -> str:
        return f"directory {self.root}"


@dataclass(frozen=True)
class S3Store:
    """A bucket of an S3-compatible store; credentials come from boto3's own chain (AWS_* variables, a
    profile, an instance role), as every S3 tool reads them."""

    bucket: str
    prefix: str
    endpoint_url: str | None
    client: Any  # botocore's S3 client (typed stubs are not a dependency)

    @classmethod
    def connect(cls, bucket: str, prefix: str, endpoint_url: str | None) -> S3Store:
        import boto3
        from botocore.config import Config

        client = boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            config=Config(signature_version="s3v4", retries={"max_attempts": 5}),
        )
        return cls(bucket, prefix.strip("/"), endpoint_url, client)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def has(self, key: str) -> bool:
        return self.size(key) is not None

    def size(self, key: str) -> int | None:
        from botocore.exceptions import ClientError

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        return int(head["ContentLength"])

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def get(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                raise KeyError(key) from None
            raise
        return bytes(answer["Body"].read())

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def presign(self, key: str, expires_s: int) -> str | None:
        """A SigV4 GET URL (boto3 signs locally: no request is made)."""
        params = {"Bucket": self.bucket, "Key": self._key(key)}
        return str(self.client.generate_presigned_url("get_object", Params=params, ExpiresIn=expires_s))

    def describe(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"s3://{self.bucket}/{self.prefix}{where}"


@dataclass(frozen=True)
class GcsStore:
    """A Cloud Storage bucket; credentials from Application Default Credentials (a service account's
    key file in GOOGLE_APPLICATION_CREDENTIALS, or the VM's), as every Google tool reads them."""

    bucket: str
    prefix: str
    client: Any  # google.cloud.storage.Client

    @classmethod
    def connect(cls, bucket: str, prefix: str) -> GcsStore:
        from google.cloud import storage

        return cls(bucket, prefix.strip("/"), storage.Client())

    def _blob(self, key: str) -> Any:
        return self.client.bucket(self.bucket).blob(f"{self.prefix}/{key}" if self.prefix else key)

    def has(self, key: str) -> bool:
        return self.size(key) is not None

    def size(self, key: str) -> int | None:
        blob = self.client.bucket(self.bucket).get_blob(self._blob(key).name)
        return None if blob is None else int(blob.size or 0)

    def put(self, key: str, data: bytes) -> None:
        self._blob(key).upload_from_string(data)

    def get(self, key: str) -> bytes:
        from google.api_core.exceptions import NotFound

        try:
            return bytes(self._blob(key).download_as_bytes())
        except NotFound:
            raise KeyError(key) from None

    def delete(self, key: str) -> None:
        from google.api_core.exceptions import NotFound

        try:
            self._blob(key).delete()
        except NotFound:
            pass

    def presign(self, key: str, expires_s: int) -> str | None:
        """A V4 signed URL when the credentials can sign (a service account's key); None otherwise (a
        VM's own credentials sign only through the IAM API, which is not asked here)."""
        from datetime import timedelta

        from google.auth.exceptions import TransportError

        try:
            url = self._blob(key).generate_signed_url(
                version="v4", expiration=timedelta(seconds=expires_s), method="GET"
            )
        except (AttributeError, TypeError, ValueError, TransportError):
            return None
        return str(url)

    def describe(self) -> str:
        return f"gs://{self.bucket}/{self.prefix}"


def open_store(setting: str | None, endpoint_url: str | None, home: Path) -> ObjectStore:
    """RIGBASE_OBJECT_STORE: `s3://BUCKET[/PREFIX]` (with RIGBASE_OBJECT_STORE_ENDPOINT for a store
    that is not AWS), `gs://BUCKET[/PREFIX]`, or a directory; unset, HOME/objects."""
    if not setting:
        return DirectoryStore(home / "objects")
    parts = urlsplit(setting)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise InvalidInput(
                f"object store {setting!r}: write s3://BUCKET[/PREFIX]", code="invalid_setting"
            )
        return S3Store.connect(parts.netloc, parts.path, endpoint_url)
    if parts.scheme == "gs":
        if not parts.netloc:
            raise InvalidInput(
                f"object store {setting!r}: write gs://BUCKET[/PREFIX]", code="invalid_setting"
            )
        return GcsStore.connect(parts.netloc, parts.path)
    if parts.scheme in ("", "file"):
        return DirectoryStore(Path(parts.path or setting))
    raise InvalidInput(
        f"object store {setting!r}: use s3://BUCKET[/PREFIX], gs://BUCKET[/PREFIX] or a directory",
        code="invalid_setting",
    )


def check_held(store: ObjectStore, project_id: str, manifest: Manifest) -> str | None:
    """Why the manifest cannot be kept: a chunk it names that is not stored, or a file whose size is not
    the sum of its chunks' (a size is what quotas count); None when it can."""
    sizes: dict[str, int | None] = {c: store.size(chunk_key(project_id, c)) for c in manifest.chunk_set()}
    absent = [c for c, n in sizes.items() if n is None]
    if absent:
        return f"{len(absent)} chunk(s) of the manifest are not uploaded: run the same upload again to resume"
    for entry in manifest.files:
        if sum(sizes[c] or 0 for c in entry.chunks) != entry.size:
            return f"{entry.path}: its size is not the sum of its chunks' sizes"
    return None
