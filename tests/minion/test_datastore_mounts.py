"""Datastore mounts: NFS v4 / SMB specifications, the 0600 credentials file, and real bind mounts.

The kernel here has neither the nfs/nfs4 nor the cifs filesystem (see /proc/filesystems, no loadable
modules), so stage 1 (mounting the server's root) is tested as a specification plus a real mount(8)
call that fails cleanly (in an empty network namespace, so it fails on a kernel with cifs too);
stage 2 (binding the job path inside the mounted root) runs for real in a private mount namespace.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from contracts.errors import InvalidInput
from minion.datastores import mounts
from minion.datastores.mounts import DatastoreMount, credentials_file, root_mount_spec

REPO = Path(__file__).resolve().parents[2]
NAS = DatastoreMount("nas", "nfs", "nas.lan", "/dir2")
SHARE = DatastoreMount(
    "share", "smb", "files.lan", "/team/dir2", username="jobs", password="s3cret,with=odd;chars"
)


def test_nfs_spec_mounts_the_root_with_v4_options(tmp_path: Path) -> None:
    spec = root_mount_spec(NAS, tmp_path / "stage")
    assert (spec.source, spec.fstype, spec.credentials) == ("nas.lan:/dir2", "nfs4", None)
    assert {"vers=4", "hard", "nosuid", "nodev"} <= set(spec.options)
    assert spec.argv() == [
        "mount",
        "-t",
        "nfs4",
        "-o",
        ",".join(spec.options),
        "nas.lan:/dir2",
        str(tmp_path / "stage"),
    ]


def test_smb_spec_keeps_the_password_off_the_command_line(tmp_path: Path) -> None:
    spec = root_mount_spec(SHARE, tmp_path / "stage")
    assert (spec.source, spec.fstype) == ("//files.lan/team/dir2", "cifs")
    argv = spec.argv(tmp_path / "cred")
    assert f"credentials={tmp_path / 'cred'}" in argv[4]
    assert not any("s3cret" in a for a in argv) and "s3cret" not in repr(SHARE)
    with pytest.raises(ValueError):
        spec.argv()  # an SMB mount without its credentials file is a programming error


def test_credentials_file_is_0600_from_creation_and_removed(tmp_path: Path) -> None:
    spec = root_mount_spec(SHARE, tmp_path / "stage")
    with credentials_file(spec.credentials or "", tmp_path / "creds") as path:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert path.read_text() == "username=jobs\npassword=s3cret,with=odd;chars\n"
    assert not path.exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"type": "smb", "root": "/share"}, "needs --username"),
        ({"type": "nfs", "root": "/x", "username": "u", "password": "p"}, "takes no credentials"),
        ({"type": "smb", "root": "/", "username": "u", "password": "p"}, "share name"),
        ({"type": "nfs", "root": "relative"}, "absolute"),
        ({"type": "nfs", "root": "/a/../b"}, r"'\.\.'"),
        ({"type": "smb", "root": "/s", "username": "u", "password": "p\nusername=root"}, "one line"),
    ],
)
def test_bad_datastores_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        DatastoreMount(name="d", address="h", **kwargs)


def test_failed_smb_mount_reports_and_leaves_no_credentials(tmp_path: Path) -> None:
    """A real mount(8) call that fails on any kernel: without cifs it is refused outright, with cifs the
    server is unreachable from the empty network namespace (-n). The credentials file must be gone."""
    creds = tmp_path / "creds"
    proc = subprocess.run(
        [
            "unshare",
            "-m",
            "-n",
            "--propagation",
            "private",
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from minion.datastores.mounts import *\n"
            f"from tests.minion.test_datastore_mounts import SHARE\n"
            f"try: mount_root(SHARE, Path({str(tmp_path / 'stage')!r}), Path({str(creds)!r}))\n"
            "except Exception as e: print(type(e).__name__, e); sys.exit(3)",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
    )
    assert proc.returncode == 3 and proc.stdout.startswith("Unavailable"), proc.stdout + proc.stderr
    assert creds.is_dir() and list(creds.iterdir()) == []


BIND_SCRIPT = """
import json, os, sys
from pathlib import Path
from minion.datastores.mounts import bind_job_path, is_mountpoint, umount
from contracts.errors import RigbaseError
stage, mnt = Path(sys.argv[1]), Path(sys.argv[2])
out = {}
for name, requested in [("job", "/sub"), ("evil", "/evil"), ("up", "/up/sub")]:
    try:
        rel = bind_job_path(stage, requested, mnt / name)
        out[name] = {"rel": str(rel), "files": sorted(os.listdir(mnt / name))}
    except RigbaseError as e:
        out[name] = {"error": type(e).__name__}
umount(mnt / "job"); umount(mnt / "job")  # idempotent
out["unmounted"] = not is_mountpoint(mnt / "job")
print(json.dumps(out))
"""


def test_job_path_bind_mount_in_a_private_mount_namespace(tmp_path: Path) -> None:
    stage = tmp_path / "stage"  # stands in for the mounted datastore root
    (stage / "sub").mkdir(parents=True)
    (stage / "sub" / "data.csv").write_text("x")
    (stage / "etc").mkdir()
    (stage / "etc" / "inside-the-datastore").write_text("")
    os.symlink("/etc", stage / "evil")  # absolute: must land in the datastore's etc, not the node's
    os.symlink("../../../..", stage / "up")
    proc = subprocess.run(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            sys.executable,
            "-c",
            BIND_SCRIPT,
            str(stage),
            str(tmp_path / "mnt"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["job"] == {"rel": "/sub", "files": ["data.csv"]}
    assert out["evil"] == {"rel": "/etc", "files": ["inside-the-datastore"]}
    assert out["up"] == {"rel": "/sub", "files": ["data.csv"]}
    assert out["unmounted"]
    assert not mounts.is_mountpoint(tmp_path / "mnt" / "job")  # nothing leaked into the host namespace
