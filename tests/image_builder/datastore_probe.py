"""Run by the image's own python3 inside a guest booted from the image (test_datastores_vm.py): the minion's
own mount and container code against real NFS and SMB servers, and podman's hard disk quota on a real XFS
volume. Everything it learns is written as JSON to a raw result disk (a console line is cut at the kernel's
line length), and `RIGBASE-PROBE done` is printed on the serial console.

Standard library and the node's own site only: this file is copied onto a data disk, not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, "/usr/lib/rigbase/python")  # image_builder.wheel.NODE_SITE on the node's root

from contracts.jobs import (
    DatastoreAccess,
    Mount,
    MountSource,
    UserNamespace,
    WorkerAssignment,
)
from minion.jobs.container import RunPlan, write_env_file
from minion.jobs.mounts import MountRefused, bind_all, unbind_all
from minion.jobs.podman import Podman
from minion.settings import ContainerSettings

IMAGE = "localhost/probe-busybox"
JOB_ID = "job_0123456789abcdef"


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check)


def network_up(address: str, gateway: str) -> None:
    """No networkd under systemd.run: the probe brings up QEMU's user network itself (busybox's ip)."""
    nic = sorted(n for n in os.listdir("/sys/class/net") if n != "lo")[0]
    sh("busybox", "ip", "link", "set", "lo", "up")
    sh("busybox", "ip", "link", "set", nic, "up")
    sh("busybox", "ip", "addr", "add", address, "dev", nic)
    sh("busybox", "ip", "route", "add", "default", "via", gateway)


def podman_store(device: str) -> ContainerSettings:
    """podman's store on the XFS volume, mounted with project quotas (what --storage-opt size needs)."""
    store = Path("/srv/podman")
    store.mkdir(parents=True, exist_ok=True)
    sh("modprobe", "xfs")
    sh("mount", "-t", "xfs", "-o", "pquota", device, str(store))
    return ContainerSettings(
        network="none",
        podman_root=store / "storage",
        podman_runroot=Path("/run/probe-podman"),
        disk_quota="storage-opt",
    )


def import_busybox(settings: ContainerSettings) -> None:
    """A one-binary image from the node's own busybox: the guest reaches no registry."""
    tree = Path("/tmp/busybox-image")
    (tree / "bin").mkdir(parents=True, exist_ok=True)
    sh("cp", "/bin/busybox", str(tree / "bin/busybox"))
    for applet in ("sh", "echo", "cat", "ls", "id", "dd", "stat", "df"):
        (tree / "bin" / applet).symlink_to("busybox")
    sh("tar", "-C", str(tree), "-cf", "/tmp/busybox.tar", ".")
    sh(*Podman(settings).base(), "import", "/tmp/busybox.tar", IMAGE)


def run_job(
    settings: ContainerSettings, worker_dir: Path, a: WorkerAssignment, access: dict[str, DatastoreAccess]
) -> dict[str, Any]:
    """What the minion's worker does, minus the control plane: bind the mounts, `podman run` with the
    RunPlan's arguments, wait, read the log, unbind."""
    worker_dir.mkdir(parents=True, exist_ok=True)
    podman = Podman(settings)
    bound = bind_all(a.mounts, worker_dir, settings, access, userns=a.userns)
    try:
        plan = RunPlan(
            name=f"probe-{a.worker}",
            owner="probe",
            assignment=a,
            gpus=[],
            bound=bound,
            log_path=worker_dir / "output.log",
            env_file=worker_dir / "env",
            auth_file=worker_dir / "auth.json",
        )
        write_env_file(plan.env_file, {})
        started = time.monotonic()
        run = subprocess.run(podman.base() + plan.args(settings), capture_output=True, text=True)
        if run.returncode != 0:
            return {"started": False, "error": run.stderr.strip()[-2000:]}
        code = sh(*podman.base(), "wait", plan.name).stdout.strip()
        log = plan.log_path.read_text(errors="replace") if plan.log_path.exists() else ""
        sh(*podman.base(), "rm", "-f", plan.name, check=False)
        return {"started": True, "exit_code": int(code), "log": log, "seconds": time.monotonic() - started}
    finally:
        unbind_all(worker_dir)


