"""A podman stuck in the kernel does not hold the minion's heartbeat (minion/jobs/podman.py `call`).

The jobs handler runs inside every heartbeat. A podman call that times out is killed, but a process asleep
in the kernel (uninterruptible I/O: slow storage after an unclean reset, seen on a TCG node) dies only when
its I/O ends, and subprocess.run waited for that without a bound: the minion sat there until its watchdog
aborted it, with no heartbeat and no quote meanwhile. Made real here with a frozen filesystem (fsfreeze): a
process writing to it sleeps uninterruptibly, and SIGKILL takes effect only when it is thawed."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from minion.jobs.podman import Podman, PodmanError
from minion.settings import ContainerSettings


def _state(pid: int) -> str:
    """The process's state letter (R, S, D, Z …) from /proc/PID/stat."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def frozen(tmp_path: Path) -> Iterator[Path]:
    """A small ext4 filesystem, loop-mounted and frozen; thawed and unmounted afterwards."""
    image, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["truncate", "-s", "16M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", str(image)], check=True)
    mounted = subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"this machine cannot loop-mount a filesystem: {mounted.stderr.strip()}")
    try:
        subprocess.run(["fsfreeze", "-f", str(mnt)], check=True)
        yield mnt
    finally:
        subprocess.run(["fsfreeze", "-u", str(mnt)], capture_output=True)
        # the killed writer ends once thawed, but may still hold the mount busy for a moment
        for _ in range(50):
            if subprocess.run(["umount", str(mnt)], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        else:
            subprocess.run(["umount", str(mnt)], check=True)


def test_a_podman_stuck_in_the_kernel_is_given_up_on_while_it_still_sleeps(
    tmp_path: Path, frozen: Path
) -> None:
    # a `podman` that records its pid, then blocks in the kernel writing to the frozen filesystem
    stuck = tmp_path / "podman"
    pid_file = tmp_path / "pid"
    stuck.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sh -c 'echo x > {frozen / 'f'}'\n")
    stuck.chmod(0o755)
    # the test's own bound: thaw after 30 s, so an unbounded wait (the old code) ends and the test fails
    thaw = threading.Timer(30, subprocess.run, (["fsfreeze", "-u", str(frozen)],), {"capture_output": True})
    thaw.start()
    try:
        with pytest.raises(PodmanError, match="podman ps did not answer in 1 s"):
            Podman(ContainerSettings(podman=str(stuck))).call(["ps"], timeout=1)
        pid = int(pid_file.read_text())
        # the call gave up while the killed podman still slept in the kernel: it did not wait for its end
        assert _state(pid) == "D", _state(pid)
    finally:
        thaw.cancel()


def _scripted_podman(tmp_path: Path, first_error: str) -> tuple[Podman, Path]:
    """A `podman` whose first `rm` fails with `first_error` and whose later ones succeed; it logs calls."""
    calls = tmp_path / "calls"
    script = tmp_path / "podman"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        f'if [ "$(wc -l < {calls})" -eq 1 ]; then echo "Error: {first_error}" >&2; exit 125; fi\n'
    )
    script.chmod(0o755)
    return Podman(ContainerSettings(podman=str(script))), calls


def test_podmans_ebusy_race_on_remove_is_retried_and_other_errors_are_not(tmp_path: Path) -> None:
    # podman's own message for the race (containers/podman#11594), which no test can provoke at will
    shm = "/var/lib/containers/storage/overlay-containers/c/userdata/shm"
    busy, other = tmp_path / "busy", tmp_path / "other"
    busy.mkdir(), other.mkdir()
    podman, calls = _scripted_podman(busy, f"1 error occurred:\n\t* unlinkat {shm}: device or resource busy")
    podman.remove("job-x-0")
    assert calls.read_text().splitlines() == ["rm --force --ignore --time 0 job-x-0"] * 2

    podman, calls = _scripted_podman(other, "no such object")
    with pytest.raises(PodmanError, match="no such object"):
        podman.remove("job-x-0")
    assert len(calls.read_text().splitlines()) == 1
