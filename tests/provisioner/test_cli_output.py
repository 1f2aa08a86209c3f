"""The CLI's output conventions through the real `provision` against a real server:
`-o table|wide|json|yaml` (and `--json`) on lists and shows, `--watch`, the node list's filters, its order
(region, then name), its AGE / LAST SEEN / GPUS columns, a default table that fits 120 columns without
ever cutting an id or a name."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pytest
import yaml

from tests.fixtures.control_plane import PROVISION, ControlPlane
from tests.provisioner.test_join_http import api

LONG_NAME = "a-very-long-node-name-that-an-operator-chose-for-reasons-of-their-own"[:63]


def _ok(cp: ControlPlane, *args: str) -> str:
    out = cp.provision(*args)
    assert out.returncode == 0, (args, out.stdout, out.stderr)
    return out.stdout


def _fleet(cp: ControlPlane) -> None:
    api(cp, "POST", "/v1/providers", {"kind": "physical", "config": {}})
    api(cp, "POST", "/v1/regions", {"name": "zulu", "provider": "physical"})
    api(cp, "POST", "/v1/regions", {"name": "alpha", "provider": "physical", "storage_mode": "central"})
    api(cp, "POST", "/v1/regions", {"name": "mike", "provider": "physical"})
    api(
        cp,
        "POST",
        "/v1/nodes",
        {"name": "nas", "region": "alpha", "minion_id": f"{1:032x}", "service": "storage"},
    )
    for i, (name, region) in enumerate([("gpu-2", "zulu"), ("gpu-1", "zulu"), ("gpu-9", "mike")]):
        api(cp, "POST", "/v1/nodes", {"name": name, "region": region, "minion_id": f"{i + 2:032x}"})
    api(cp, "POST", "/v1/nodes", {"name": LONG_NAME, "region": "zulu", "minion_id": f"{9:032x}"})


def _names(table: str) -> list[str]:
    return [line.split()[1] for line in table.splitlines()[1:]]


def test_node_list_order_columns_and_formats(api_server: ControlPlane) -> None:
    cp = api_server
    _fleet(cp)
    table = _ok(cp, "node", "list")
    header = table.splitlines()[0].split()
    assert header[:6] == ["ID", "NAME", "REGION", "SERVICE", "STATE", "ONLINE"]
    assert "GPUS" in header and "AGE" in header and "LAST SEEN" in table.splitlines()[0]
    assert "MINION ID" not in table  # a wide column
    # by region, then name; ids and the 63-character name printed in full
    assert _names(table) == ["nas", "gpu-9", LONG_NAME, "gpu-1", "gpu-2"]
    rows = json.loads(_ok(cp, "node", "list", "--json"))
    assert all(r["id"] in table for r in rows)
    # the default table fits 120 columns; only a name that is itself that long makes it wider
    assert max(len(line) for line in _ok(cp, "node", "list", "--region", "mike").splitlines()) <= 120
    # AGE is a human duration, LAST SEEN `-` (no heartbeat yet), GPUS `-` (no inventory yet)
    first = table.splitlines()[1].split()
    assert first[-1].endswith("s") and first[-2] == "-" and first[-3] == "-"
    wide = _ok(cp, "node", "list", "-o", "wide")
    assert "MINION ID" in wide and f"{2:032x}" in wide and "HOSTNAME" in wide
    # -o json is --json; yaml is the same data; both in the same order as the table
    assert json.loads(_ok(cp, "node", "list", "-o", "json")) == rows
    assert [r["name"] for r in rows] == _names(table)
    assert yaml.safe_load(_ok(cp, "node", "list", "-o", "yaml")) == rows
    shown = yaml.safe_load(_ok(cp, "node", "show", "gpu-1", "-o", "yaml"))
    assert shown["name"] == "gpu-1" and shown["region"] == "zulu"
    assert json.loads(_ok(cp, "region", "show", "alpha", "-o", "json"))["storage_mode"] == "central"
    assert "alpha" in _ok(cp, "region", "list", "-o", "wide")
    assert yaml.safe_load(_ok(cp, "provider", "list", "-o", "yaml"))[0]["kind"] == "physical"


def test_node_list_filters(api_server: ControlPlane) -> None:
    cp = api_server
    _fleet(cp)
    assert _names(_ok(cp, "node", "list", "--service", "storage")) == ["nas"]
    assert _names(_ok(cp, "node", "list", "--region", "zulu", "--state", "new")) == [
        LONG_NAME,
        "gpu-1",
        "gpu-2",
    ]
    assert "no node matches" in _ok(cp, "node", "list", "--state", "active")
    api(cp, "DELETE", "/v1/nodes/gpu-2?region=zulu")
    assert _names(_ok(cp, "node", "list", "--state", "removed")) == ["gpu-2"]
    bad = cp.provision("node", "list", "--state", "sleepy")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert bad.stderr.startswith("error: ") and "--state" in bad.stderr


class _Screens:
    """A watch's output as it comes, read by a thread, so a watch that stops drawing fails the wait
    within its timeout instead of blocking a read (a watch draws a screen every WATCH_EVERY_S)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        self.lines: queue.Queue[str] = queue.Queue()
        self.text = ""
        stdout = proc.stdout
        threading.Thread(target=lambda: [self.lines.put(line) for line in stdout], daemon=True).start()

    def until(self, done: Callable[[list[str]], bool], timeout: float = 30) -> None:
        """Wait until `done(the complete screens so far)`."""
        deadline = time.monotonic() + timeout
        while not done(self.text.split("Ctrl-C to stop")[:-1]):
            try:
                self.text += self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"the watch stopped drawing: {self.text[-2000:]}") from None


