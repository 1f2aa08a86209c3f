"""One CLI style for the three programs, through the real executables: `--version`
(the client's, and for `provision` the server's when it answers), `-h`, shell completion, usage errors as
one `error: …` line with exit 2, and no pydantic wording in messages."""

from __future__ import annotations

import subprocess
from importlib import metadata

import pytest

from contracts.errors import plain_validation_message
from tests.fixtures.control_plane import PROVISION, ControlPlane

BIN = PROVISION.parent
VERSION = metadata.version("rigbase")


def _run(program: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / program), *args], capture_output=True, text=True, timeout=60, env=env)


def test_provision_version_names_client_and_server(api_server: ControlPlane) -> None:
    out = api_server.provision("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"client: {VERSION}", f"server: {VERSION}"]
    gone = subprocess.run(
        [str(PROVISION), "--version"],
        capture_output=True,
        text=True,
        env=api_server.env | {"RIGBASE_URL": "http://127.0.0.1:9"},
        timeout=60,
    )
    assert gone.returncode == 0 and gone.stdout.splitlines()[0] == f"client: {VERSION}"
    assert gone.stdout.splitlines()[1].startswith("server: unreachable")


@pytest.mark.parametrize("program", ["provision", "minion", "image-builder"])
def test_version_help_and_completion(program: str) -> None:
    out = _run(program, "--version")
    assert out.returncode == 0 and f": {VERSION}" in out.stdout.splitlines()[0], out.stderr
    short, long = _run(program, "-h"), _run(program, "--help")
    assert short.returncode == 0 and short.stdout == long.stdout and "--install-completion" in short.stdout
    completion = _run(program, "--show-completion", "bash")
    assert completion.returncode == 0 and "complete" in completion.stdout


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["provision", "node", "add", "gpu-1"], "Missing option '--region'"),
        (["provision", "nodes", "list"], "No such command 'nodes'"),
        (["provision", "node", "list", "--bogus"], "No such option: --bogus"),
        (["provision", "node", "list", "-o", "xml"], "'xml' is not one of"),
        (["provision", "region", "join-token"], "Missing argument 'region'"),
        (["minion", "inventory", "--bogus"], "No such option: --bogus"),
        (["minion", "nope"], "No such command 'nope'"),
        (["image-builder", "build", "--bogus"], "No such option: --bogus"),
    ],
)
def test_usage_errors_are_one_line(argv: list[str], says: str) -> None:
    out = _run(*argv)
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error: ") and says in lines[0] and "--help`" in lines[0]
    assert "Usage:" not in out.stderr and "╭" not in out.stderr


def test_no_pydantic_wording() -> None:
    """The server's 422 answers (provisioner/api/errors.py) and settings errors pass messages through this."""
    assert (
        plain_validation_message("Value error, nested deeper than 8 levels") == "nested deeper than 8 levels"
    )
    assert plain_validation_message("Assertion failed, x") == "x"
    assert plain_validation_message("Field required") == "Field required"
