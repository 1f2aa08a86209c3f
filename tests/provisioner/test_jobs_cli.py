"""The real `provision job …` CLI (subprocess) against a real control plane: the match table of --dry-run,
the [y/N] question and --yes, the id printed on create, one line per spec error with exit 2 and nothing
stored, list/show/history/stop with --json, logs (one worker or all, --follow to the end), convert, and the
three spec formats (tests/provisioner/jobspecs/)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.provisioner.test_jobs_api import Fleet, mine, report, running_fleet

SPECS = Path(__file__).parent / "jobspecs"

TRAIN = """\
name: {name}
type: training
resources:
  gpu_types: [RTX 3090]
  gpu_count: 1
workers:
  - echo one
  - echo two
environment:
  image: localhost/rigbase-job:test
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("jobs-cli") / "home") as f:
        yield f


def _spec(tmp_path: Path, name: str, text: str = TRAIN) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text.format(name=name))
    return path


def _names(fleet: Fleet) -> list[str]:
    answer = fleet.cp.provision("job", "list", "--json")
    assert answer.returncode == 0, answer.stderr
    return [j["name"] for j in json.loads(answer.stdout)]


def test_dry_run_prints_the_match_table_and_stores_nothing(fleet: Fleet, tmp_path: Path) -> None:
    answer = fleet.cp.provision("job", "create", "-f", str(_spec(tmp_path, "dry")), "--dry-run")
    assert answer.returncode == 0, answer.stderr
    out = answer.stdout
    assert "Searched and matched the following GPU resource for your job:" in out
    for header in ("Provider", "Instance", "vCPU(s)", "Memory(GiB)", "GPU(s)", "Region", "Cost", "Selected"):
        assert header in out
    selected = next(line for line in out.splitlines() if "√" in line)
    assert "gpu-1" in selected and "RTX 3090:2" in selected and "lab-1" in selected
    assert "gpu-2 (lab-1): has T4 GPUs" in out  # why the others do not fit
    as_json = json.loads(
        fleet.cp.provision("job", "create", "-f", str(_spec(tmp_path, "dry")), "--dry-run", "--json").stdout
    )
    assert as_json["fits"] and as_json["matches"][0]["instance"] == "gpu-1"
    assert "dry" not in _names(fleet)


def test_create_asks_then_prints_the_id_and_the_job_can_be_followed_and_stopped(
    fleet: Fleet, tmp_path: Path
) -> None:
    path = str(_spec(tmp_path, "asked"))
    no = fleet.cp.provision("job", "create", "-f", path, input="n\n")
    assert no.returncode == 1 and "[y/N]" in no.stderr and "nothing created" in no.stderr
    assert "asked" not in _names(fleet)
    silent = fleet.cp.provision("job", "create", "-f", path)  # no answer at all (stdin closed)
    assert silent.returncode == 2 and "pass --yes" in silent.stderr
    yes = fleet.cp.provision("job", "create", "-f", path, input="y\n")
    assert yes.returncode == 0, yes.stderr
    job_id = yes.stdout.strip().splitlines()[-1]
    assert job_id.startswith("job_") and "Searched and matched" in yes.stdout
    assert "job asked starting on gpu-1" in yes.stderr

    shown = json.loads(fleet.cp.provision("job", "show", "asked", "--json").stdout)
    assert shown["id"] == job_id and shown["state"] == "starting" and len(shown["workers"]) == 2
    table = fleet.cp.provision("job", "show", "asked").stdout
    assert "WORKER" in table and "gpu-1" in table
    assert job_id in fleet.cp.provision("job", "list").stdout

    # the node runs it and ships its output; `logs` prints each worker's, `--follow` ends with the job
    workers = mine(fleet.heartbeat("gpu-1"), job_id)
    fleet.heartbeat("gpu-1", [report(w, "running") for w in workers])
    assert fleet.log("gpu-1", job_id, 0, 0, "one\n", eof=True).status_code == 200
    assert fleet.log("gpu-1", job_id, 1, 0, "two\n").status_code == 200
    only = fleet.cp.provision("job", "logs", "asked", "--worker", "1")
    assert only.returncode == 0 and only.stdout == "two\n"
    both = fleet.cp.provision("job", "logs", job_id)
    assert both.stdout == "[worker 0] one\n[worker 1] two\n"
    fleet.log("gpu-1", job_id, 1, 4, "three\n", eof=True)
    fleet.heartbeat("gpu-1", [report(w, "exited", exit_code=0) for w in workers])
    followed = fleet.cp.provision("job", "logs", "asked", "--follow")
    assert (
        followed.returncode == 0 and followed.stdout == "[worker 0] one\n[worker 1] two\n[worker 1] three\n"
    )
    assert fleet.cp.provision("job", "logs", "asked", "--worker", "5").returncode == 2

    history = json.loads(fleet.cp.provision("job", "history", "asked", "--json").stdout)
    assert [h["to_state"] for h in history if h["name"] == "asked"] == [
        "waiting",
        "starting",
        "running",
        "succeeded",
    ]
    stopped = fleet.cp.provision("job", "stop", "asked")
    assert stopped.returncode == 1 and "already ended (succeeded)" in stopped.stderr