def test_watch_redraws_until_ctrl_c(api_server: ControlPlane) -> None:
    cp = api_server
    _fleet(cp)
    proc = subprocess.Popen(
        [str(PROVISION), "node", "list", "--watch"],
        env=cp.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    watch = _Screens(proc)
    try:
        watch.until(lambda screens: len(screens) >= 1)
        assert "gpu-late" not in watch.text
        api(cp, "POST", "/v1/nodes", {"name": "gpu-late", "region": "zulu", "minion_id": f"{20:032x}"})
        watch.until(lambda screens: "gpu-late" in screens[-1])  # a later screen shows the new node
        os.kill(proc.pid, signal.SIGINT)  # Ctrl-C ends a watch with exit 0, as kubectl's does
        assert proc.wait(timeout=20) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
    # a show watches too: it draws a screen and goes on until Ctrl-C
    show = subprocess.Popen(
        [str(PROVISION), "node", "show", "gpu-1", "--watch"], env=cp.env, stdout=subprocess.PIPE, text=True
    )
    try:
        shown = _Screens(show)
        shown.until(lambda screens: len(screens) >= 2)
        assert "gpu-1" in shown.text
        assert show.poll() is None, "`node show --watch` ended on its own"
    finally:
        show.kill()
        show.wait()


def test_show_never_cuts_a_field_name_however_long_a_value_is(capsys: pytest.CaptureFixture[str]) -> None:
    """Operator paper cut: `node show` cut its field names to 8 characters when a value was long (an
    inventory as one JSON line)."""
    from provisioner.cli import render

    render.detail({"id": "node_1", "last_heartbeat_at": "10 s ago", "inventory": "x" * 3000})
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert names == ["id", "last_heartbeat_at", "inventory"]


def test_a_wrapped_column_keeps_every_word_within_the_width(capsys: pytest.CaptureFixture[str]) -> None:
    """`doctor`'s details wrap onto more lines instead of ending in `…`."""
    from provisioner.cli import render

    detail = " ".join(f"word{i}" for i in range(60))
    rows = [{"check": "join-tokens", "verdict": "warn", "detail": detail}]
    render.table(rows, [("check", "CHECK"), ("verdict", "RESULT"), ("detail", "DETAIL")], wrap=("detail",))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) > 2 and all(len(line) <= render.FIT_WIDTH for line in lines)
    assert "…" not in "".join(lines) and " ".join(" ".join(lines).split()).endswith(detail)


def test_times_show_in_local_time_to_the_second_and_json_keeps_the_apis(api_server: ControlPlane) -> None:
    cp = api_server
    api(cp, "POST", "/v1/providers", {"kind": "physical", "config": {}})
    api(cp, "POST", "/v1/regions", {"name": "dc1", "provider": "physical"})
    api(cp, "POST", "/v1/nodes", {"name": "gpu-1", "region": "dc1", "minion_id": f"{7:032x}"})
    env = cp.env | {"TZ": "Asia/Kolkata"}  # UTC+05:30 all year

    def run(*args: str) -> str:
        out = subprocess.run([str(PROVISION), *args], env=env, capture_output=True, text=True, timeout=60)
        return out.stdout

    shown = run("node", "show", "gpu-1", "-o", "wide")
    raw = json.loads(run("node", "show", "gpu-1", "--json"))

    created = datetime.fromisoformat(raw["created_at"].replace("Z", "+00:00"))
    local = created.astimezone(timezone(timedelta(hours=5, minutes=30))).strftime("%Y-%m-%d %H:%M:%S")
    line = next(li for li in shown.splitlines() if li.startswith("created_at"))
    assert line.split(None, 1)[1].strip() == local and "T" in raw["created_at"]
    # the creation event, a moment after the node's created_at: the same minute at least
    assert local[:16] in run("node", "history", "gpu-1")
