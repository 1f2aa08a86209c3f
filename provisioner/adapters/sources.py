"""Reading an object's remote source into a local directory (docs/data.md, "Sources"), each with the
library made for it: boto3 for s3:// (and S3-compatible stores at an endpoint URL), google-cloud-storage for
gs://, azure-storage-blob for azure://ACCOUNT/CONTAINER/PREFIX (an endpoint URL for another blob endpoint),
httpx for https:// and http:// (an archive is unpacked), git for git+https://.

Every failure is a SourceError with one line that says what to do. An archive's member that would land
outside the directory (an absolute path, `..`, a link) is refused by Python's own extraction filter."""

from __future__ import annotations

import ipaddress
import shutil
import socket
import subprocess
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Final
from urllib.parse import urlsplit

from contracts.data_objects import ARCHIVE_SUFFIXES, Source, SourceScheme, check_relative
from contracts.errors import InvalidInput

GIT_TIMEOUT_S: Final = 600
MAX_REDIRECTS: Final = 5
HTTP_TIMEOUT_S: Final = 60.0


class SourceError(Exception):
    """The source cannot be read; the message is one line for the object's reason."""


Networks = tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]


def networks_of(cidrs: tuple[str, ...]) -> Networks:
    return tuple(ipaddress.ip_network(c.strip(), strict=False) for c in cidrs if c.strip())


def check_host(host: str | None, allowed: Networks) -> None:
    """Refuse a host that is, or resolves to, an address that is not public, unless the operator allows
    its network (RIGBASE_SOURCE_NETWORKS): a tenant's URL must not reach the control plane's own side."""
    if not host:
        raise SourceError("the URI names no host")
    try:
        found = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except socket.gaierror:
        raise SourceError(f"{host}: the name does not resolve") from None
    for text in sorted(found):
        ip = ipaddress.ip_address(text.split("%", 1)[0])
        if not ip.is_global and not any(ip in net for net in allowed):
            raise SourceError(
                f"{host} is {ip}, not a public address: the operator allows such a network with "
                "RIGBASE_SOURCE_NETWORKS"
            )


@dataclass(frozen=True)
class Credentials:
    """A project key's two halves (services/accounts/project_keys.py), named by the key in messages."""

    name: str  # e.g. aws/default
    key_id: str
    secret: str


class TooBig(SourceError):
    pass


class _Budget:
    """Bytes still allowed by the project's quota while a source is read."""

    def __init__(self, limit: int) -> None:
        self.left = limit

    def spend(self, n: int, what: str) -> None:
        self.left -= n
        if self.left < 0:
            raise TooBig(
                f"{what} is larger than the project's storage quota left: remove objects, or raise it"
            )


def fetch(
    source: Source,
    dest: Path,
    *,
    credentials: Credentials | None,
    endpoint_url: str | None,
    limit: int,
    allowed: Networks = (),
) -> None:
    """Read `source` into the empty directory `dest`, at most `limit` bytes; hosts checked (check_host)."""
    budget = _Budget(limit)
    if endpoint_url is not None:
        check_host(urlsplit(endpoint_url).hostname, allowed)
    if source.scheme in (SourceScheme.HTTPS, SourceScheme.HTTP, SourceScheme.GIT, SourceScheme.GIT_HTTP):
        check_host(urlsplit(source.uri).hostname, allowed)
    if source.scheme is SourceScheme.S3:
        _s3(source.uri, dest, credentials, endpoint_url, budget)
    elif source.scheme is SourceScheme.GS:
        _gs(source.uri, dest, credentials, budget)
    elif source.scheme is SourceScheme.AZURE:
        _azure(source.uri, dest, credentials, endpoint_url, budget)
    elif source.scheme in (SourceScheme.HTTPS, SourceScheme.HTTP):
        _web(source.uri, dest, budget, allowed)
    elif source.scheme in (SourceScheme.GIT, SourceScheme.GIT_HTTP):
        _git(source.uri, source.ref, dest, budget)
    else:
        raise SourceError(f"{source.scheme}:// sources are not read by this control plane")


