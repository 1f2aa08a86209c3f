"""The minion's finalize around the play: the bundle's digest, apply-saved at boot, a killed run, and the
desired-state handler against a real HTTP server on loopback that serves the bundle and takes the reports.
The plays run for real in a clone of the cached lab root (see test_finalize.py)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from contracts.finalize import BUNDLE_ROUTE, REPORT_ROUTE, FinalizeReport
from minion.finalize.agent import FinalizeAgent
from minion.finalize.apply import apply_work
from minion.finalize.paths import FinalizePaths
from minion.join.client import ControlPlane, Enrollment
from tests.minion.finalize_helpers import BUNDLE, base_root, root, tree, work

__all__ = ["base_root", "root"]  # fixtures

pytestmark = pytest.mark.slow
MINION = [sys.executable, "-m", "minion.cli"]
CREDENTIAL = "node-credential"


def minion(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIGBASE_")} | {"TSS2_LOG": "all+none"}
    return subprocess.run(
        [*MINION, "finalize", *args, "--state-dir", str(state)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_a_bundle_with_another_digest_fails_with_one_line_and_unpacks_nothing(tmp_path: Path) -> None:
    paths = FinalizePaths(tmp_path / "state")
    tampered = BUNDLE.data + b"\0"
    result = apply_work(work(), tampered, paths, host_root=None)
    outcome = result.outcome
    assert not outcome.ok and outcome.failed_task is None
    got = hashlib.sha256(tampered).hexdigest()
    assert outcome.message == f"playbook bundle digest mismatch: expected {BUNDLE.digest} got {got}"
    assert not paths.bundle_dir(BUNDLE.digest).exists() and not paths.saved_work.exists()


def test_apply_saved_with_nothing_saved_exits_0(tmp_path: Path) -> None:
    done = minion("apply-saved", state=tmp_path / "state")
    assert done.returncode == 0, done.stderr
    assert "nothing to apply" in done.stdout


def test_apply_saved_reapplies_offline_and_is_idempotent(root: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    (tmp_path / "work.json").write_text(work().model_dump_json())
    (tmp_path / "bundle.tgz").write_bytes(BUNDLE.data)
    first = minion(
        "apply",
        str(tmp_path / "work.json"),
        str(tmp_path / "bundle.tgz"),
        "--host-root",
        str(root),
        state=state,
    )
    assert first.returncode == 0, first.stderr
    configured = tree(root / "etc/rigbase")
    # a reboot: the tmpfs overlay over /etc is gone, the state partition is not
    for name in ("scratch.yaml", "storage.yaml", "minion.yaml"):
        (root / "etc/rigbase" / name).unlink()
    (tmp_path / "bundle.tgz").unlink()
    boot = minion("apply-saved", "--host-root", str(root), state=state)  # no control plane anywhere
    assert boot.returncode == 0, boot.stderr
    assert tree(root / "etc/rigbase") == configured
    outcome = json.loads(boot.stdout.strip().splitlines()[-1])
    assert outcome["ok"] and outcome["changed"] > 0
    again = minion("apply-saved", "--host-root", str(root), state=state)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout.strip().splitlines()[-1])["changed"] == 0
    # the boot's runs leave out what lives on the drives (runner.BOOT_SKIP_TAGS); `apply` runs everything
    runs = sorted((state / "finalize/runner/artifacts").iterdir())
    commands = [json.loads((run / "command").read_text())["command"] for run in runs]
    assert [c[c.index("--skip-tags") + 1] if "--skip-tags" in c else None for c in commands] == [
        None,
        "disk-setup",
        "disk-setup",
    ]


def test_a_saved_bundle_that_was_altered_is_refused(root: Path, tmp_path: Path) -> None:
    paths = FinalizePaths(tmp_path / "state")
    assert apply_work(work(), BUNDLE.data, paths, host_root=root).outcome.ok
    paths.saved_bundle.write_bytes(BUNDLE.data + b"x")
    done = minion("apply-saved", "--host-root", str(root), state=tmp_path / "state")
    assert done.returncode == 1
    assert "playbook bundle digest mismatch" in done.stderr


def _playbooks(state: Path) -> str:
    return subprocess.run(
        ["pgrep", "-f", f"ansible-playbook.*{state}"], capture_output=True, text=True
    ).stdout


def test_a_run_killed_mid_play_converges_when_run_again(root: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    (tmp_path / "work.json").write_text(work().model_dump_json())
    (tmp_path / "bundle.tgz").write_bytes(BUNDLE.data)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIGBASE_")}
    proc = subprocess.Popen(
        [*MINION, "finalize", "apply", str(tmp_path / "work.json"), str(tmp_path / "bundle.tgz"),
         "--state-dir", str(state), "--host-root", str(root)],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        event = json.loads(line)
        seen.append(event)
        if event.get("task") == "Write /etc/hostname" and event.get("status") == "changed":
            break
    proc.send_signal(signal.SIGKILL)  # the minion dies mid-play
    proc.wait()
    assert seen[-1]["task"] == "Write /etc/hostname", seen
    assert not (root / "etc/rigbase/minion.yaml").exists()
    assert not (state / "finalize/saved/work.json").exists()

    rerun = apply_work(work(), BUNDLE.data, FinalizePaths(state), host_root=root)
    assert rerun.outcome.ok, rerun
    assert (root / "etc/rigbase/minion.yaml").is_file()
    assert not (state / "finalize/playbook.pid").exists()
    assert _playbooks(state).strip() == ""  # nothing of the killed run races the re-run
    again = apply_work(work(), BUNDLE.data, FinalizePaths(state), host_root=root)
    assert again.outcome.ok and again.outcome.changed == 0


def test_a_leftover_playbook_is_stopped_before_a_rerun(tmp_path: Path) -> None:
    from minion.finalize.process import record_pid, stop_leftover

    leftover = subprocess.Popen(["sleep", "300"], start_new_session=True)
    pid_file = tmp_path / "pid"
    record_pid(pid_file, leftover.pid)
    assert stop_leftover(pid_file)
    assert leftover.wait(timeout=10) == -signal.SIGTERM
    assert not pid_file.exists()
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    pid_file.write_text(f"{other.pid} 1\n")  # a recycled pid: same number, another start time
    assert not stop_leftover(pid_file)
    time.sleep(0.2)
    assert other.poll() is None
    other.kill()
    other.wait()


# -- the desired-state handler against a real HTTP server -------------------------------------------------


class FakeControlPlane(ThreadingHTTPServer):
    bundle: bytes = BUNDLE.data
    reports: list[FinalizeReport]
    auth: list[str]


class Handler(BaseHTTPRequestHandler):
    server: FakeControlPlane

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.server.auth.append(self.headers.get("Authorization", ""))
        if self.path != BUNDLE_ROUTE.format(digest=BUNDLE.digest):
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.server.bundle)))
        self.end_headers()
        self.wfile.write(self.server.bundle)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        assert self.path == REPORT_ROUTE.format(node_id="node-1")
        self.server.reports.append(FinalizeReport.model_validate_json(body))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")


@pytest.fixture
def control_plane() -> Iterator[FakeControlPlane]:
    server = FakeControlPlane(("127.0.0.1", 0), Handler)
    server.reports, server.auth = [], []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _agent(server: FakeControlPlane, state: Path, host_root: Path | None) -> FinalizeAgent:
    cp = ControlPlane(Enrollment(f"http://127.0.0.1:{server.server_address[1]}", None))
    node = {"node_id": "node-1", "node_credential": CREDENTIAL}
    return FinalizeAgent(cp=cp, node=node, paths=FinalizePaths(state), host_root=host_root)


def _settle(agent: FinalizeAgent, value: dict[str, Any]) -> dict[str, Any]:
    actual = agent.handle(value)  # starts the run in the background; the heartbeat is not held up
    assert actual["running"] in (value["generation"], None) and actual["generation"] is None
    assert agent.thread is not None
    agent.thread.join(timeout=300)
    return agent.handle(value)


def test_the_handler_runs_a_new_generation_once_and_reports_it(
    control_plane: FakeControlPlane, root: Path, tmp_path: Path
) -> None:
    w = work().model_dump(mode="json")
    agent = _agent(control_plane, tmp_path / "state", root)
    actual = _settle(agent, w)
    assert (
        actual["state"] == "applied" and actual["generation"] == w["generation"] and actual["running"] is None
    )
    assert actual["facts"]["scratch"]["mountpoint"] == "/scratch"
    assert control_plane.auth == [f"Bearer {CREDENTIAL}"]
    reports = control_plane.reports
    assert all(r.generation == w["generation"] for r in reports)
    assert [r.outcome is not None for r in reports].count(True) == 1 and reports[-1].outcome is not None
    assert reports[-1].outcome.ok and reports[-1].facts
    tasks = [e.task for r in reports for e in r.events]
    assert "Write the minion configuration" in tasks
    # the same generation again: nothing runs, nothing is posted
    posted = len(reports)
    assert agent.handle(w)["state"] == "applied" and agent.thread is not None and not agent.thread.is_alive()
    assert len(control_plane.reports) == posted
    # a restarted minion knows what it applied (the saved work)
    assert _agent(control_plane, tmp_path / "state", root).handle(w)["state"] == "applied"


def test_the_handler_reports_a_digest_mismatch_as_a_failed_outcome_without_a_task(
    control_plane: FakeControlPlane, tmp_path: Path
) -> None:
    control_plane.bundle = BUNDLE.data + b"tampered"
    w = work().model_dump(mode="json")
    (tmp_path / "root").mkdir()  # a lab root: the bundle is refused before anything looks inside
    agent = _agent(control_plane, tmp_path / "state", tmp_path / "root")
    actual = _settle(agent, w)
    assert actual["state"] == "failed" and actual["generation"] is None
    assert actual["message"].startswith(f"playbook bundle digest mismatch: expected {BUNDLE.digest} got ")
    [report] = control_plane.reports
    assert report.events == [] and report.outcome is not None
    assert not report.outcome.ok and report.outcome.failed_task is None
    assert report.outcome.message == actual["message"] and "\n" not in report.outcome.message
    assert not (tmp_path / "state/finalize/bundles").exists()
    # a failed generation is not retried by itself; a new one (operator retry) is
    assert agent.handle(w)["state"] == "failed" and len(control_plane.reports) == 1


def test_a_machine_that_is_not_a_node_is_never_finalized_in_place(
    control_plane: FakeControlPlane, tmp_path: Path
) -> None:
    # this test machine: no --host-root and no rigbase image marker; the play would rename it
    assert not Path("/etc/rigbase/image-version").exists()
    agent = _agent(control_plane, tmp_path / "state", None)
    actual = agent.handle(work().model_dump(mode="json"))
    assert actual["state"] == "refused" and "not a rigbase node" in actual["message"]
    assert agent.thread is None and control_plane.auth == [] and control_plane.reports == []
