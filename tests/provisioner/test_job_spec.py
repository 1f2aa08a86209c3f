"""The job spec (contracts/jobspec.py) and its three file formats (provisioner/domain/job_formats.py).

The examples in tests/provisioner/jobspecs/ are the formats' own (ChainOpera Launch's hello-world job.yaml,
OpenPAI's tensorflow-cifar10 JSON) plus rigbase specs that use every field of the job configuration. Every
rule is checked for the field path and, for YAML, the line named in its error. Pure functions: no server."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.errors import InvalidInput
from contracts.gpu_types import AMD_GPU_TYPES, GPU_TYPES, resolve_gpu_type
from contracts.jobspec import JobSpec, JobType, SpecError, schema_json, spec_from_data
from provisioner.domain.job_formats import SpecFormat, convert, dump, parse, read
from provisioner.domain.job_source import MAX_SPEC_BYTES

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = Path(__file__).with_name("jobspecs")
# trainML's own example names its model by an ssh git URI (git@github.com:…), which rigbase does not read
REFUSED_EXAMPLES = frozenset({"trainml-custom-container.yaml"})
EXAMPLE_FILES = [
    p for p in sorted(EXAMPLES.iterdir()) if p.suffix in (".yaml", ".json") and p.name not in REFUSED_EXAMPLES
]


def _errors(text: str, filename: str | None = None) -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse(text, filename)
    return caught.value.errors


# --- every example parses, converts, and reads back the same ------------------------------------------------


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_example_converts_and_reads_back(path: Path) -> None:
    text = path.read_text()
    spec = parse(text, path.name)
    assert parse(convert(text, path.name)) == spec
    assert parse(convert(text, path.name, as_json=True)) == spec
    assert parse(dump(spec)) == spec


def test_launch_seed_hello_world() -> None:
    parsed = read((EXAMPLES / "chainopera-launch-hello.yaml").read_text(), "job.yaml")
    spec = parsed.spec
    assert parsed.format is SpecFormat.LAUNCH
    assert spec.name == "hello-world"
    assert spec.type is JobType.TRAINING
    assert spec.resources.gpu_types == ["A100 80GB"]
    assert (spec.resources.gpu_count, spec.resources.max_price) == (1, 1.75)
    (command,) = spec.workers
    assert command.index("pip install -r requirements.txt") < command.index("python hello_world.py")
    assert any("workspace 'hello_world': uploaded by `provision job create`" in note for note in parsed.notes)
    # the workspace becomes the job's model, and the commands run in it, as Launch runs them
    assert spec.model is not None and spec.model.source == "./hello_world"
    assert command.startswith("cd /opt/ml/models\n")
    assert any(note.startswith("no image: the file names none (docker.image)") for note in parsed.notes)


def test_openpai_seed_tensorflow_cifar10() -> None:
    parsed = read((EXAMPLES / "openpai-tensorflow-cifar10.json").read_text(), "job.json")
    spec = parsed.spec
    assert parsed.format is SpecFormat.OPENPAI
    assert spec.name == "tensorflow-cifar10"
    assert spec.environment.image == "tensorflow/tensorflow:1.12.0-gpu-py3"
    assert spec.groups is not None and len(spec.groups) == 1
    (role,) = spec.groups
    assert role.resources is not None and (role.resources.gpu_count, role.resources.cpu_count) == (1, 4)
    assert set(role.resources.gpu_types) == set(GPU_TYPES) - AMD_GPU_TYPES  # no type named: any NVIDIA
    assert role.count == 1 and role.command.startswith("apt update && apt install -y git")
    assert any("memoryMB" in note for note in parsed.notes)


def test_openpai_task_number_gives_that_many_workers() -> None:
    parsed = read((EXAMPLES / "openpai-distributed.json").read_text())
    spec = parsed.spec
    assert spec.job_kind.value == "gang"  # OpenPAI places a job's tasks together
    plan = spec.plan()
    assert [(w.group, w.group_index, w.command.split("=")[-1]) for w in plan] == [
        ("ps", 0, "ps"),
        ("worker", 0, "worker"),
        ("worker", 1, "worker"),
    ]
    assert spec.name == "tensorflow-distributed"
    assert all(w.resources.gpu_types == ["V100"] for w in plan)
    # each role keeps its own CPUs, up to a multiple of 4
    assert [w.resources.cpu_count for w in plan] == [4, 8, 8]  # cpuNumber 2 and 6
    assert spec.environment.env == {"TF_CPP_MIN_LOG_LEVEL": "2"}


def test_launch_cpu_job_and_ignored_fields() -> None:
    parsed = read((EXAMPLES / "chainopera-launch-cpu.yaml").read_text())
    assert parsed.spec.name == "preprocess"
    assert (parsed.spec.resources.gpu_count, parsed.spec.resources.cpu_count) == (0, 4)
    assert any("allow_cross_cloud_resources" in note for note in parsed.notes)


def test_rigbase_training_example_keeps_every_field() -> None:
    spec = parse((EXAMPLES / "rigbase-training.yaml").read_text())
    assert spec.resources.gpu_types == ["RTX 3090", "RTX 4090"]
    assert (spec.resources.max_price, spec.resources.disk_size, spec.region) == (0.8, 50, "lab-1")
    assert spec.environment.packages.requirements == "requirements.txt"
    assert convert((EXAMPLES / "rigbase-training.yaml").read_text()) == dump(spec)  # no notes for our own


def test_detected_by_content_not_by_file_name() -> None:
    openpai = (EXAMPLES / "openpai-tensorflow-cifar10.json").read_text()
    launch = (EXAMPLES / "chainopera-launch-hello.yaml").read_text()
    rigbase = (EXAMPLES / "rigbase-cpu-only.json").read_text()
    assert read(openpai, "job.yaml").format is SpecFormat.OPENPAI
    assert read(launch, "openpai.json").format is SpecFormat.LAUNCH
    assert read(rigbase, "job.yaml").format is SpecFormat.RIGBASE


# --- rules: one line per error, naming the field and the YAML line ------------------------------------------

BASE = """\
name: rules
type: training
resources:
  gpu_types: [RTX 3090]
  gpu_count: 1
