"""A customer's data in the local lab, for real (docs/data.md): a dataset read by the control plane from a
bucket of moto's S3 server with the project's aws key, a model cloned from a git repository served by
`git http-backend`, both mounted into a job's podman container on a lab node, which the node's minion
fetched by digest over its outbound connection. A second job on the same dataset uses the node's copy:
the object is not fetched again."""

from __future__ import annotations

import hashlib
import io
import json
import time
import zipfile
from pathlib import Path

from tests.fixtures.s3 import S3Server
from tests.provisioner.test_data_objects import bare_repo, web_server
from tests.provisioner.test_lab import (  # noqa: F401 - the fixtures are used by name
    cached_lab_home,
    lab_home,
    rootfs_cache,
)
from tests.provisioner.test_lab_jobs import JOB_TIMEOUT_S, _ok, _wait_state

IMAGE = "localhost/rigbase-lab:latest"
READER = (
    "cat /opt/ml/input/labels.txt; sha256sum /opt/ml/input/train/batch.bin | cut -c1-16; "
    "python3 /opt/ml/models/model.py; ls /opt/ml/output && echo output is empty; "
    "touch /opt/ml/input/x 2>/dev/null || echo input is read-only; "
    "mkdir /opt/ml/output/logs; echo 1 > /opt/ml/output/logs/a; "
    'echo "$RIGBASE_JOB_NAME" > /opt/ml/output/result.txt'
)


def _spec(home: Path, name: str, s3: str) -> Path:
    path = home / f"{name}.yaml"
    path.write_text(
        f"name: {name}\ntype: training\nresources: {{gpu_types: [RTX A6000], gpu_count: 1}}\n"
        f"workers: [{READER!r}]\nenvironment: {{image: {IMAGE}}}\nmodel: {{name: code}}\n"
        f"data: {{datasets: [cifar], output: {{uri: 's3://lab-results/runs', endpoint_url: '{s3}'}}}}\n"
    )
    return path


def _delivered(home: Path, name: str) -> dict[str, object]:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while (
        not (rows := json.loads(_ok(home, "job", "output", name, "--json"))) or rows[0]["state"] == "pending"
    ):
        assert time.monotonic() < deadline, f"the output of {name} was not delivered: {rows}"
        time.sleep(0.5)
    return dict(rows[0])


def test_a_job_reads_a_dataset_from_s3_and_a_model_from_git_on_a_lab_node(
    cached_lab_home: Path,  # noqa: F811
    s3_server: S3Server,
    tmp_path: Path,
) -> None:
    home = cached_lab_home
    batch = bytes(range(256)) * 50_000  # 12.8 MB: two chunks
    s3 = s3_server.client()
    s3.create_bucket(Bucket="lab-training-data")
    s3.create_bucket(Bucket="lab-results")
    s3.put_object(Bucket="lab-training-data", Key="cifar/labels.txt", Body=b"airplane,automobile,bird\n")
    s3.put_object(Bucket="lab-training-data", Key="cifar/train/batch.bin", Body=batch)
    web = tmp_path / "web"
    code = {"model.py": "print('model code from git, tag v1')\n"}
    bare_repo(tmp_path / "src", code, "v1", web / "model.git")

    _ok(home, "lab", "up", "--nodes", "1", timeout=300)
    _ok(home, "node", "maintenance", "node-1", "off")
    secret = tmp_path / "aws.secret"
    secret.write_text(s3_server.env()["AWS_SECRET_ACCESS_KEY"])
    secret.chmod(0o600)
    access = s3_server.env()["AWS_ACCESS_KEY_ID"]
    _ok(home, "project", "key", "set", "default", "--kind", "aws", "-u", access, "--secret-file", str(secret))
    source = ["--source", "s3://lab-training-data/cifar", "--endpoint-url", s3_server.url]
    _ok(home, "dataset", "create", "cifar", *source, "--wait", timeout=120)
    with web_server(web) as url:
        _ok(home, "model", "create", "code", "--source", f"git+{url}/git/model.git@v1", "--wait", timeout=120)

    expected = [
        "airplane,automobile,bird",
        hashlib.sha256(batch).hexdigest()[:16],
        "model code from git, tag v1",
        "output is empty",
        "input is read-only",
    ]
    _ok(home, "job", "create", "-f", str(_spec(home, "reads-cifar", s3_server.url)), "-y")
    logs = _ok(home, "job", "logs", "reads-cifar", "--follow", timeout=JOB_TIMEOUT_S)
    assert logs.splitlines() == expected, logs
    assert _wait_state(home, "reads-cifar", {"succeeded", "failed"})["state"] == "succeeded"

    # its /opt/ml/output went up from the node when it ended, and on to the bucket as JOB.zip
    out = _delivered(home, "reads-cifar")
    assert (out["state"], out["destination"], out["file_count"]) == (
        "delivered",
        "s3://lab-results/runs/reads-cifar.zip",
        2,
    ), out
    archive = s3.get_object(Bucket="lab-results", Key="runs/reads-cifar.zip")["Body"].read()
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        assert sorted(zf.namelist()) == ["logs/a", "result.txt"]
        assert zf.read("result.txt") == b"reads-cifar\n"
    _ok(home, "job", "output", "reads-cifar", "--download", str(tmp_path / "got"))
    assert (tmp_path / "got" / "result.txt").read_text() == "reads-cifar\n"

    # the node holds each object once; a second job on the same dataset does not fetch it again
    (cache,) = list(home.glob("lab/nodes/node-1/cache/objects"))
    held = sorted(p for p in cache.iterdir() if not p.name.startswith("."))
    assert len(held) == 2, held
    before = {p: p.stat().st_ino for p in held}
    _ok(home, "job", "create", "-f", str(_spec(home, "reads-cifar-again", s3_server.url)), "-y")
    again = _ok(home, "job", "logs", "reads-cifar-again", "--follow", timeout=JOB_TIMEOUT_S)
    assert again.splitlines() == expected
    assert {p: p.stat().st_ino for p in held} == before
    assert sorted(p for p in cache.iterdir() if not p.name.startswith(".")) == held

    _ok(home, "lab", "down", "--yes", timeout=120)