def _bucket_and_prefix(uri: str) -> tuple[str, str]:
    parts = urlsplit(uri)
    return parts.netloc, parts.path.lstrip("/")


def _target(dest: Path, relative: str) -> Path:
    try:
        check_relative(relative)
    except InvalidInput as exc:
        raise SourceError(exc.message) from None
    return dest / relative


def _s3_client(creds: Credentials | None, endpoint_url: str | None, *, signed: bool) -> Any:
    """boto3's S3 client with the project key (unsigned: a public bucket read without one)."""
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=creds.key_id if creds else None,
        aws_secret_access_key=creds.secret if creds else None,
        region_name="us-east-1",
        config=Config(signature_version="s3v4" if signed else UNSIGNED, retries={"max_attempts": 3}),
    )


def _s3(uri: str, dest: Path, creds: Credentials | None, endpoint_url: str | None, budget: _Budget) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = _bucket_and_prefix(uri)
    client = _s3_client(creds, endpoint_url, signed=creds is not None)
    whose = _whose(creds)
    try:
        found = 0
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                key = str(item["Key"])
                if key.endswith("/"):
                    continue  # a console's "folder" marker
                relative = (
                    key[len(prefix) :].lstrip("/") if prefix and key != prefix else PurePosixPath(key).name
                )
                budget.spend(int(item.get("Size", 0)), uri)
                target = _target(dest, relative)
                target.parent.mkdir(parents=True, exist_ok=True)
                client.download_file(bucket, key, str(target))
                found += 1
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code, message = error.get("Code", "?"), error.get("Message", "")
        raise SourceError(f"{uri}: {code} {whose}{': ' + message if message else ''}") from None
    except BotoCoreError as exc:
        raise SourceError(f"{uri}: {exc}") from None
    if not found:
        raise SourceError(f"{uri}: no objects under that prefix")


def _gs_client(creds: Credentials | None) -> Any:
    """Cloud Storage with the project's gcp key, else anonymous (a public bucket)."""
    import json

    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    if creds is not None:
        return storage.Client.from_service_account_info(json.loads(creds.secret))
    return storage.Client(project="anonymous", credentials=AnonymousCredentials())


def _gs(uri: str, dest: Path, creds: Credentials | None, budget: _Budget) -> None:
    from google.api_core import exceptions as gexc

    bucket_name, prefix = _bucket_and_prefix(uri)
    try:
        client = _gs_client(creds)
    except (ValueError, KeyError) as exc:
        raise SourceError(
            f"{uri}: project key {creds.name if creds else ''} is not a service account key: {exc}"
        ) from None
    found = 0
    try:
        for blob in client.list_blobs(bucket_name, prefix=prefix or None):
            if blob.name.endswith("/"):
                continue
            relative = (
                blob.name[len(prefix) :].lstrip("/")
                if prefix and blob.name != prefix
                else PurePosixPath(blob.name).name
            )
            budget.spend(int(blob.size or 0), uri)
            target = _target(dest, relative)
            target.parent.mkdir(parents=True, exist_ok=True)
            blob.download_to_filename(str(target))
            found += 1
    except gexc.GoogleAPICallError as exc:
        raise SourceError(f"{uri}: {exc.code} {exc.message}") from None
    if not found:
        raise SourceError(f"{uri}: no objects under that prefix")


def _whose(creds: Credentials | None) -> str:
    return f"with project key {creds.name}" if creds else "without a key (add one: provision project key set)"


def _azure_container(uri: str, creds: Credentials | None, endpoint_url: str | None) -> tuple[Any, str]:
    """(the container's client, its prefix) for azure://ACCOUNT/CONTAINER[/PREFIX]. The
    project's azure key is the account's name and key (or a SAS token); without one, anonymous."""
    from azure.storage.blob import ContainerClient

    account, _, rest = uri.removeprefix("azure://").partition("/")
    container, _, prefix = rest.partition("/")
    url = endpoint_url or f"https://{account}.blob.core.windows.net"
    credential: Any = None
    if creds is not None:
        sas = creds.secret.lstrip("?")
        credential = (
            sas
            if sas.startswith("sv=")
            else {"account_name": creds.key_id or account, "account_key": creds.secret}
        )
    client = ContainerClient(url.rstrip("/"), container, credential=credential, retry_total=2)
    return client, prefix


