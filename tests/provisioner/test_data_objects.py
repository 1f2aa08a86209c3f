"""Datasets, models and checkpoints against real components (docs/data.md): a real `provision serve`, the
real CLI, boto3 against moto's S3 server (as a source and as the control plane's object store), a local
HTTP server for web sources and archives, a git repository served over HTTP, and the minion's own object
cache fetching through the node routes with a node credential.

Every refusal is checked for its one line, its exit status and that nothing was left half-stored."""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import subprocess
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from contracts.data_objects import CHUNK_ROUTE, Manifest
from contracts.object_tree import scan
from minion.jobs.objects import ControlPlaneObjects, ObjectCache, ObjectUnavailable
from minion.jobs.outputs import ControlPlaneOutputs, OutputRefused, upload
from minion.join.client import ControlPlane as MinionControlPlane
from minion.join.client import Enrollment
from provisioner.adapters.object_store import chunk_key
from provisioner.adapters.sources import SourceError, check_host, networks_of
from provisioner.domain.states import ObjectState
from provisioner.reconcilers.loop import ReconcilerLoop
from provisioner.services.common.runtime import Runtime, attach, runtime_of
from provisioner.services.common.wakeups import Wake
from provisioner.services.objects import data_objects, outputs
from provisioner.settings import Settings
from provisioner.store.data_models import DataObject
from provisioner.store.engine import make_engine, make_sessionmaker
from tests.fixtures.azurite import ACCOUNT, ACCOUNT_KEY, Azurite
from tests.fixtures.control_plane import start_control_plane
from tests.fixtures.s3 import S3Server
from tests.provisioner.test_jobs_api import Fleet, _add_node, inventory, spec

BUCKET = "rigbase-objects"
LOOPBACK = "127.0.0.0/8"


class WebAndGit(http.server.SimpleHTTPRequestHandler):
    """Files below its directory, and under /git/ the repositories there through `git http-backend`
    (git's smart HTTP, as a git host serves it), run as the CGI program it is."""

    def _git(self) -> None:
        path, _, query = self.path.partition("?")
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        env = {
            "GIT_PROJECT_ROOT": self.directory,
            "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": path.removeprefix("/git"),
            "QUERY_STRING": query,
            "REQUEST_METHOD": self.command,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "PATH": "/usr/bin:/bin",
        }
        out = subprocess.run(
            ["git", "http-backend"], input=body, env=env, capture_output=True, check=True
        ).stdout
        head, _, content = out.partition(b"\r\n\r\n")
        headers = [line.split(":", 1) for line in head.decode().split("\r\n") if ":" in line]
        status = next((int(v.split()[0]) for k, v in headers if k.lower() == "status"), 200)
        self.send_response(status)
        for name, value in headers:
            if name.lower() != "status":
                self.send_header(name, value.strip())
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def do_GET(self) -> None:
        if self.path.startswith("/redirect/"):  # /redirect/HOST/PATH: 302 to http://HOST/PATH
            self.send_response(302)
            self.send_header("Location", "http://" + self.path.removeprefix("/redirect/"))
            self.end_headers()
            return
        self._git() if self.path.startswith("/git/") else super().do_GET()

    def do_HEAD(self) -> None:
        self.do_GET() if self.path.startswith("/redirect/") else super().do_HEAD()

    def do_POST(self) -> None:
        self._git()


