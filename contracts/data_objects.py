"""A project's datasets, models and checkpoints (docs/data.md): what they are on the wire, between the CLI
and the control plane and between the control plane and a node.

An object is content-addressed. Its files are cut into chunks of at most CHUNK_BYTES, each named by its
SHA-256; the object's manifest lists every file with its size, mode and chunks, and the object's digest is
the SHA-256 of the manifest's canonical JSON. An upload therefore resumes by asking which chunks the
control plane lacks, and a node checks every chunk it fetches and the manifest against the digest the
control plane sent in the worker's assignment: a tampered or truncated byte is refused and fetched again.

Paths in a manifest are relative POSIX paths without `.`, `..`, empty parts or NUL, so nothing written
from one can land outside the object's directory, whatever the source (an archive, a bucket listing)."""

from __future__ import annotations

import hashlib
import json
import re
from enum import StrEnum
from pathlib import PurePosixPath
from typing import Final
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from contracts.errors import InvalidInput

CHUNK_BYTES: Final = 8 * 2**20  # an upload's and a node's fetch unit
MAX_FILES: Final = 200_000  # files in one object (its manifest stays a few tens of MB at most)
MAX_PATH: Final = 4096
SHA256_HEX: Final = re.compile(r"[0-9a-f]{64}")
DIGEST: Final = re.compile(r"sha256:[0-9a-f]{64}")
# a name as trainML writes them (`CIFAR-10`, `resnet 50 weights`): one printable line without '/'
NAME_MAX: Final = 128

# node routes: the manifest and the chunks of an object a worker on the node mounts
MANIFEST_ROUTE: Final = "/v1/nodes/{node_id}/objects/{object_id}/manifest"
CHUNK_ROUTE: Final = "/v1/nodes/{node_id}/objects/{object_id}/chunks/{chunk}"
# …and a worker's /opt/ml/output going up when it ends: OUTPUT_ROUTE + /missing, /chunks/SHA, /manifest
OUTPUT_ROUTE: Final = "/v1/nodes/{node_id}/jobs/{job_id}/workers/{worker}/output"
MAX_CHUNK_LIST: Final = 200_000


class ObjectKind(StrEnum):
    """trainml-job-configuration.txt's three persistent kinds."""

    DATASET = "dataset"  # read-only at /opt/ml/input[/NAME]
    MODEL = "model"  # read-only at /opt/ml/models
    CHECKPOINT = "checkpoint"  # read-only at /opt/ml/checkpoint[/NAME]


class SourceScheme(StrEnum):
    UPLOAD = "upload"  # a local file or directory the CLI uploads
    S3 = "s3"
    GS = "gs"
    AZURE = "azure"
    HTTPS = "https"
    HTTP = "http"
    GIT = "git+https"
    GIT_HTTP = "git+http"  # a repository on the region's LAN (git's "dumb" or smart HTTP)


# what each remote scheme needs from the project's third-party keys (docs/data.md, "Sources")
KEY_KIND_OF: Final = {
    SourceScheme.S3: "aws",
    SourceScheme.GS: "gcp",
    SourceScheme.AZURE: "azure",
}
ARCHIVE_SUFFIXES: Final = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")


def check_name(kind: ObjectKind, name: str) -> str:
    """A name that mounts as a directory (spaces become underscores there) and reads on one line."""
    if (
        not 0 < len(name) <= NAME_MAX
        or not name.isprintable()
        or "/" in name
        or name.strip() in ("", ".", "..")
    ):
        raise InvalidInput(
            f"{kind} name {name[:80]!r}: 1 to {NAME_MAX} printable characters, no '/'", code="invalid_name"
        )
    return name


def mount_dir(name: str) -> str:
    """The directory an object mounts at when several of its kind are mounted: spaces as underscores."""
    return name.replace(" ", "_")


def check_relative(path: str) -> str:
    """A manifest path: relative, normalised, no '..' (an archive's `../x` or `/etc/x` is refused)."""
    pure = PurePosixPath(path)
    if (
        not path
        or len(path) > MAX_PATH
        or "\0" in path
        or pure.is_absolute()
        or any(part in ("", ".", "..") for part in path.split("/"))
    ):
        raise InvalidInput(
            f"path {path[:120]!r} is not a plain relative path (no leading '/', no '.' or '..' parts)",
            code="unsafe_path",
        )
    return path


class ObjectFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(max_length=MAX_PATH)
    size: int = Field(ge=0)
    mode: int = Field(0o644, ge=0, le=0o7777)  # the permission bits; nodes drop set-id and write bits
    chunks: list[str] = Field(default_factory=list, description="SHA-256 hex of each chunk, in order")

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        try:
            return check_relative(value)
        except InvalidInput as exc:
            raise ValueError(exc.message) from None

    @field_validator("chunks")
    @classmethod
    def _hex(cls, value: list[str]) -> list[str]:
        for chunk in value:
            if not SHA256_HEX.fullmatch(chunk):
                raise ValueError(f"chunk {chunk[:80]!r} is not a SHA-256 in lowercase hex")
        return value


class Manifest(BaseModel):
    """Every file of an object, sorted by path."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    files: list[ObjectFile] = Field(max_length=MAX_FILES)

    @field_validator("files")
    @classmethod
    def _sorted_and_distinct(cls, value: list[ObjectFile]) -> list[ObjectFile]:
        paths = [f.path for f in value]
        if paths != sorted(set(paths)):
            raise ValueError("files must be sorted by path, each path once")
        seen = set(paths)
        for path in paths:  # a file cannot also be a directory of another file
            parent = PurePosixPath(path).parent
            while str(parent) != ".":
                if str(parent) in seen:
                    raise ValueError(f"{parent} is both a file and a directory")
                parent = parent.parent
        return value

    def canonical(self) -> bytes:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":")).encode()

    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.canonical()).hexdigest()

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def chunk_set(self) -> set[str]:
        return {c for f in self.files for c in f.chunks}


class ChunkList(BaseModel):
    """The chunks an upload has (`POST …/missing`)."""

    model_config = ConfigDict(extra="forbid")

    chunks: list[str] = Field(max_length=MAX_CHUNK_LIST, description="SHA-256 hex of chunks the upload has")


class MissingChunks(BaseModel):
    """Those the control plane does not hold: what the upload still sends."""

    missing: list[str]


class Source(BaseModel):
    """Where an object's content comes from, parsed once (docs/data.md, "Sources")."""

    model_config = ConfigDict(frozen=True)

    scheme: SourceScheme
    uri: str  # as given (a local path for an upload: only the CLI reads it)
    ref: str | None = None  # git: the branch, tag or commit after '@'

    @property
    def key_kind(self) -> str | None:
        return KEY_KIND_OF.get(self.scheme)


def parse_source(text: str) -> Source:
    """`s3://bucket/prefix`, `gs://bucket/prefix`, `azure://account/container/prefix`, `https://…`,
    `http://…`, `git+https://host/repo[@ref]`; anything without a scheme is a local path to upload."""
    if not text or len(text) > MAX_PATH or not text.isprintable():
        raise InvalidInput("the source: a path, or a URI such as s3://bucket/prefix", code="invalid_source")
    if "://" not in text:
        return Source(scheme=SourceScheme.UPLOAD, uri=text)
    scheme = text.split("://", 1)[0].lower()
    try:
        known = SourceScheme(scheme)
    except ValueError:
        known = None
    if known is None or known is SourceScheme.UPLOAD:
        remote = ", ".join(f"{s.value}://" for s in SourceScheme if s is not SourceScheme.UPLOAD)
        raise InvalidInput(
            f"source scheme {scheme[:20]!r}:// is not read: use {remote} or a local path",
            code="invalid_source",
        )
    parts = urlsplit(text)
    if not parts.netloc:
        raise InvalidInput(f"source {text[:120]!r} names no bucket or host", code="invalid_source")
    if known is SourceScheme.AZURE and len([p for p in parts.path.split("/") if p]) < 1:
        raise InvalidInput(
            f"source {text[:120]!r}: write azure://ACCOUNT/CONTAINER[/PREFIX]", code="invalid_source"
        )
    if known in (SourceScheme.GIT, SourceScheme.GIT_HTTP):
        path, _, ref = parts.path.partition("@")
        web = known.value.removeprefix("git+")
        return Source(scheme=known, uri=f"{web}://{parts.netloc}{path}", ref=ref or None)
    return Source(scheme=known, uri=text)