def _azure_error(uri: str, exc: Exception, whose: str) -> SourceError:
    from azure.core.exceptions import HttpResponseError

    if isinstance(exc, HttpResponseError):
        code = getattr(exc, "error_code", None) or (exc.reason or "").replace(" ", "")
        code = getattr(code, "value", code)  # the SDK's StorageErrorCode: its wire name
        if exc.status_code in (401, 403):
            return SourceError(f"{uri}: {code} {whose}: check the key's account name and key, or SAS token")
        return SourceError(f"{uri}: {code} {whose}")
    return SourceError(f"{uri}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")


def _azure(
    uri: str, dest: Path, creds: Credentials | None, endpoint_url: str | None, budget: _Budget
) -> None:
    from azure.core.exceptions import AzureError

    whose = _whose(creds)
    try:
        client, prefix = _azure_container(uri, creds, endpoint_url)
    except (ValueError, AzureError) as exc:
        raise SourceError(f"{uri}: {exc}") from None
    found = 0
    try:
        for blob in client.list_blobs(name_starts_with=prefix or None):
            name = str(blob.name)
            if name.endswith("/"):
                continue
            relative = (
                name[len(prefix) :].lstrip("/") if prefix and name != prefix else PurePosixPath(name).name
            )
            budget.spend(int(blob.size or 0), uri)
            target = _target(dest, relative)
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("wb") as fh:
                client.download_blob(name).readinto(fh)
            found += 1
    except AzureError as exc:
        raise _azure_error(uri, exc, whose) from None
    if not found:
        raise SourceError(f"{uri}: no blobs under that prefix")


def is_archive(name: str) -> bool:
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def _web(uri: str, dest: Path, budget: _Budget, allowed: Networks) -> None:
    import httpx

    name = PurePosixPath(urlsplit(uri).path).name or "index.html"
    download = dest.parent / f".download-{name}"
    at = uri
    try:
        for _ in range(MAX_REDIRECTS):  # each hop's host is checked as the first one was
            head = httpx.head(at, timeout=HTTP_TIMEOUT_S)
            if head.status_code not in (301, 302, 303, 307, 308) or "location" not in head.headers:
                break
            at = str(head.url.join(head.headers["location"]))
            if urlsplit(at).scheme not in ("http", "https"):
                raise SourceError(f"{uri}: redirected to {at[:120]}, which is not http(s)")
            check_host(urlsplit(at).hostname, allowed)
        with httpx.stream("GET", at, follow_redirects=False, timeout=HTTP_TIMEOUT_S) as answer:
            if answer.status_code != 200:
                raise SourceError(f"{uri}: HTTP {answer.status_code}")
            with download.open("wb") as fh:
                for piece in answer.iter_bytes(1 << 20):
                    budget.spend(len(piece), uri)
                    fh.write(piece)
    except httpx.HTTPError as exc:
        download.unlink(missing_ok=True)
        raise SourceError(f"{uri}: cannot be read ({type(exc).__name__}: {exc})") from None
    if is_archive(name):
        try:
            unpack(download, dest, budget)
        finally:
            download.unlink(missing_ok=True)
    else:
        shutil.move(download, _target(dest, name))


def unpack(archive: Path, dest: Path, budget: _Budget | None = None) -> None:
    """A .zip or .tar.* into `dest`; a member outside it (absolute, `..`, a link out) is refused."""
    what = archive.name.removeprefix(".download-")
    try:
        if archive.name.lower().endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                members = zf.infolist()
                for member in members:
                    if member.is_dir():
                        continue
                    _target(dest, member.filename)  # zipfile would silently drop '..': refuse instead
                    if budget is not None:
                        budget.spend(member.file_size, what)
                zf.extractall(dest)
        else:
            with tarfile.open(archive) as tf:
                for entry in tf.getmembers():
                    if entry.isfile() and budget is not None:
                        budget.spend(entry.size, what)
                tf.extractall(dest, filter="data")
    except tarfile.FilterError as exc:  # its message names this machine's paths: only the member's
        outside = exc.tarinfo.name
        raise SourceError(
            f"{what}: refused, member {outside!r} would be written outside its directory"
        ) from None
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
        raise SourceError(f"{what}: not a readable archive ({exc})") from None