def test_a_central_regions_storage_node_caches_the_data_its_compute_node_mounts(
    cached_lab_home: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """`lab up --devices 1` makes region `lab` central with node-1 its storage node: node-1's minion fetches
    the job's dataset into the region's cache, and node-2's worker mounts that copy (the lab's stand-in for
    the NFS export) without fetching it itself; so does device-1's inference container with the public
    model its configuration names."""
    home = cached_lab_home
    _ok(home, "lab", "up", "--nodes", "2", "--devices", "1", timeout=600)
    _ok(home, "node", "maintenance", "node-2", "off")
    src = tmp_path / "frames"
    src.mkdir()
    frames = bytes(range(256)) * 40_000  # 10 MB: two chunks
    (src / "frames.bin").write_bytes(frames)
    _ok(home, "dataset", "create", "frames", "--source", str(src), timeout=120)
    digest = json.loads(_ok(home, "dataset", "show", "frames", "--json"))["digest"]
    spec = home / "central.yaml"
    spec.write_text(
        f"name: central\ntype: training\nresources: {{gpu_types: [RTX A6000], gpu_count: 1}}\n"
        f"workers: ['sha256sum /opt/ml/input/frames.bin | cut -c1-16']\nenvironment: {{image: {IMAGE}}}\n"
        "data: {datasets: [frames]}\n"
    )
    _ok(home, "job", "create", "-f", str(spec), "-y")
    logs = _ok(home, "job", "logs", "central", "--follow", timeout=JOB_TIMEOUT_S)
    assert logs.splitlines() == [hashlib.sha256(frames).hexdigest()[:16]], logs
    job = _wait_state(home, "central", {"succeeded", "failed"})
    assert job["state"] == "succeeded" and job["workers"][0]["node"] == "node-2", job
    storage = json.loads(_ok(home, "node", "show", "node-1", "--json"))["object_cache"]
    assert storage["role"] == "region" and digest in storage["held"], storage
    compute = json.loads(_ok(home, "node", "show", "node-2", "--json"))["object_cache"]
    assert compute["role"] == "shared" and compute["fetching"] == [], compute
    held = home / "lab" / "nodes" / "node-1" / "cache" / "objects" / digest.removeprefix("sha256:")
    assert (held / "frames.bin").read_bytes() == frames
    assert not (home / "lab" / "nodes" / "node-2" / "cache" / "objects").exists()  # it fetched nothing

    # a device's configuration names a public model: the storage node caches it, the device mounts it
    weights = tmp_path / "detector"
    weights.mkdir()
    (weights / "weights.txt").write_text("detector weights v3\n")
    _ok(home, "model", "create", "detector", "--source", str(weights), "--public", timeout=120)
    config = ["--region", "lab", "--image", IMAGE, "--model", "detector"]
    _ok(home, "device-config", "add", "detect", *config, "--command", "cat /opt/ml/model/weights.txt; exit 0")
    _ok(home, "device", "set-config", "device-1", "detect")
    _ok(home, "device", "deploy", "device-1")
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while (shown := json.loads(_ok(home, "device", "status", "device-1", "--json")))[
        "inference_status"
    ] not in ("exited", "failed"):
        assert time.monotonic() < deadline, shown
        time.sleep(1)
    assert (shown["inference_status"], shown["last_lines"]) == ("exited", "detector weights v3"), shown
    model = json.loads(_ok(home, "model", "show", "detector", "--json"))["digest"]
    deadline = time.monotonic() + 30  # its next beat reports what it fetched
    while (
        model
        not in (storage := json.loads(_ok(home, "node", "show", "node-1", "--json"))["object_cache"])["held"]
    ):
        assert time.monotonic() < deadline, storage
        time.sleep(0.5)
    assert not (home / "lab" / "nodes" / "device-1" / "cache" / "objects").exists()
    _ok(home, "lab", "down", "--yes", timeout=120)