def test_yes_skips_the_question_and_stop_stops(fleet: Fleet, tmp_path: Path) -> None:
    created = fleet.cp.provision("job", "create", "-f", str(_spec(tmp_path, "quick")), "-y")
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip().startswith("job_") and "Searched" not in created.stdout
    stopped = json.loads(fleet.cp.provision("job", "stop", "quick", "--json").stdout)
    assert stopped["state"] == "stopped"
    (w,) = [w for w in mine(fleet.heartbeat("gpu-1"), stopped["id"]) if w["worker"] == 0]
    assert w["stop"]
    fleet.heartbeat(
        "gpu-1", [report(x, "stopped", exit_code=143) for x in mine(fleet.heartbeat("gpu-1"), stopped["id"])]
    )


def test_a_bad_spec_is_one_line_per_error_exit_2_nothing_stored(fleet: Fleet, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: Bad_Name\nresources:\n  gpu_count: 0\n  cpu_count: 6\nworkers: [echo]\n")
    answer = fleet.cp.provision("job", "create", "-f", str(bad), "-y")
    assert answer.returncode == 2, answer.stdout
    lines = answer.stderr.strip().splitlines()
    assert len(lines) >= 2 and all(line.startswith("error: ") for line in lines)
    assert any(line.startswith("error: bad.yaml:1: name:") for line in lines)
    assert any(line.startswith("error: bad.yaml:4: resources.cpu_count:") for line in lines)
    assert "Bad_Name" not in _names(fleet) and "bad" not in _names(fleet)
    missing = fleet.cp.provision("job", "create", "-f", str(tmp_path / "nope.yaml"), "-y")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1


def test_other_formats_convert_and_a_job_waits_for_a_gpu_type_the_fleet_lacks(fleet: Fleet) -> None:
    pai = SPECS / "openpai-distributed.json"
    converted = fleet.cp.provision("job", "convert", "-f", str(pai))
    assert converted.returncode == 0, converted.stderr
    assert converted.stdout.startswith("# converted from an OpenPAI job JSON") and "V100" in converted.stdout
    created = fleet.cp.provision("job", "create", "-f", str(pai), "-y", "--json")
    assert created.returncode == 0, created.stderr
    job = json.loads(created.stdout)
    assert (
        job["state"] == "waiting"
        and job["reason"].startswith("Waiting for GPUs:")
        and len(job["workers"]) == 3
    )
    assert "wrong GPU type" in job["reason"]
    dry = fleet.cp.provision("job", "create", "-f", str(SPECS / "chainopera-launch-hello.yaml"), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    # what the conversion changed is said before anything runs: the workspace (a dry run uploads nothing),
    # the image
    warned = [line for line in dry.stderr.splitlines() if line.startswith("warning: ")]
    assert any("workspace 'hello_world': uploaded" in line for line in warned), dry.stderr
    assert any("model.source './hello_world' is made into a model when" in line for line in warned), (
        dry.stderr
    )
    assert any("no image: the file names none (docker.image)" in line for line in warned), dry.stderr
    assert fleet.cp.provision("job", "stop", job["id"]).returncode == 0
    listed = fleet.cp.provision("job", "list", "--state", "stopped", "--json")
    assert job["id"] in [j["id"] for j in json.loads(listed.stdout)]