def _git(url: str, ref: str | None, dest: Path, budget: _Budget) -> None:
    # no redirect is followed: its host would not have been checked
    args = [
        "git",
        "-c",
        "protocol.file.allow=never",
        "-c",
        "http.followRedirects=false",
        "clone",
        "--quiet",
        "--depth",
        "1",
    ]
    if ref:
        args += ["--branch", ref]
    try:
        done = subprocess.run(
            [*args, url, str(dest)],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            env={"GIT_TERMINAL_PROMPT": "0", "PATH": "/usr/bin:/bin", "HOME": str(dest.parent)},
        )
    except subprocess.TimeoutExpired:
        raise SourceError(f"git+{url}: the clone took longer than {GIT_TIMEOUT_S} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["git clone failed"])[-1]
        raise SourceError(f"git+{url}{'@' + ref if ref else ''}: {last}")
    shutil.rmtree(dest / ".git", ignore_errors=True)
    total = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file() and not p.is_symlink())
    budget.spend(total, f"git+{url}")


def upload_file(
    path: Path, uri: str, *, credentials: Credentials | None, endpoint_url: str | None, allowed: Networks = ()
) -> None:
    """One file to `s3://BUCKET/KEY`, `gs://BUCKET/KEY` or `azure://ACCOUNT/CONTAINER/NAME` (a job's output
    zip); SourceError says why not. Never with the control plane's own credentials: without the project's
    key the write is anonymous."""
    if endpoint_url is not None:
        check_host(urlsplit(endpoint_url).hostname, allowed)
    if uri.startswith("s3://"):
        _upload_s3(path, uri, credentials, endpoint_url)
    elif uri.startswith("azure://"):
        _upload_azure(path, uri, credentials, endpoint_url)
    else:
        _upload_gs(path, uri, credentials)


def _upload_s3(path: Path, uri: str, credentials: Credentials | None, endpoint_url: str | None) -> None:
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = _bucket_and_prefix(uri)
    client = _s3_client(credentials, endpoint_url, signed=credentials is not None)
    try:
        try:
            client.upload_file(str(path), bucket, key)
        except S3UploadFailedError as failed:  # its words name this machine's path: its cause's do not
            raise (failed.__context__ if isinstance(failed.__context__, ClientError) else failed) from None
    except ClientError as exc:
        error = exc.response.get("Error", {})
        whose = f"with project key {credentials.name}" if credentials else "without a key"
        raise SourceError(f"{error.get('Code', '?')} {whose}: {error.get('Message', '')}".strip()) from None
    except (BotoCoreError, S3UploadFailedError, OSError) as exc:
        raise SourceError(str(exc)) from None


def _upload_azure(path: Path, uri: str, credentials: Credentials | None, endpoint_url: str | None) -> None:
    from azure.core.exceptions import AzureError

    blob_at = uri.removeprefix("azure://").split("/", 2)  # account, container, blob name
    if len(blob_at) < 3 or not blob_at[2]:
        raise SourceError(f"{uri}: write azure://ACCOUNT/CONTAINER/NAME")
    try:
        client, name = _azure_container(uri, credentials, endpoint_url)
        with path.open("rb") as fh:
            client.upload_blob(name, fh, overwrite=True)
    except (ValueError, AzureError) as exc:
        raise _azure_error(uri, exc, _whose(credentials)) from None


def _upload_gs(path: Path, uri: str, credentials: Credentials | None) -> None:
    from google.api_core import exceptions as gexc

    bucket, key = _bucket_and_prefix(uri)
    try:
        _gs_client(credentials).bucket(bucket).blob(key).upload_from_filename(str(path))
    except (ValueError, KeyError) as exc:
        name = credentials.name if credentials else ""
        raise SourceError(f"project key {name} is not a service account key: {exc}") from None
    except gexc.GoogleAPICallError as exc:
        raise SourceError(f"{exc.code} {exc.message}") from None