workers:
  - python train.py
"""


@pytest.mark.parametrize(
    ("replace", "by", "expected"),
    [
        (
            "  gpu_count: 1\n",
            "  gpu_count: 0\n  cpu_count: 8\n",
            "line 4: resources.gpu_types: a CPU-only job",
        ),
        (
            "  gpu_types: [RTX 3090]\n  gpu_count: 1\n",
            "  gpu_count: 0\n  cpu_count: 6\n",
            "line 5: resources.cpu_count: must be a multiple of 4, e.g. 4 or 8",
        ),
        (
            "  gpu_types: [RTX 3090]\n  gpu_count: 1\n",
            "  gpu_count: 0\n",
            "line 3: resources.cpu_count: required for a CPU-only job (gpu_count 0)",
        ),
        (
            "  gpu_types: [RTX 3090]\n",
            "  gpu_types: [RTX 3090, RTX 4900]\n",
            "line 4: resources.gpu_types[1]: unknown GPU type 'RTX 4900': did you mean RTX 4090",
        ),
        ("  gpu_types: [RTX 3090]\n", "", "line 3: resources.gpu_types: name at least one GPU type"),
        (
            "  gpu_count: 1\n",
            "  gpu_count: 1\n  disk_size: 5\n",
            "line 6: resources.disk_size: must be 10 to 1000 GB",
        ),
        (
            "  gpu_count: 1\n",
            "  gpu_count: 1\n  disk_size: 1001\n",
            "line 6: resources.disk_size: must be 10 to 1000 GB",
        ),
        (
            "  gpu_count: 1\n",
            "  gpu_count: 1\n  max_price: 0\n",
            "line 6: resources.max_price: must be a price",
        ),
        ("  gpu_count: 1\n", "  gpu_count: -1\n", "line 5: resources.gpu_count: must be 0 (CPU only) to 64"),
        ("  gpu_count: 1\n", "  gpu_count: two\n", "line 5: resources.gpu_count: must be a whole number"),
        (
            "  gpu_count: 1\n",
            "  gpu_count: 1\n  gpus: 2\n",
            "line 6: resources.gpus: unknown field; allowed here: gpu_types, gpu_count, cpu_count, "
            "max_price, disk_size",
        ),
        ("name: rules\n", "name: My Job\n", "line 1: name: must be 1-63 lowercase letters"),
        ("name: rules\n", "", "name: required"),
        (
            "type: training\n",
            "type: batch\n",
            "line 2: type: must be one of training, inference, notebook or endpoint",
        ),
        (
            BASE[BASE.index("type:") :],
            "type: inference\nresources: {gpu_types: T4}\nworkers: [a, b]\n",
            "line 4: workers: only training jobs",
        ),
        ("  - python train.py\n", "  - '  '\n", "line 7: workers[0]: is empty"),
        ("  - python train.py\n", "  []\n", "line 6: workers: needs at least 1"),
        (
            "name: rules\n",
            "name: rules\nreservation: api\n",
            "line 2: reservation: only endpoint and notebook jobs may use this field (this job is training)",
        ),
        (
            "name: rules\n",
            "name: rules\ndata:\n  input: {datastore: images}\n",
            "line 3: data.input: only inference jobs may use this field",
        ),
        (
            "type: training\n",
            "type: notebook\ndata:\n  output: {datastore: out}\n",
            "line 4: data.output: only inference and training jobs may use this field",
        ),
        (
            "type: training\n",
            "type: inference\ndata:\n  datasets: [cifar]\n",
            "line 4: data.datasets: only notebook",
        ),
        (
            "type: training\n",
            "type: inference\ndata:\n  datasets: [a]\n  input: {datastore: x}\n",
            "line 5: data.input: datasets and input both mount at /opt/ml/input",
        ),
        (
            "name: rules\n",
            "name: rules\ndata:\n  datasets: [PASCAL VOC, PASCAL_VOC]\n",
            "line 3: data.datasets[1]: 'PASCAL_VOC' and 'PASCAL VOC' would both mount at "
            "/opt/ml/input/PASCAL_VOC",
        ),
        (
            "name: rules\n",
            "name: rules\ndata:\n  output: {datastore: out, path: /a/../../etc}\n",
            "line 3: data.output.path: the datastore path '/a/../../etc' contains '..'",
        ),
        (
            "name: rules\n",
            "name: rules\ndata:\n  output: {datastore: out, path: results}\n",
            "line 3: data.output.path: must begin with / (from the datastore root), e.g. /results",
        ),
        (
            "name: rules\n",
            "name: rules\ndata:\n  output: {datastore: Out_1}\n",
            "line 3: data.output.datastore: must be 1-63",
        ),
        (
            "name: rules\n",
            "name: rules\nenvironment:\n  env: {RIGBASE_JOB: x}\n",
            "line 3: environment.env.RIGBASE_JOB: names starting with RIGBASE_ are set by rigbase",
        ),
        (
            "name: rules\n",
            "name: rules\nenvironment:\n  packages: {pip: [torch 2.0]}\n",
            "line 3: environment.packages.pip[0]: must not contain spaces",
        ),
        (
            "name: rules\n",
            "name: rules\nenvironment:\n  image: ''\n",
            "line 3: environment.image: must not be empty",
        ),
    ],
)
def test_rule_names_the_field_and_line(replace: str, by: str, expected: str) -> None:
    assert replace in BASE
    errors = _errors(BASE.replace(replace, by, 1))
    assert any(line.startswith(expected) for line in errors), errors


def test_every_error_is_its_own_line_with_the_file_name() -> None:
    text = BASE.replace("name: rules", "name: Bad Name").replace(
        "gpu_count: 1", "gpu_count: 1\n  disk_size: 1"
    )
    assert _errors(text, "job.yaml") == [
        "job.yaml:1: name: must be 1-63 lowercase letters, digits and hyphens, starting and ending with a "
        "letter or digit",
        "job.yaml:6: resources.disk_size: must be 10 to 1000 GB (10 GB to 1 TB)",
    ]


def test_json_errors_name_the_field_and_line() -> None:
    data = json.loads((EXAMPLES / "rigbase-cpu-only.json").read_text())
    data["resources"]["cpu_count"] = 10
    assert _errors(json.dumps(data, indent=2)) == [
        "line 6: resources.cpu_count: must be a multiple of 4, e.g. 8 or 12"
    ]


def test_spec_error_is_invalid_input_with_every_line() -> None:
    error = SpecError(["a: x", "b: y"])
    assert isinstance(error, InvalidInput)
    assert error.to_json() == {
        "code": "invalid_job_spec",
        "message": "a: x\nb: y",
        "errors": ["a: x", "b: y"],
    }


def test_spec_from_data_names_fields_without_lines() -> None:
    with pytest.raises(SpecError) as caught:
        spec_from_data({"name": "x", "resources": {"gpu_count": 0, "cpu_count": 6}, "workers": ["a"]})
    assert caught.value.errors == ["resources.cpu_count: must be a multiple of 4, e.g. 4 or 8"]


# --- the file itself --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "the spec is empty"),
        ("- a\n- b\n", "the spec must be a mapping"),
        ("name: a\nname: b\n", "line 2: name: given twice (first on line 1)"),
        ("name: a\n---\nname: b\n", "line 2: not valid YAML: but found another document"),
        ("name: [a\n", "line 2: not valid YAML: expected ',' or ']'"),
        ("x: &a [1]\ny: *a\n", "line 1: y: anchors and aliases (&, *) are not supported"),
        ('{"name": "a",\n\t"type": }', "line 2: not valid JSON: Expecting value"),
        ("protocolVersion: 2\nname: a\n", "protocolVersion: OpenPAI's protocol v2"),
        ('{"name": "a",\n\t"name": "b"}', "name: given twice in one object"),
        ("[" * 100_000, "the spec is nested too deeply"),
    ],
)
def test_bad_files_are_refused_in_one_line(text: str, expected: str) -> None:
    errors = _errors(text)
    assert len(errors) == 1 and errors[0].startswith(expected), errors


def test_oversized_file_is_refused() -> None:
    assert _errors("#" * (MAX_SPEC_BYTES + 1))[0].startswith("the spec is larger than 1024 KiB")


def test_json_with_tabs_reads_without_yaml() -> None:
    text = (EXAMPLES / "rigbase-cpu-only.json").read_text().replace("  ", "\t")
    assert parse(text).name == "preprocess"


# --- foreign formats name their own fields -----------------------------------------------------------------


def test_launch_errors_name_launch_fields() -> None:
    text = (EXAMPLES / "chainopera-launch-hello.yaml").read_text()
    assert _errors(text.replace("A100-80G ", "Z80 "), "job.yaml") == [
        "job.yaml:32: computing.resource_type: unknown GPU type 'Z80': use one of " + ", ".join(GPU_TYPES)
    ]
    assert _errors(text.replace("$1.75", "cheap")) == [
        "line 31: computing.maximum_cost_per_hour: must be a price per hour, e.g. $1.75"
    ]
    errors = _errors("workspace: x\ncomputing:\n  minimum_num_gpus: 100\n  resource_type: T4\n")
    assert errors == ["job: required: the entry commands, as a block of shell lines (job: |)"]
    errors = _errors("job: echo\ncomputing:\n  minimum_num_gpus: 100\n  resource_type: T4\n")
    assert errors == [
        "line 3: computing.minimum_num_gpus: must be 0 (CPU only) to 64 GPUs per worker "
        "(as resources.gpu_count)"
    ]


def test_launch_cost_is_per_gpu_hour() -> None:
    text = "job: echo\ncomputing: {minimum_num_gpus: 4, maximum_cost_per_hour: 10, resource_type: RTX-4090}\n"
    parsed = read(text)
    assert (parsed.spec.resources.max_price, parsed.spec.resources.gpu_types) == (2.5, ["RTX 4090"])
    assert any("is for all 4 GPUs" in note for note in parsed.notes)


def test_openpai_errors_name_openpai_fields() -> None:
    data = json.loads((EXAMPLES / "openpai-distributed.json").read_text())
    data["taskRoles"][1]["gpuNumber"] = 2
    data["taskRoles"][0]["taskNumber"] = 0
    del data["image"]
    assert _errors(json.dumps(data, indent=1)) == [
        "image: required: the Docker image, e.g. ubuntu:22.04",
        "line 10: taskRoles[0].taskNumber: must be a whole number, 1 or more",
    ]
    data["image"] = "x"
    data["taskRoles"][0]["taskNumber"] = 1
    # roles with other GPU counts are read role by role (a parameter server beside its workers)
    spec = read(json.dumps(data, indent=1)).spec
    assert [w.resources.gpu_count for w in spec.plan()] == [1, 2, 2]
    data["taskRoles"][1]["name"] = "9workers"
    assert _errors(json.dumps(data, indent=1)) == [
        "line 17: taskRoles[1].name: must be 1-63 letters, digits, '_' and '-', starting with a letter "
        "(as groups[1].name)"
    ]
    data["taskRoles"][1]["name"] = "worker"
    data["gpuType"] = "K80"
    assert _errors(json.dumps(data))[0].startswith("line 1: gpuType: unknown GPU type 'K80'")


# --- GPU type names ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "types"),
    [
        ("RTX 4090", ("RTX 4090",)),
        ("RTX4090", ("RTX 4090",)),
        ("A100 (80GB)", ("A100 80GB",)),  # trainML's spelling
        ("A100 (40GB)", ("A100 40GB",)),
        ("A100-80G", ("A100 80GB",)),  # ChainOpera Launch's resource_type
        ("NVIDIA A100-SXM4-80GB", ("A100 80GB",)),  # as Launch's match table prints it
        ("A100_80GB", ("A100 80GB",)),  # GCP's
        ("A100", ("A100 40GB", "A100 80GB")),  # a family: every model of it
        ("H100", ("H100 80GB", "H100 NVL")),
        ("RTX 2060 SUPER", ("RTX 2060 Super",)),
        ("GeForce GTX 1060", ("GTX 1060",)),
        ("Tesla T4", ("T4",)),
        ("A6000", ("RTX A6000",)),
        ("rtx a6000", ("RTX A6000",)),
        ("MI300X", ("MI300X",)),
        # as nvidia-smi prints them: memory kinds and a size the catalogue type has none of are dropped
        ("NVIDIA H100 80GB HBM3", ("H100 80GB",)),
        ("NVIDIA H200 141GB HBM3e", ("H200 141GB",)),
        ("Tesla V100-SXM2-16GB", ("V100",)),
        ("Tesla P100-PCIE-16GB", ("P100",)),
        ("NVIDIA GeForce GTX 1060 6GB", ("GTX 1060",)),
        ("NVIDIA RTX 6000 Ada Generation", ("RTX 6000 Ada",)),
        # trainML's GPU ids
        ("rtx2060s", ("RTX 2060 Super",)),
        ("rtx2070s", ("RTX 2070 Super",)),
        ("a100xl", ("A100 80GB",)),
    ],
)
def test_gpu_type_spellings(name: str, types: tuple[str, ...]) -> None:
    assert resolve_gpu_type(name) == types


@pytest.mark.parametrize("name", ["None (CPU-Only)", "", "K80", "RTX 5090", "A100 48GB"])
def test_unknown_gpu_types(name: str) -> None:
    with pytest.raises(ValueError, match="unknown GPU type"):
        resolve_gpu_type(name)


def test_trainml_gpu_types_all_resolve() -> None:
    trainml = ["GTX 1060", "RTX 2060 Super", "RTX 2070 Super", "RTX 2080 Ti", "RTX 3090", "RTX A4000",
               "RTX A6000", "T4", "P100", "V100", "A100 (40GB)", "A100 (80GB)"]  # fmt: skip
    assert [len(resolve_gpu_type(name)) for name in trainml] == [1] * len(trainml)


def test_gpu_types_are_the_catalogue_models() -> None:
    catalogue = yaml.safe_load((ROOT / "regions" / "gpus.yaml").read_text())["gpus"]
    assert list(dict.fromkeys(entry["model"] for entry in catalogue.values())) == list(GPU_TYPES)
    assert {e["model"] for pci, e in catalogue.items() if pci.startswith("1002:")} == AMD_GPU_TYPES


# --- helpers for the jobs service ---------------------------------------------------------------------------


def test_mount_targets() -> None:
    one = parse(BASE + "data:\n  datasets: [PASCAL VOC]\n  output: {datastore: out, path: /runs}\n")
    assert [(m.role, m.name, m.target, m.read_only) for m in one.mounts()] == [
        ("dataset", "PASCAL VOC", "/opt/ml/input", True),
        ("output", "out", "/opt/ml/output", False),
    ]
    several = parse((EXAMPLES / "rigbase-cpu-only.json").read_text())
    assert [m.target for m in several.mounts()] == [
        "/opt/ml/input/PASCAL_VOC",
        "/opt/ml/input/COCO_2017",
        "/opt/ml/output",
    ]
    inference = parse((EXAMPLES / "rigbase-inference.yaml").read_text())
    assert [(m.role, m.datastore, m.path, m.target) for m in inference.mounts()] == [
        ("input", "images", "/2026-11", "/opt/ml/input"),
        ("output", "results", "/predictions", "/opt/ml/output"),
    ]


def test_worker_commands_without_packages_are_the_commands() -> None:
    spec = parse((EXAMPLES / "rigbase-cpu-only.json").read_text())
    assert spec.worker_commands() == spec.workers


def test_worker_commands_install_in_order_then_run(tmp_path: Path) -> None:
    """The generated script, run by a real /bin/sh with stand-ins for apt-get, conda and pip on PATH that log
    their arguments: apt -> conda -> requirements.txt -> pip, each package one argument, then the command."""
    spec = parse((EXAMPLES / "rigbase-training.yaml").read_text())
    log = tmp_path / "log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("apt-get", "conda", "pip"):
        script = bin_dir / tool
        script.write_text(
            f'#!/bin/sh\nfor a in "$@"; do printf "%s|" "$a"; done >> {log}; echo " {tool}" >> {log}\n'
        )
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "requirements.txt").write_text("numpy\n")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    for worker, command in enumerate(spec.worker_commands()):
        log.write_text("")
        result = subprocess.run(
            ["/bin/sh", "-c", command.replace("python train.py", "echo train")],
            cwd=tmp_path, env=env, capture_output=True, text=True, check=True, timeout=10,
        )  # fmt: skip
        assert result.stdout.strip() == f"train --lr {spec.workers[worker].split()[-1]}"
        assert log.read_text().splitlines() == [
            "update|-qq| apt-get",
            "install|-y|-qq|git| apt-get",
            "install|-y|-q|tqdm=4.66.4| conda",
            "install|-q|-r|requirements.txt| pip",
            "install|-q|wandb==0.17.0| pip",
        ]


def test_a_failed_install_stops_the_worker(tmp_path: Path) -> None:
    spec = parse(BASE + "environment:\n  packages: {pip: [nothing]}\n")
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    (tmp_path / "pip").write_text("#!/bin/sh\nexit 7\n")
    os.chmod(tmp_path / "pip", 0o755)
    result = subprocess.run(
        ["/bin/sh", "-c", spec.worker_commands()[0]], env=env, capture_output=True, timeout=10
    )
    assert result.returncode == 7


def test_the_published_schema_is_current() -> None:
    published = (ROOT / "docs" / "job-spec.schema.json").read_text()
    assert published == schema_json(), (
        "docs/job-spec.schema.json is stale: regenerate it with\n"
        ".venv/bin/python -c 'from contracts.jobspec import schema_json; print(schema_json(), end=\"\")' "
        "> docs/job-spec.schema.json"
    )
    schema = json.loads(published)
    assert schema["$defs"]["Resources"]["properties"]["gpu_types"]["items"]["enum"] == list(GPU_TYPES)


def test_model_is_frozen_and_strict() -> None:
    spec = JobSpec.model_validate(yaml.safe_load(BASE))
    with pytest.raises(ValueError):
        JobSpec.model_validate({**yaml.safe_load(BASE), "extra": 1})
    assert spec.model_copy() == spec


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_converted_examples_validate_against_the_published_schema(path: Path) -> None:
    """The schema an editor or another tool checks a spec with accepts what rigbase writes (schemathesis
    brings jsonschema_rs)."""
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    validator = jsonschema_rs.validator_for(json.loads((ROOT / "docs" / "job-spec.schema.json").read_text()))
    validator.validate(json.loads(dump(parse(path.read_text()), as_json=True)))
    with pytest.raises(jsonschema_rs.ValidationError):
        validator.validate({"name": "x", "resources": {"gpu_types": ["RTX 4900"]}, "workers": ["a"]})


def test_env_values_are_text_and_keys_are_named() -> None:
    spec = parse(BASE + "environment:\n  env: {PORT: 8080, DEBUG: true, RATE: 0.5}\n")
    assert spec.environment.env == {"PORT": "8080", "DEBUG": "true", "RATE": "0.5"}
    assert _errors(BASE + "environment:\n  env: {1bad: x}\n") == [
        "line 9: environment.env.1bad: must be a variable name: letters, digits and _, not starting with a "
        "digit"
    ]


def test_errors_come_in_file_order() -> None:
    text = "workers: [a]\nresources: {gpu_types: [Z80], disk_size: 1}\ntype: batch\n"
    assert [line.split(": ")[:2] for line in _errors(text)] == [
        ["name", "required"],
        ["line 2", "resources.gpu_types[0]"],
        ["line 2", "resources.disk_size"],
        ["line 3", "type"],
    ]


def test_datastores_and_cpu_only_helpers() -> None:
    spec = parse((EXAMPLES / "rigbase-inference.yaml").read_text())
    assert spec.datastores() == ["images", "results"]
    assert not spec.resources.cpu_only
    assert parse((EXAMPLES / "rigbase-cpu-only.json").read_text()).resources.cpu_only


_KEYS = st.sampled_from(
    "name type resources workers environment data gpu_types gpu_count cpu_count job computing taskRoles "
    "jobName image minimum_num_gpus resource_type maximum_cost_per_hour taskNumber gpuNumber cpuNumber "
    "command datasets output env packages bootstrap".split()
) | st.text(max_size=5)
_SCALARS = st.none() | st.booleans() | st.integers(-10, 10**6) | st.floats() | st.text(max_size=20)
_DATA = st.recursive(
    _SCALARS, lambda c: st.lists(c, max_size=4) | st.dictionaries(_KEYS, c, max_size=6), max_leaves=30
)


@settings(max_examples=100, deadline=None)
@given(doc=st.dictionaries(_KEYS, _DATA, max_size=8))
def test_any_mapping_gives_a_spec_or_spec_error(doc: dict[str, object]) -> None:
    """Whatever a file holds, the answer is a JobSpec or SpecError lines, never another exception."""
    try:
        parse(json.dumps(doc))
    except SpecError as exc:
        assert exc.errors and all(line and "\n" not in line for line in exc.errors)


@settings(max_examples=150, deadline=None)
@given(
    base=st.sampled_from(EXAMPLE_FILES),
    at=st.integers(0, 1500),
    cut=st.integers(0, 40),
    text=st.text(max_size=8),
)
def test_damaged_examples_give_a_spec_or_spec_error(base: Path, at: int, cut: int, text: str) -> None:
    original = base.read_text()
    try:
        parse(original[:at] + text + original[at + cut :])
    except SpecError as exc:
        assert exc.errors


def test_error_lines_cannot_be_forged_or_huge() -> None:
    errors = _errors(
        json.dumps({"name": "a", "resources": {"gpu_types": "T4"}, "workers": ["a"], "x\nline 9: y": 1})
    )
    assert errors == [
        "line 1: x\\nline 9: y: unknown field; allowed here: name, type, kind, resources, workers, groups, "
        "environment, data, model, reservation, endpoint, autostop_minutes, region, preemptible"
    ]
    (long,) = _errors(BASE.replace("RTX 3090", "R" * 100_000))
    assert len(long) < 1100 and long.endswith("chars)")


@pytest.mark.parametrize(
    ("text", "title"),
    [
        (
            "apiVersion: batch/v1\nkind: Job\nmetadata: {name: pi}\nspec: {template: {}}\n",
            "a Kubernetes manifest",
        ),
        (
            "resources: {accelerators: 'A100:1'}\nsetup: pip install -r r.txt\nrun: python train.py\n",
            "a SkyPilot task YAML",
        ),
    ],
)
def test_a_format_rigbase_does_not_read_is_named_in_one_line(text: str, title: str, tmp_path: Path) -> None:
    """Operator paper cut: a Kubernetes manifest or a SkyPilot YAML came back as a list of unknown fields."""
    spec = tmp_path / "job.yaml"
    spec.write_text(text)
    provision = Path(sys.executable).parent / "provision"
    result = subprocess.run(
        [str(provision), "job", "convert", "-f", str(spec)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"error: this is {title}, which rigbase does not read: give a rigbase job spec, a ChainOpera Launch "
        "job.yaml, an OpenPAI job JSON or a trainML job form (docs/job-spec.md)"
    ]


# --- trainML's job form ---------------------------------------------------------------------------------


def test_trainml_forms_as_its_sdk_sends_them_convert_with_its_gpu_ids() -> None:
    """trainML's own examples (tests/provisioner/jobspecs/SOURCES.md): top-level resources and
    worker_commands, or the stored form with `resources`, `{command}` workers and `{key, value}` env."""
    cpu = read((EXAMPLES / "trainml-cpu-instance.yaml").read_text(), "job.yaml")
    assert cpu.format is SpecFormat.TRAINML
    assert cpu.spec.name == "cli-automated-tests-cpu-instance"
    assert cpu.spec.resources is not None
    assert (cpu.spec.resources.gpu_count, cpu.spec.resources.cpu_count) == (0, 4)  # gpu_types [cpu]
    assert cpu.spec.workers == ["python $ML_MODEL_PATH/pytorch/main.py"] and cpu.spec.data.datasets == [
        "MNIST"
    ]
    sweep = read((EXAMPLES / "trainml-sweep.json").read_text())
    assert sweep.spec.job_kind.value == "independent"  # trainML runs several workers as independent runs
    assert sweep.spec.resources is not None and sweep.spec.resources.gpu_types == ["RTX 2080 Ti", "RTX 3090"]
    assert sweep.spec.environment.env == {"WANDB_PROJECT": "cifar"} and len(sweep.spec.workers or []) == 2
    assert any("DEEPLEARNING_PY310" in note for note in sweep.notes)


def test_a_trainml_job_with_what_rigbase_does_not_read_yet_is_refused_naming_each_field() -> None:
    with pytest.raises(SpecError) as caught:
        read((EXAMPLES / "trainml-custom-container.yaml").read_text(), "job.yaml")
    assert [line.split(": ")[1] for line in caught.value.errors] == ["model"]
    assert caught.value.errors[0].startswith(
        "job.yaml:8: model: source_type 'git' with source_uri 'git@github.com:trainML/environment-tests.git'"
    )
    text = (EXAMPLES / "trainml-custom-container.yaml").read_text()
    # the same repository over https is a model source: `provision job create` makes it into a model
    https = read(text.replace("git@github.com:trainML/", "https://github.com/trainML/"))
    assert https.spec.model is not None
    assert https.spec.model.source == "git+https://github.com/trainML/environment-tests.git"
    # a trainml model is named; its wasabi output goes to the bucket at that endpoint
    converted = read(text.replace("  source_type: git", "  source_type: trainml"))
    assert converted.spec.model is not None
    assert converted.spec.model.name == "git@github.com:trainML/environment-tests.git"
    output = converted.spec.data.output
    assert output is not None
    assert (output.uri, output.endpoint_url) == (
        "s3://trainml-example/output/resnet_cifar10",
        "https://s3.wasabisys.com",
    )


def test_trainml_outputs_become_a_bucket_uri_or_a_new_object_named_after_the_job() -> None:
    base = {
        "name": "pipeline",
        "type": "training",
        "gpu_types": ["rtx3090"],
        "gpu_count": 1,
        "workers": ["x"],
    }
    for data, expected in [
        ({"output_type": "trainml", "output_uri": "model"}, ("model", "pipeline", None)),
        ({"output_type": "gcp", "output_uri": "gs://b/out"}, (None, None, "gs://b/out")),
        (
            {"output_type": "azure", "output_uri": "https://acme.blob.core.windows.net/runs/out"},
            (None, None, "azure://acme/runs/out"),
        ),
    ]:
        out = read(json.dumps({**base, "data": data})).spec.data.output
        assert out is not None and (out.kind, out.name, out.uri) == expected
    given = {"input_type": "azure", "input_uri": "https://acme.blob.core.windows.net/inbox/batch.zip"}
    inference = read(json.dumps({**base, "type": "inference", "data": given})).spec.data.input
    assert inference is not None and inference.uri == "azure://acme/inbox/batch.zip"
    for data, words in [
        ({"output_type": "aws", "output_uri": "gs://b"}, "an output_uri for aws begins with s3://"),
        ({"output_type": "local", "output_uri": "/tmp"}, "output_type 'local' is not written"),
        (
            {"output_type": "azure", "output_uri": "s3://b"},
            "an output_uri for azure is https://ACCOUNT.blob.core.windows.net/CONTAINER",
        ),
        (
            {"input_type": "local", "input_uri": "/data"},
            "input_type 'local' with input_uri '/data' is not read",
        ),
    ]:
        (line, *_) = _errors(json.dumps({**base, "data": data}))
        assert words in line, line


# --- Launch files as Launch reads them (FedML's own examples, tests/provisioner/jobspecs/SOURCES.md) --------


def test_launch_reads_the_posix_blocks_and_a_server_job_beside_the_job() -> None:
    multi = read((EXAMPLES / "chainopera-launch-fedml-multi-os.yaml").read_text())
    assert multi.spec.job_kind.value == "gang" and multi.spec.groups is not None
    server, client = multi.spec.groups
    assert (server.name, client.name) == ("server", "client")
    assert 'echo "I am a server job running on Posix"' in server.command
    assert "python3 hello_world.py" in client.command and "Windows" not in client.command
    assert any(note.startswith("job.run_on_windows: not run") for note in multi.notes)
    federated = read((EXAMPLES / "chainopera-launch-fedml-federated.yaml").read_text())
    assert [w.group for w in federated.spec.plan()] == ["server", "client"]
    assert "python3 torch_server.py" in federated.spec.plan()[0].command
    assert federated.spec.plan()[0].command.startswith(
        "cd /opt/ml/models\n# bootstrap\nbash config/bootstrap.sh"
    )


def test_launch_reads_job_type_then_task_type_and_its_docker_image() -> None:
    train = read((EXAMPLES / "chainopera-launch-fedml-llm-train.yaml").read_text())
    assert train.spec.type is JobType.TRAINING  # task_type: train (no job_type)
    serve = read((EXAMPLES / "chainopera-launch-fedml-serve-mnist.yaml").read_text())
    assert serve.spec.type is JobType.ENDPOINT  # job_type: deploy
    both = yaml.safe_load((EXAMPLES / "chainopera-launch-fedml-llm-train.yaml").read_text())
    assert read(yaml.safe_dump({**both, "task_type": "serve"})).spec.type is JobType.ENDPOINT
    assert (
        read(yaml.safe_dump({**both, "job_type": "train", "task_type": "serve"})).spec.type
        is JobType.TRAINING
    )
    container = read((EXAMPLES / "chainopera-launch-fedml-container.yaml").read_text())
    assert container.spec.environment.image == "fedml/fedml-default-launch:cu12.1-u22.04"
    private = {**both, "docker": {"image": "team/trainer:1", "registry": "ghcr.io", "password": "x"}}
    parsed = read(yaml.safe_dump(private))
    assert parsed.spec.environment.image == "ghcr.io/team/trainer:1"
    assert any("provision project key set" in note for note in parsed.notes)


def test_openpai_json_with_comments_is_read_as_openpais_portal_reads_it() -> None:
    """The portal strips `//` and `/* */` comments before it parses (src/webportal job-submit-v1, with
    strip-json-comments); a comment-like text inside a string stays as it is."""
    text = (EXAMPLES / "openpai-distributed.json").read_text()
    commented = text.replace('"jobName"', '// the job\n  "jobName"').replace(
        '"gpuType"', '/* any V100 */ "gpuType"'
    )
    commented = commented.replace('"TF_CPP_MIN_LOG_LEVEL": "2"', '"URL": "http://example.org/a//b"')
    parsed = read(commented, "job.json")
    assert parsed.format is SpecFormat.OPENPAI and parsed.spec.name == "tensorflow-distributed"
    assert parsed.spec.environment.env == {"URL": "http://example.org/a//b"}
    with pytest.raises(SpecError, match="not valid JSON"):
        read(commented.replace('"image"', '// no comma follows\n "image" "x",'), "job.json")