def bare_repo(work: Path, files: dict[str, str], tag: str, bare: Path) -> Path:
    """A git repository of `files` with one commit tagged `tag`, cloned bare at `bare` (to be served)."""
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    for name, text in files.items():
        (work / name).write_text(text)
    git = ["git", "-C", str(work), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", tag], check=True)
    subprocess.run([*git, "tag", tag], check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    return bare


@contextmanager
def web_server(root: Path) -> Iterator[str]:
    handler = partial(WebAndGit, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module", params=["directory", "s3"])
def fleet(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    s3_server: S3Server,
    storage_emulator: str,
) -> Iterator[Fleet]:
    """A control plane keeping objects in its home (the embedded store) or in a bucket of moto's S3, with
    a region, two active nodes and a second account."""
    # Cloud Storage is the emulator's, for gs:// sources and outputs (google-cloud-storage reads the variable)
    env: dict[str, str] = {
        "RIGBASE_QUOTE_EVERY": "100000",
        "STORAGE_EMULATOR_HOST": storage_emulator,
        "RIGBASE_SOURCE_NETWORKS": LOOPBACK,  # the test's servers: moto, the web server, git
    }
    if request.param == "s3":
        s3_server.client().create_bucket(Bucket=BUCKET)
        env |= {
            **s3_server.env(),
            "RIGBASE_OBJECT_STORE": f"s3://{BUCKET}/cp",
            "RIGBASE_OBJECT_STORE_ENDPOINT": s3_server.url,
        }
    home = tmp_path_factory.mktemp(f"objects-{request.param}") / "home"
    aws = pytest.MonkeyPatch()
    for name, value in {**s3_server.env(), "STORAGE_EMULATOR_HOST": storage_emulator}.items():
        aws.setenv(name, value)
    request.addfinalizer(aws.undo)
    with start_control_plane(home, env=env) as cp:
        engine = make_engine(cp.database_url)
        # the test's own passes (the objects reconciler) use the server's store
        ours = ("RIGBASE_OBJECT", "RIGBASE_SOURCE")
        stored = {k.removeprefix("RIGBASE_").lower(): v for k, v in env.items() if k.startswith(ours)}
        settings = Settings(home=cp.home, database_url=cp.database_url, **stored)
        sessions = attach(make_sessionmaker(engine), Runtime.from_settings(settings))
        f = Fleet(cp, sessions)
        with cp.client() as http:
            for path, body in [
                ("/v1/providers", {"kind": "physical"}),
                ("/v1/regions", {"name": "lab-1", "provider": "physical"}),
                ("/v1/accounts", {"name": "other"}),
            ]:
                assert http.post(path, json=body).status_code == 201
            for name in ("cpu-1", "cpu-2"):
                _add_node(f, http, name, "lab-1", inventory([], threads=16))
            token = http.post("/v1/operator-tokens", json={"name": "other-admin", "account": "other"})
            f.other_token = token.json()["token"]
        f.store = request.param  # type: ignore[attr-defined]
        yield f
        engine.dispose()


def tree(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def rows(fleet: Fleet, name: str) -> list[DataObject]:
    with fleet.sessions() as s:
        return list(s.scalars(select(DataObject).where(DataObject.name == name)))


def test_a_directory_uploads_as_a_dataset_with_its_digest(fleet: Fleet, tmp_path: Path) -> None:
    big = bytes(range(256)) * 40_000  # 10 MB: two chunks
    src = tree(tmp_path / "cifar", {"train/a.bin": big, "train/b.txt": b"hello\n", "labels.csv": b"x,y\n"})
    (src / "link").symlink_to("/etc/passwd")  # never followed, never uploaded
    done = fleet.cp.provision("dataset", "create", "cifar", "--source", str(src))
    assert done.returncode == 0, done.stderr
    object_id = done.stdout.strip()
    assert object_id.startswith("obj_"), done.stdout
    assert "sent 4 chunk(s)" in done.stderr and "1 link(s)" in done.stderr, done.stderr
    shown = json.loads(fleet.cp.provision("dataset", "show", "cifar", "--json").stdout)
    assert shown["state"] == "ready" and shown["file_count"] == 3
    assert shown["size_bytes"] == len(big) + 6 + 4
    assert shown["digest"] == scan(src).manifest.digest()
    files = json.loads(fleet.cp.provision("dataset", "show", "cifar", "--files", "--json").stdout)
    assert [f["path"] for f in files] == ["labels.csv", "train/a.bin", "train/b.txt"]
    listed = fleet.cp.provision("dataset", "list")
    assert "cifar" in listed.stdout and "ready" in listed.stdout
    # the same name again is refused, in one line, and changes nothing
    again = fleet.cp.provision("dataset", "create", "cifar", "--source", str(src))
    assert again.returncode != 0 and "already exists" in again.stderr and len(again.stderr.splitlines()) == 1
    assert len(rows(fleet, "cifar")) == 1


def test_an_interrupted_upload_resumes_with_what_is_missing(fleet: Fleet, tmp_path: Path) -> None:
    src = tree(tmp_path / "w", {f"part-{i}.bin": bytes([i]) * 3_000_000 for i in range(4)})
    local = scan(src)
    # what an interrupted `dataset create` leaves: the object, downloading, with two of its four chunks
    with fleet.http() as http:
        row = http.post("/v1/datasets", json={"name": "weights", "source": str(src.resolve())}).json()
        assert row["state"] == "downloading"
        for sha in list(local.pieces)[:2]:
            answer = http.put(f"/v1/objects/{row['id']}/chunks/{sha}", content=local.pieces[sha].read())
            assert answer.status_code == 204, answer.text
        # a chunk whose bytes are not its name is refused
        bad = http.put(f"/v1/objects/{row['id']}/chunks/{'0' * 64}", content=b"not it")
        assert bad.status_code == 422 and "do not match" in bad.json()["message"]
        # a manifest before its chunks is refused; the object stays downloading
        early = http.post(f"/v1/objects/{row['id']}/manifest", json=local.manifest.model_dump(mode="json"))
        assert early.status_code == 409 and "not uploaded" in early.json()["message"], early.text
        assert http.get(f"/v1/datasets/{row['id']}").json()["state"] == "downloading"
    done = fleet.cp.provision("dataset", "create", "weights", "--source", str(src))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == row["id"]
    assert "resumed: 2 of 4 chunks were held already; sent 2 chunk(s)" in done.stderr, done.stderr
    assert rows(fleet, "weights")[0].state == "ready"


def test_bad_sources_are_refused_in_one_line_and_store_nothing(fleet: Fleet, tmp_path: Path) -> None:
    for args, words in [
        (["--source", "ftp://host/x"], "is not read: use s3://"),
        (["--source", str(tmp_path / "absent")], "does not exist"),
        (["--source", "s3://bucket/x", "--key", "nope"], "has no aws key 'nope'"),
        (["--source", "https://example.invalid/x", "--key", "k"], "take no key"),
    ]:
        done = fleet.cp.provision("dataset", "create", "bad", *args)
        assert done.returncode != 0, (args, done.stdout)
        assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1, (args, done.stderr)
    assert rows(fleet, "bad") == []
    other = fleet.cp.provision("model", "create", "a/b", "--source", "https://example.invalid/x")
    assert other.returncode != 0 and "no '/'" in other.stderr


def test_s3_web_and_git_sources_are_read_by_the_control_plane(
    fleet: Fleet,
    s3_server: S3Server,
    tmp_path: Path,
) -> None:
    s3 = s3_server.client()
    s3.create_bucket(Bucket="customer-data")
    for key, data in {
        "imagenet/a.jpg": b"A" * 1000,
        "imagenet/sub/b.jpg": b"B" * 2000,
        "other/c": b"C",
    }.items():
        s3.put_object(Bucket="customer-data", Key=key, Body=data)
    secret = tmp_path / "secret"
    secret.write_text(s3_server.env()["AWS_SECRET_ACCESS_KEY"])
    secret.chmod(0o600)
    key = fleet.cp.provision(
        "project",
        "key",
        "set",
        "default",
        "--kind",
        "aws",
        "-u",
        s3_server.env()["AWS_ACCESS_KEY_ID"],
        "--secret-file",
        str(secret),
    )
    assert key.returncode == 0, key.stderr
    web_root = tmp_path / "web"
    web_root.mkdir()
    with tarfile.open(web_root / "mnist.tar.gz", "w:gz") as tf:
        for name, data in {"mnist/train.idx": b"1" * 500, "mnist/test.idx": b"2" * 50}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    with tarfile.open(web_root / "evil.tar", "w") as tf:
        info = tarfile.TarInfo("../../escaped")
        info.size = 4
        tf.addfile(info, io.BytesIO(b"evil"))
    (web_root / "weights.bin").write_bytes(b"W" * 4096)
    bare_repo(tmp_path / "model-src", {"model.py": "print('model')\n"}, "v1", web_root / "model.git")
    with web_server(web_root) as web:
        cases = [
            (
                "dataset",
                "imagenet",
                ["--source", "s3://customer-data/imagenet/", "--endpoint-url", s3_server.url],
            ),
            ("dataset", "mnist", ["--source", f"{web}/mnist.tar.gz"]),
            ("model", "weights", ["--source", f"{web}/weights.bin"]),
            ("model", "code", ["--source", f"git+{web}/git/model.git@v1"]),
        ]
        for kind, name, args in cases:
            done = fleet.cp.provision(kind, "create", name, *args, "--wait", "--timeout", "60", "--json")
            assert done.returncode == 0, (name, done.stderr)
            assert json.loads(done.stdout)["state"] == "ready", done.stdout
        failing = [
            ("evil", ["--source", f"{web}/evil.tar"], "outside its directory"),
            ("gone", ["--source", f"{web}/absent.zip"], "HTTP 404"),
            (
                "nobucket",
                ["--source", "s3://no-such-bucket/x", "--endpoint-url", s3_server.url],
                "NoSuchBucket",
            ),
        ]
        for name, args, words in failing:
            done = fleet.cp.provision("dataset", "create", name, *args, "--wait", "--timeout", "60")
            assert done.returncode != 0, name
            assert f"{name} is failed" in done.stderr and words in done.stderr, done.stderr
    assert not (tmp_path / "escaped").exists() and not (fleet.cp.home / "escaped").exists()
    files = {
        name: [
            f["path"] for f in json.loads(fleet.cp.provision(kind, "show", name, "--files", "--json").stdout)
        ]
        for kind, name, _ in cases
    }
    assert files == {
        "imagenet": ["a.jpg", "sub/b.jpg"],
        "mnist": ["mnist/test.idx", "mnist/train.idx"],
        "weights": ["weights.bin"],
        "code": ["model.py"],
    }


def _cache(fleet: Fleet, node: str, root: Path) -> ObjectCache:
    enrollment = Enrollment(fleet.cp.url, None, ca_certificate=fleet.cp.ca.read_text())
    cp = MinionControlPlane(enrollment)
    ident = {"node_id": fleet.node_ids[node], "node_credential": fleet.credentials[node]}
    return ObjectCache(root, ControlPlaneObjects(cp, lambda: ident))


class Tampering:
    """The real node routes, with the first answer for one chunk altered on the way (a flipped byte)."""

    def __init__(self, inner: ControlPlaneObjects) -> None:
        self.inner, self.tampered = inner, 0

    def manifest(self, object_id: str) -> bytes:
        return self.inner.manifest(object_id)

    def chunk(self, object_id: str, sha256: str) -> bytes:
        data = self.inner.chunk(object_id, sha256)
        if not self.tampered:
            self.tampered += 1
            return bytes([data[0] ^ 1]) + data[1:]
        return data


def test_a_jobs_objects_reach_only_its_nodes_and_are_checked_there(fleet: Fleet, tmp_path: Path) -> None:
    src = tree(tmp_path / "ds", {"x/data.bin": b"D" * 9_000_000, "y.txt": b"y"})
    assert fleet.cp.provision("dataset", "create", "train set", "--source", str(src)).returncode == 0
    assert fleet.cp.provision("checkpoint", "create", "ckpt", "--source", str(src / "y.txt")).returncode == 0
    # a job naming a dataset that is not there is refused at create, in one line, storing nothing
    with fleet.http() as http:
        missing = http.post(
            "/v1/jobs", json={"spec": spec("needs-data", gpus=0, data={"datasets": ["nope"]})}
        )
        assert missing.status_code == 404 and "provision dataset create nope" in missing.json()["message"]
        body = spec("reads-data", gpus=0, data={"datasets": ["train set"], "checkpoints": ["ckpt"]})
        created = http.post("/v1/jobs", json={"spec": body})
        assert created.status_code == 201, created.text
        job = http.get(f"/v1/jobs/{created.json()['id']}").json()
    node = job["workers"][0]["node"]
    assert node is not None, (job["state"], job["reason"])
    desired = fleet.heartbeat(node)
    mounts = {m["target"]: m for w in desired["workers"] if w["job_id"] == job["id"] for m in w["mounts"]}
    dataset = mounts["/opt/ml/input"]
    assert dataset["source_kind"] == "object" and dataset["name"] == "train set"
    assert mounts["/opt/ml/checkpoint"]["source_kind"] == "object"
    # the node fetches it by digest, checks every chunk (a tampered one is fetched again) and keeps it once
    cache = _cache(fleet, node, tmp_path / "cache")
    tampering = Tampering(cache.source)  # type: ignore[arg-type]
    cache.source = tampering
    where = cache.ensure(dataset["object_id"], dataset["digest"])
    assert tampering.tampered == 1
    # a bucket store answers with pre-signed URLs: the chunks come straight from moto's bucket (the first
    # one twice, as it was tampered with); the embedded store sends them through the control plane
    direct = tampering.inner.direct_bytes
    assert direct == (9_000_001 + 8 * 2**20 if fleet.store == "s3" else 0), direct  # type: ignore[attr-defined]
    manifest = Manifest.model_validate_json(tampering.inner.manifest(dataset["object_id"]))
    sha = manifest.files[0].chunks[0]
    route = CHUNK_ROUTE.format(node_id=fleet.node_ids[node], object_id=dataset["object_id"], chunk=sha)
    auth = {"Authorization": f"Bearer {fleet.credentials[node]}"}
    with fleet.cp.client() as http:
        asked, through = http.get(route, headers=auth), http.get(route + "?direct=false", headers=auth)
    assert asked.status_code == (307 if fleet.store == "s3" else 200), asked.status_code  # type: ignore[attr-defined]
    # a node that cannot reach the bucket asks for the bytes themselves (what the minion falls back to)
    assert through.status_code == 200 and hashlib.sha256(through.content).hexdigest() == sha
    assert (where / "x" / "data.bin").read_bytes() == b"D" * 9_000_000
    assert (where / "y.txt").stat().st_mode & 0o777 == 0o444
    assert cache.held() == [dataset["digest"]]
    assert cache.ensure(dataset["object_id"], dataset["digest"]) == where
    # a digest the manifest does not have is refused: nothing half-built is left to mount
    with pytest.raises(ObjectUnavailable, match="never matched its digest"):
        _cache(fleet, node, tmp_path / "other").ensure(dataset["object_id"], "sha256:" + "1" * 64)
    assert not any((tmp_path / "other").glob("[!.]*"))
    # another node has no worker of that job: the same answer as for an object that does not exist
    other = next(n for n in fleet.node_ids if n != node)
    with pytest.raises(ObjectUnavailable, match="404"):
        _cache(fleet, other, tmp_path / "c2").ensure(dataset["object_id"], dataset["digest"])
    # removing an object a live job mounts is refused with the job named; after the job, it goes
    refused = fleet.cp.provision("dataset", "remove", "train set", "--yes")
    assert refused.returncode != 0 and "reads-data" in refused.stderr, refused.stderr
    with fleet.http() as http:
        assert http.post(f"/v1/jobs/{job['id']}/stop").json()["state"] == "stopped"
    gone = fleet.cp.provision("dataset", "remove", "train set", "--yes")
    assert gone.returncode == 0, gone.stderr
    assert "dataset 'train set' removed" in gone.stdout


def test_the_bytes_are_where_the_setting_says(fleet: Fleet, s3_server: S3Server, tmp_path: Path) -> None:
    src = tree(tmp_path / "where", {"f": b"where are my bytes"})
    assert fleet.cp.provision("dataset", "create", "where", "--source", str(src)).returncode == 0
    sha = next(iter(scan(src).pieces))
    s3 = s3_server.client()
    held = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    listed = (
        s3.list_objects_v2(Bucket=BUCKET, Prefix="cp/projects/").get("Contents", []) if BUCKET in held else []
    )
    in_bucket = any(item["Key"].endswith(f"/chunks/{sha}") for item in listed)
    at_home = any((fleet.cp.home / "objects" / "projects").glob(f"*/chunks/{sha}"))
    assert (in_bucket, at_home) == ((True, False) if fleet.store == "s3" else (False, True))  # type: ignore[attr-defined]


def test_a_cloud_storage_bucket_holds_the_objects(
    storage_emulator: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RIGBASE_OBJECT_STORE=gs://…: the chunks and manifests in a Cloud Storage bucket (the emulator, through
    the real google-cloud-storage client); anonymous credentials cannot sign, so nodes read through the
    control plane."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from provisioner.adapters.object_store import GcsStore

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", storage_emulator)  # this process's clients: never Google's
    gcs = storage.Client(project="test", credentials=AnonymousCredentials())
    if not gcs.bucket("cp-objects").exists():
        gcs.create_bucket("cp-objects")
    env = {"RIGBASE_OBJECT_STORE": "gs://cp-objects/cp", "STORAGE_EMULATOR_HOST": storage_emulator}
    src = tree(tmp_path / "gs-held", {"a.bin": b"A" * 9_000_000, "b.txt": b"b"})
    with start_control_plane(tmp_path / "home", env=env) as cp:
        made = cp.provision("dataset", "create", "held", "--source", str(src))
        assert made.returncode == 0, made.stderr
        shown = json.loads(cp.provision("dataset", "show", "held", "--json").stdout)
        assert shown["state"] == "ready"
        names = {b.name for b in gcs.list_blobs("cp-objects", prefix="cp/projects/")}
        assert {n.rsplit("/", 1)[1] for n in names if "/chunks/" in n} == set(scan(src).pieces)
        assert any(n.endswith("/manifests/" + shown["digest"].removeprefix("sha256:")) for n in names)
        assert not (cp.home / "objects").exists()
    store = GcsStore("cp-objects", "cp", gcs)
    key = next(n for n in names if "/chunks/" in n).removeprefix("cp/")
    assert store.size(key) in (8 * 2**20, 9_000_000 - 8 * 2**20, 1) and store.presign(key, 60) is None
    with pytest.raises(KeyError):
        store.get("projects/none/chunks/" + "0" * 64)


def test_removing_an_object_deletes_the_chunks_nothing_else_of_the_project_names(
    fleet: Fleet, tmp_path: Path
) -> None:
    shared, first, second = b"S" * 3_000_000, b"1" * 3_000, b"2" * 3_000
    one = tree(tmp_path / "gc-1", {"shared.bin": shared, "own.bin": first})
    two = tree(tmp_path / "gc-2", {"shared.bin": shared, "own.bin": second})
    for name, src in (("gc-one", one), ("gc-two", two)):
        assert fleet.cp.provision("dataset", "create", name, "--source", str(src)).returncode == 0
    sha = {k: hashlib.sha256(v).hexdigest() for k, v in (("shared", shared), ("1", first), ("2", second))}
    project = rows(fleet, "gc-one")[0].project_id

    def held() -> set[str]:
        with fleet.sessions() as s:
            store = runtime_of(s).objects()
            return {k for k, h in sha.items() if store.has(chunk_key(project, h))}

    assert held() == {"shared", "1", "2"}
    assert fleet.cp.provision("dataset", "remove", "gc-one", "--yes").returncode == 0
    assert held() == {"shared", "2"}  # gc-two still names the shared chunk
    assert fleet.cp.provision("dataset", "remove", "gc-two", "--yes").returncode == 0
    assert held() == set()


def test_another_accounts_private_object_is_not_there(fleet: Fleet, tmp_path: Path) -> None:
    src = tree(tmp_path / "p", {"secret.txt": b"mine"})
    made = fleet.cp.provision("dataset", "create", "private", "--source", str(src))
    assert made.returncode == 0, made.stderr
    object_id = made.stdout.strip()
    with fleet.http(fleet.other_token) as http:
        assert http.get("/v1/datasets/private").status_code == 404
        assert http.get(f"/v1/datasets/{object_id}").status_code == 404
        assert all(r["name"] != "private" for r in http.get("/v1/datasets").json()["items"])
        assert http.delete(f"/v1/datasets/{object_id}").status_code == 404
        job = http.post("/v1/jobs", json={"spec": spec("theirs", gpus=0, data={"datasets": ["private"]})})
        assert job.status_code == 404, job.text
        assert http.post(f"/v1/objects/{object_id}/missing", json={"chunks": []}).status_code == 404


def test_digests_are_of_the_canonical_manifest(tmp_path: Path) -> None:
    src = tree(tmp_path / "d", {"b": b"2", "a/c": b"1"})
    manifest = scan(src).manifest
    assert manifest.digest() == "sha256:" + hashlib.sha256(manifest.canonical()).hexdigest()
    assert Manifest.model_validate_json(manifest.canonical()) == manifest
    with pytest.raises(ValueError, match="plain relative path"):
        Manifest.model_validate({"files": [{"path": "../x", "size": 0}]})
    with pytest.raises(ValueError, match="sorted"):
        Manifest.model_validate({"files": [{"path": "b", "size": 0}, {"path": "a", "size": 0}]})


def _free(fleet: Fleet) -> None:
    """Every worker the nodes were told to run reported stopped: the capacity of earlier tests' jobs
    (stopped, but held until their node says so) is free again."""
    for node in fleet.node_ids:
        told = fleet.heartbeat(node)["workers"]
        reports = [
            {
                "job_id": w["job_id"],
                "worker": w["worker"],
                "generation": w["generation"],
                "state": "stopped",
                "exit_code": 143,
                "log_eof": True,
            }
            for w in told
        ]
        if reports:
            fleet.heartbeat(node, reports)


def _outputs(fleet: Fleet, node: str) -> ControlPlaneOutputs:
    enrollment = Enrollment(fleet.cp.url, None, ca_certificate=fleet.cp.ca.read_text())
    ident = {"node_id": fleet.node_ids[node], "node_credential": fleet.credentials[node]}
    return ControlPlaneOutputs(MinionControlPlane(enrollment), lambda: ident)


def _deliver(fleet: Fleet) -> None:
    ReconcilerLoop(fleet.sessions, only=[Wake.OBJECTS], elect=False).run_once()


def test_outputs_go_up_from_their_node_and_on_where_the_spec_says(
    fleet: Fleet, s3_server: S3Server, tmp_path: Path
) -> None:
    s3 = s3_server.client()
    if "job-results" not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        s3.create_bucket(Bucket="job-results")
    secret = tmp_path / "secret"
    secret.write_text(s3_server.env()["AWS_SECRET_ACCESS_KEY"])
    secret.chmod(0o600)
    access = s3_server.env()["AWS_ACCESS_KEY_ID"]
    key = ["project", "key", "set", "default", "--kind", "aws", "-u", access, "--secret-file", str(secret)]
    assert fleet.cp.provision(*key).returncode == 0
    to_bucket = {"uri": "s3://job-results/runs", "endpoint_url": s3_server.url}
    specs = {
        "to-bucket": spec("to-bucket", gpus=0, data={"output": to_bucket}),
        "to-dataset": spec(
            "to-dataset", gpus=0, workers=2, data={"output": {"kind": "dataset", "name": "made"}}
        ),
        "to-nowhere": spec(
            "to-nowhere",
            gpus=0,
            data={"output": {"uri": "s3://no-such-results", "endpoint_url": s3_server.url}},
        ),
    }
    jobs: dict[str, dict[str, Any]] = {}
    with fleet.http() as http:
        for name, body in specs.items():
            made = http.post("/v1/jobs", json={"spec": body})
            assert made.status_code == 201, made.text
            jobs[name] = http.get(f"/v1/jobs/{made.json()['id']}").json()
    for name, job in jobs.items():
        for w in job["workers"]:
            out = tmp_path / f"{name}-{w['index']}"
            tree(
                out,
                {
                    "model.bin": bytes([w["index"]]) * 1000,
                    "logs/train.log": f"{name} {w['index']}\n".encode(),
                },
            )
            sink = _outputs(fleet, w["node"])
            other = _outputs(fleet, next(n for n in fleet.node_ids if n != w["node"]))
            with pytest.raises(OutputRefused):  # only the node the worker ran on may send its output
                upload(other, job["id"], w["index"], out)
            upload(sink, job["id"], w["index"], out)
            upload(sink, job["id"], w["index"], out)  # again, as after a restart: nothing changes
    for _ in range(outputs.FAILED_AFTER):
        _deliver(fleet)
    listed = {n: json.loads(fleet.cp.provision("job", "output", n, "--json").stdout) for n in jobs}
    assert [(r["state"], r["destination"]) for r in listed["to-bucket"]] == [
        ("delivered", "s3://job-results/runs/to-bucket.zip")
    ]
    archive = s3.get_object(Bucket="job-results", Key="runs/to-bucket.zip")["Body"].read()
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        assert zf.read("model.bin") == b"\0" * 1000 and zf.read("logs/train.log") == b"to-bucket 0\n"
    assert [(r["state"], r["destination"]) for r in listed["to-dataset"]] == [
        ("delivered", "dataset made_0"),
        ("delivered", "dataset made_1"),
    ]
    made = json.loads(fleet.cp.provision("dataset", "show", "made_1", "--json").stdout)
    assert (made["state"], made["file_count"], made["source"]) == ("ready", 2, "job:to-dataset/1")
    (failed,) = listed["to-nowhere"]
    assert failed["state"] == "failed" and "NoSuchBucket" in failed["reason"], failed
    # every output stays downloadable, checked chunk by chunk
    got = fleet.cp.provision("job", "output", "to-dataset", "--download", str(tmp_path / "got"))
    assert got.returncode == 0, got.stderr
    assert (tmp_path / "got" / "worker-1" / "model.bin").read_bytes() == b"\1" * 1000
    assert (tmp_path / "got" / "worker-0" / "logs" / "train.log").read_text() == "to-dataset 0\n"
    with fleet.http(fleet.other_token) as http:
        assert http.get(f"/v1/jobs/{jobs['to-bucket']['id']}/outputs").status_code == 404
    for job in jobs.values():
        with fleet.http() as http:
            http.post(f"/v1/jobs/{job['id']}/stop")


def test_a_specs_model_source_travels_with_the_job(fleet: Fleet, tmp_path: Path) -> None:
    tree(
        tmp_path / "project" / "code",
        {
            "train.py": b"print('train')\n",
            "lib/util.py": b"x = 1\n",
            "data/big.bin": b"\0" * 1000,  # left out by .gitignore
            "run.log": b"old\n",
            "__pycache__/train.cpython-311.pyc": b"\0",  # left out as Launch leaves it out
            ".gitignore": b"# local things\ndata/\n*.log\n",
        },
    )
    job_file = tmp_path / "project" / "job.yaml"
    body = spec("with-code", gpus=0, model={"source": "./code"})
    job_file.write_text(json.dumps(body))
    # a dry run uploads nothing
    dry = fleet.cp.provision("job", "create", "-f", str(job_file), "--dry-run")
    assert dry.returncode == 0 and "is made into a model when the job is created" in dry.stderr, dry.stderr
    made = fleet.cp.provision("job", "create", "-f", str(job_file), "-y", "--json")
    assert made.returncode == 0, made.stderr
    with fleet.http() as http:
        job = http.get(f"/v1/jobs/{json.loads(made.stdout)['id']}").json()
    name = job["spec"]["model"]["name"]
    assert name.startswith("code-") and "uploaded" in made.stderr, made.stderr
    files = json.loads(fleet.cp.provision("model", "show", name, "--files", "--json").stdout)
    assert [f["path"] for f in files] == [".gitignore", "lib/util.py", "train.py"]
    desired = fleet.heartbeat(job["workers"][0]["node"])
    mounts = [m for w in desired["workers"] if w["job_id"] == job["id"] for m in w["mounts"]]
    assert [(m["target"], m["name"]) for m in mounts] == [("/opt/ml/models", name)]
    # the same code again is the same model, not uploaded twice
    fleet.cp.provision("job", "stop", job["id"])
    again = fleet.cp.provision("job", "create", "-f", str(job_file), "-y", "--json")
    assert again.returncode == 0 and f"model {name}: ./code is already uploaded" in again.stderr
    assert json.loads(again.stdout)["spec"]["model"]["name"] == name
    fleet.cp.provision("job", "stop", json.loads(again.stdout)["id"])
    # the API names models only: a source is the CLI's to make into one
    with fleet.http() as http:
        sent = http.post("/v1/jobs", json={"spec": body})
        assert sent.status_code == 422 and "provision job create -f FILE" in sent.json()["message"]
    job_file.with_name("nocode.yaml").write_text(
        json.dumps(spec("no-code", gpus=0, model={"source": "./absent"}))
    )
    absent = fleet.cp.provision("job", "create", "-f", str(job_file.with_name("nocode.yaml")), "-y")
    assert absent.returncode != 0 and "is not a directory" in absent.stderr, absent.stderr


def test_gs_sources_and_outputs_through_cloud_storage(
    fleet: Fleet, storage_emulator: str, tmp_path: Path
) -> None:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    gcs = storage.Client(project="test", credentials=AnonymousCredentials())
    bucket = gcs.bucket("team-data")
    if not bucket.exists():
        gcs.create_bucket("team-data")
    for name, data in {"voc/a.xml": b"<a/>", "voc/img/b.jpg": b"B" * 3000, "other.txt": b"no"}.items():
        bucket.blob(name).upload_from_string(data)
    made = fleet.cp.provision(
        "dataset", "create", "voc", "--source", "gs://team-data/voc", "--wait", "--json"
    )
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["file_count"] == 2
    files = json.loads(fleet.cp.provision("dataset", "show", "voc", "--files", "--json").stdout)
    assert [f["path"] for f in files] == ["a.xml", "img/b.jpg"]
    with fleet.http() as http:
        created = http.post(
            "/v1/jobs", json={"spec": spec("to-gs", gpus=0, data={"output": {"uri": "gs://team-data/runs"}})}
        )
        assert created.status_code == 201, created.text
        job = http.get(f"/v1/jobs/{created.json()['id']}").json()
    out = tree(tmp_path / "out", {"preds.csv": b"1,0\n"})
    upload(_outputs(fleet, job["workers"][0]["node"]), job["id"], 0, out)
    _deliver(fleet)
    (row,) = json.loads(fleet.cp.provision("job", "output", "to-gs", "--json").stdout)
    assert (row["state"], row["destination"]) == ("delivered", "gs://team-data/runs/to-gs.zip"), row
    with zipfile.ZipFile(io.BytesIO(bucket.blob("runs/to-gs.zip").download_as_bytes())) as zf:
        assert zf.read("preds.csv") == b"1,0\n"
    fleet.cp.provision("job", "stop", job["id"])


def test_azure_sources_and_outputs_through_azurite(fleet: Fleet, azurite: Azurite, tmp_path: Path) -> None:
    _free(fleet)  # the nodes' capacity, held by earlier tests' stopped jobs
    container = f"team-{fleet.store}"  # type: ignore[attr-defined]
    blobs = azurite.client().create_container(container)
    for name, data in {"voc/a.xml": b"<a/>", "voc/img/b.jpg": b"B" * 3000, "other.txt": b"no"}.items():
        blobs.upload_blob(name, data)
    keys = {"default": ACCOUNT_KEY, "wrong": base64.b64encode(b"not the key" * 6).decode()}
    for name, secret in keys.items():
        path = tmp_path / name
        path.write_text(secret)
        path.chmod(0o600)
        added = fleet.cp.provision(
            "project",
            "key",
            "set",
            "default",
            "--kind",
            "azure",
            "--name",
            name,
            "-u",
            ACCOUNT,
            "--secret-file",
            str(path),
        )
        assert added.returncode == 0, added.stderr
    source = ["--source", f"azure://{ACCOUNT}/{container}/voc", "--endpoint-url", azurite.url]
    # Azurite checks the shared key's signature: a wrong key is refused, named, in one line
    refused = fleet.cp.provision("dataset", "create", "voc-wrong", *source, "--key", "wrong", "--wait")
    assert refused.returncode != 0
    assert "AuthorizationFailure with project key azure/wrong: check" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert rows(fleet, "voc-wrong")[0].state == ObjectState.FAILED
    made = fleet.cp.provision("dataset", "create", "voc-az", *source, "--wait", "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["file_count"] == 2
    files = json.loads(fleet.cp.provision("dataset", "show", "voc-az", "--files", "--json").stdout)
    assert [f["path"] for f in files] == ["a.xml", "img/b.jpg"]
    target = {"uri": f"azure://{ACCOUNT}/{container}/runs", "endpoint_url": azurite.url}
    with fleet.http() as http:
        created = http.post("/v1/jobs", json={"spec": spec("to-azure", gpus=0, data={"output": target})})
        assert created.status_code == 201, created.text
        job = http.get(f"/v1/jobs/{created.json()['id']}").json()
        no_container = {"uri": f"azure://{ACCOUNT}", "endpoint_url": azurite.url}
        bad = http.post("/v1/jobs", json={"spec": spec("bad-az", gpus=0, data={"output": no_container})})
        assert bad.status_code == 422 and "azure://ACCOUNT/CONTAINER" in bad.text, bad.text
    upload(
        _outputs(fleet, job["workers"][0]["node"]), job["id"], 0, tree(tmp_path / "out", {"p.csv": b"1\n"})
    )
    _deliver(fleet)
    (row,) = json.loads(fleet.cp.provision("job", "output", "to-azure", "--json").stdout)
    assert (row["state"], row["destination"]) == (
        "delivered",
        f"azure://{ACCOUNT}/{container}/runs/to-azure.zip",
    )
    archive = blobs.download_blob("runs/to-azure.zip").readall()
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        assert zf.read("p.csv") == b"1\n"
    fleet.cp.provision("job", "stop", job["id"])


def test_a_source_larger_than_the_quota_left_is_refused(tmp_path: Path) -> None:
    quota = {"RIGBASE_STORAGE_QUOTA_GB": "0.000004", "RIGBASE_SOURCE_NETWORKS": LOOPBACK}
    with start_control_plane(tmp_path / "home", env=quota) as cp:
        assert (
            cp.provision(
                "dataset", "create", "fits", "--source", str(tree(tmp_path / "a", {"f": b"a" * 3000}))
            ).returncode
            == 0
        )
        big = tree(tmp_path / "b", {"f": b"b" * 3000})  # 3 kB more: over the 4 kB of the quota
        refused = cp.provision("dataset", "create", "too-big", "--source", str(big))
        assert refused.returncode != 0 and "more than the 1e-06 GB left" in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        shown = json.loads(cp.provision("dataset", "show", "too-big", "--json").stdout)
        assert shown["state"] == "downloading" and shown["digest"] is None  # never marked ready
        with web_server(big) as web:
            failed = cp.provision(
                "model", "create", "web", "--source", f"{web}/f", "--wait", "--timeout", "60"
            )
        assert failed.returncode != 0 and "storage quota" in failed.stderr, failed.stderr
        # what is removed no longer counts
        assert cp.provision("dataset", "remove", "fits", "--yes").returncode == 0
        assert cp.provision("dataset", "create", "now-fits", "--source", str(big)).returncode == 0


def test_sources_and_outputs_reach_only_public_hosts_unless_the_operator_allows_a_network(
    fleet: Fleet, tmp_path: Path
) -> None:
    for host in ("127.0.0.1", "localhost", "169.254.169.254", "10.1.2.3"):
        with pytest.raises(SourceError, match="not a public address"):
            check_host(host, ())
    check_host("127.0.0.1", networks_of((LOOPBACK,)))  # the operator's own network
    with web_server(tree(tmp_path / "w", {"f": b"x"})) as web:
        cases = [
            ("metadata", "http://169.254.169.254/latest/meta-data/", "169.254.169.254 is 169.254.169.254"),
            ("hop", f"{web}/redirect/10.255.255.1/x", "10.255.255.1 is 10.255.255.1, not a public address"),
        ]
        for name, source, words in cases:
            done = fleet.cp.provision(
                "dataset", "create", name, "--source", source, "--wait", "--timeout", "60"
            )
            assert done.returncode != 0 and words in done.stderr, done.stderr


def test_a_job_gets_the_project_keys_its_spec_names_as_their_tools_variables(
    fleet: Fleet, tmp_path: Path
) -> None:
    _free(fleet)
    secret = tmp_path / "s"
    for kind, key_id, value in [("wandb", "team", "wandb-secret-1"), ("huggingface", "me", "hf_secret_2")]:
        secret.write_text(value)
        secret.chmod(0o600)
        added = fleet.cp.provision(
            "project", "key", "set", "default", "--kind", kind, "-u", key_id, "--secret-file", str(secret)
        )
        assert added.returncode == 0, added.stderr
    with fleet.http() as http:
        missing = http.post(
            "/v1/jobs",
            json={"spec": spec("no-key", gpus=0, environment={"image": "localhost/x:1", "keys": ["kaggle"]})},
        )
        assert missing.status_code == 404 and "has no kaggle key 'default'" in missing.json()["message"]
        body = spec("keyed", gpus=0, environment={"image": "localhost/x:1", "keys": ["wandb", "huggingface"]})
        made = http.post("/v1/jobs", json={"spec": body})
        assert made.status_code == 201, made.text
        job = http.get(f"/v1/jobs/{made.json()['id']}").json()
    assert "hf_secret_2" not in json.dumps(job)  # the stored spec names keys, never holds them
    (w,) = [w for w in fleet.heartbeat(job["workers"][0]["node"])["workers"] if w["job_id"] == job["id"]]
    assert (w["env"]["WANDB_API_KEY"], w["env"]["HF_TOKEN"]) == ("wandb-secret-1", "hf_secret_2")
    fleet.cp.provision("job", "stop", job["id"])


def test_a_job_waits_for_its_data_and_fails_when_the_data_does(fleet: Fleet, tmp_path: Path) -> None:
    _free(fleet)
    src = tree(tmp_path / "slow", {"a.bin": b"a" * 5000})
    local = scan(src)
    with fleet.http() as http:
        row = http.post("/v1/datasets", json={"name": "arriving", "source": str(src.resolve())}).json()
        other = http.post("/v1/datasets", json={"name": "doomed", "source": str(src.resolve())}).json()
        made = http.post(
            "/v1/jobs", json={"spec": spec("waits-for-data", gpus=0, data={"datasets": ["arriving"]})}
        )
        assert made.status_code == 201, made.text
        doomed = http.post(
            "/v1/jobs", json={"spec": spec("loses-data", gpus=0, data={"datasets": ["doomed"]})}
        )
        job = made.json()
        assert job["state"] == "waiting", job
        assert job["reason"].startswith("Waiting for data: dataset 'arriving' still downloading"), job[
            "reason"
        ]
        fleet.reconcile()
        assert http.get(f"/v1/jobs/{job['id']}").json()["state"] == "waiting"  # not placed meanwhile
        # the upload finishes: the job starts at the next pass
        for sha, piece in local.pieces.items():
            http.put(f"/v1/objects/{row['id']}/chunks/{sha}", content=piece.read())
        assert http.post(
            f"/v1/objects/{row['id']}/manifest", json=local.manifest.model_dump(mode="json")
        ).is_success
        fleet.reconcile()
        assert http.get(f"/v1/jobs/{job['id']}").json()["state"] == "starting"
    # a source that fails fails the jobs waiting for it (as the objects reconciler marks it)
    with fleet.sessions.begin() as s:
        obj = s.get(DataObject, other["id"])
        assert obj is not None
        data_objects.transition(s, obj, ObjectState.FAILED, actor="test", reason="HTTP 404")
    fleet.reconcile()
    with fleet.http() as http:
        lost = http.get(f"/v1/jobs/{doomed.json()['id']}").json()
        assert (
            lost["state"] == "failed"
            and lost["reason"] == "its data cannot be had: dataset 'doomed' is failed: HTTP 404"
        ), lost
        http.post(f"/v1/jobs/{job['id']}/stop")
        still = http.post("/v1/datasets", json={"name": "still-coming", "source": str(src.resolve())})
        assert still.status_code == 201, still.text
    # a dry run says what would fail or wait at start, one warning each, and still shows where it runs
    job_file = tmp_path / "dry.yaml"
    datasets = ["arriving", "doomed", "never-made", "still-coming"]
    job_file.write_text(json.dumps(spec("dry-data", gpus=0, data={"datasets": datasets})))
    dry = fleet.cp.provision("job", "create", "-f", str(job_file), "--dry-run")
    assert dry.returncode == 0 and "matched" in dry.stdout, dry.stdout + dry.stderr
    warnings = [line for line in dry.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        "warning: dataset 'doomed' is failed (HTTP 404): remove it and create it again",
        "warning: dataset 'never-made' does not exist in the job's project: create it with "
        "`provision dataset create never-made --source PATH|URI`, or see `provision dataset list`",
        "warning: dataset 'still-coming' is still downloading: the job waits until it is ready",
    ], dry.stderr
    made = fleet.cp.provision("job", "create", "-f", str(job_file), "-y")  # the real create refuses
    assert made.returncode == 1 and made.stderr.startswith("error: dataset 'doomed' is failed"), made.stderr
    with fleet.http() as http:
        assert "dry-data" not in {j["name"] for j in http.get("/v1/jobs").json()["items"]}


def test_an_inference_jobs_input_is_downloaded_once_for_it_and_removed_when_it_ends(
    fleet: Fleet, tmp_path: Path
) -> None:
    _free(fleet)
    with web_server(tree(tmp_path / "web", {"batch.csv": b"1,2\n3,4\n"})) as web:
        body = spec("predicts", gpus=0, type="inference", data={"input": {"uri": f"{web}/batch.csv"}})
        with fleet.http() as http:
            made = http.post("/v1/jobs", json={"spec": body})
            assert made.status_code == 201, made.text
            job_id = made.json()["id"]
            assert made.json()["reason"].startswith("Waiting for data: dataset 'predicts-input-"), made.json()
            deadline = time.monotonic() + 60
            while (job := http.get(f"/v1/jobs/{job_id}").json())["state"] == "waiting":
                assert time.monotonic() < deadline, job["reason"]
                fleet.reconcile()  # placed once the server's objects reconciler has read the input
                time.sleep(0.2)
    (w,) = [w for w in fleet.heartbeat(job["workers"][0]["node"])["workers"] if w["job_id"] == job_id]
    (mount,) = w["mounts"]
    assert (mount["target"], mount["source_kind"]) == ("/opt/ml/input", "object")
    assert w["disk_gb"] == 10 - 1  # the input counts against the worker's disk_size (whole GB)
    with fleet.sessions() as s:  # an input larger than a worker's disk fails the job, saying what to raise
        _, lost = data_objects.waiting_for(s, job_id, disk_gb=0)
    assert lost is not None and lost.endswith("it counts against: raise resources.disk_size"), lost
    files = json.loads(fleet.cp.provision("dataset", "show", mount["name"], "--files", "--json").stdout)
    assert [f["path"] for f in files] == ["batch.csv"]
    with fleet.http() as http:
        assert http.post(f"/v1/jobs/{job_id}/stop").json()["state"] == "stopped"
    _deliver(fleet)  # the objects reconciler's pass removes the inputs of ended jobs
    gone = fleet.cp.provision("dataset", "show", mount["name"])
    assert gone.returncode != 0 and "does not exist" in gone.stderr


def test_a_public_object_is_the_root_admins_to_make_and_everyones_to_read(
    fleet: Fleet, tmp_path: Path
) -> None:
    _free(fleet)
    src = tree(tmp_path / "pub", {"mnist.idx": b"m" * 100})
    with fleet.http(fleet.other_token) as http:
        refused = http.post(
            "/v1/datasets", json={"name": "theirs-public", "source": "https://example.org/x", "public": True}
        )
        assert refused.status_code == 409 and "only the root account's admins" in refused.json()["message"]
    made = fleet.cp.provision("dataset", "create", "mnist-public", "--source", str(src), "--public")
    assert made.returncode == 0, made.stderr
    with fleet.http(fleet.other_token) as http:
        listed = [r["name"] for r in http.get("/v1/datasets").json()["items"]]
        assert "mnist-public" in listed
        job = http.post(
            "/v1/jobs", json={"spec": spec("reads-public", gpus=0, data={"datasets": ["mnist-public"]})}
        )
        assert job.status_code == 201, job.text
        removal = http.delete("/v1/datasets/mnist-public")
        assert removal.status_code == 409 and "public and not this account's" in removal.json()["message"]
        http.post(f"/v1/jobs/{job.json()['id']}/stop")
