"""tests/fixtures/leftovers.py: a session stops what an earlier run killed outright left in its basetemp."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_a_session_stops_the_processes_an_earlier_run_left_in_its_basetemp(tmp_path: Path) -> None:
    basetemp = tmp_path / "basetemp"
    (basetemp / "test_vm0").mkdir(parents=True)
    sleep = [sys.executable, "-c", "import time; time.sleep(300)"]
    # a guest of the killed run, naming its disk inside the basetemp; and a process that only names a
    # sibling with the same prefix, which is not inside it
    left = subprocess.Popen([*sleep, str(basetemp / "test_vm0" / "disk.img")], start_new_session=True)
    other = subprocess.Popen([*sleep, f"{basetemp}-other/disk.img"], start_new_session=True)
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    try:
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.fixtures.leftovers"]
            + [f"--basetemp={basetemp}", "--rootdir", str(tmp_path), str(tmp_path / "test_one.py")],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        assert left.wait(10) is not None
        assert f"stopped 1 processes an earlier run left in {basetemp}/: [{left.pid}]" in run.stdout
        assert other.poll() is None
    finally:
        for proc in (left, other):
            if proc.poll() is None:
                proc.kill()