def assignment(worker: int, command: str, mounts: list[Mount], disk_gb: int = 0) -> WorkerAssignment:
    return WorkerAssignment(
        job_id=JOB_ID,
        job_name="probe",
        worker=worker,
        generation="g1",
        image=IMAGE,
        command=command,
        cpus=1,
        memory_mb=256,
        disk_gb=disk_gb,
        mounts=mounts,
        userns=UserNamespace.of_slot(3),  # a customer's job: its container root is no uid of the node's
    )


def datastore(name: str, path: str, target: str, read_only: bool = False) -> Mount:
    return Mount(
        source_kind=MountSource.DATASTORE, datastore=name, path=path, target=target, read_only=read_only
    )


def main() -> dict[str, Any]:
    cfg = json.loads(Path(sys.argv[1]).read_text())
    network_up(cfg["guest_address"], cfg["gateway"])
    # a node's podman uses systemd's cgroup manager over D-Bus; systemd.run boots only to basic.target
    sh("systemctl", "start", "dbus.socket", "dbus.service")
    access = {d["name"]: DatastoreAccess.model_validate(d) for d in cfg["datastores"]}
    settings = podman_store(cfg["xfs_device"])
    import_busybox(settings)
    userns = UserNamespace.of_slot(3)
    out: dict[str, Any] = {"userns": [userns.first, userns.size]}

    # 1. One job with three datastore mounts: output on the all_squash NFS export, data on the SMB share,
    #    and a path through a server-side symlink that points at /etc
    job = assignment(
        0,
        # `;`, not `&&`: each part is its own finding (exit_code is the last part's)
        "cat /proc/self/uid_map > /opt/ml/output/uid_map.txt; echo from-the-job > /opt/ml/output/result.txt; "
        "cat /data/input.txt; echo written-over-smb > /data/from-job.txt; "
        "echo marker: $(cat /in/marker.txt); ls /in",
        [
            datastore("out", "/jobs/j1", "/opt/ml/output"),
            datastore("office", "/data", "/data"),
            datastore("out", "/escape", "/in", read_only=True),
        ],
    )
    out["job"] = run_job(settings, Path("/var/lib/rigbase/jobs/probe/0"), job, access)

    # 2. The same path through a relative link that climbs above the root
    climb = assignment(1, "cat /in/marker.txt", [datastore("out", "/up/up/etc", "/in", read_only=True)])
    out["climb"] = run_job(settings, Path("/var/lib/rigbase/jobs/probe/1"), climb, access)

    # 3. Output on an export that squashes root only: the job's uid cannot be given the directory
    squashed = assignment(2, "true", [datastore("squashed", "/jobs", "/opt/ml/output")])
    try:
        out["root_squash"] = run_job(settings, Path("/var/lib/rigbase/jobs/probe/2"), squashed, access)
    except MountRefused as exc:
        out["root_squash"] = {"refused": str(exc)}

    # 4. podman's hard quota: a worker with disk_gb 1 writes 1.5 GiB to its own container disk
    quota = assignment(3, "dd if=/dev/zero of=/big bs=1M count=1536; echo dd-exit $?", [], disk_gb=1)
    out["quota"] = run_job(settings, Path("/var/lib/rigbase/jobs/probe/3"), quota, access)

    # what is still mounted afterwards: the staging roots, never a job's binds
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    out["left_binds"] = [m.split()[4] for m in mounts if "/var/lib/rigbase/jobs/" in m.split()[4]]
    out["staged"] = sorted(m.split()[4] for m in mounts if "/run/rigbase/datastores/" in m.split()[4])
    return out


if __name__ == "__main__":
    try:
        result = main()
    except Exception:
        result = {"crashed": traceback.format_exc()}
    with open(sys.argv[2], "wb") as disk:
        disk.write(json.dumps(result).encode())
        disk.flush()
        os.fsync(disk.fileno())
    print("RIGBASE-PROBE done", flush=True)
