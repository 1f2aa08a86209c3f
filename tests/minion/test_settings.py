"""MinionSettings: each variable keeps its name and meaning (docs/join-protocol.md, "Settings"), unset and
empty both mean the default, and the `minion` callback loads them once into the command's context."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from minion.settings import DEFAULT_STATE_DIR, MinionSettings


def test_defaults_are_a_nodes() -> None:
    assert MinionSettings.from_env({}) == MinionSettings(
        state_dir=Path("/var/lib/rigbase/minion"), gpu_catalogue=None, lan_address=None
    )
    assert MinionSettings.from_env({}).state_dir == DEFAULT_STATE_DIR
    assert MinionSettings().event_log == Path("/sys/kernel/security/tpm0/binary_bios_measurements")


def test_every_variable_is_read() -> None:
    settings = MinionSettings.from_env(
        {
            "RIGBASE_STATE_DIR": "/tmp/minion-state",
            "RIGBASE_GPU_CATALOGUE": "/etc/gpus.yaml",
            "RIGBASE_LAN_ADDRESS": "192.168.1.20",
            "RIGBASE_EVENT_LOG": "/tmp/event-log.bin",
            "UNRELATED": "x",
        }
    )
    assert settings == MinionSettings(
        state_dir=Path("/tmp/minion-state"),
        gpu_catalogue=Path("/etc/gpus.yaml"),
        lan_address="192.168.1.20",
        event_log=Path("/tmp/event-log.bin"),
    )


def test_empty_means_default() -> None:
    empty = {
        "RIGBASE_STATE_DIR": "",
        "RIGBASE_GPU_CATALOGUE": "",
        "RIGBASE_LAN_ADDRESS": "",
        "RIGBASE_EVENT_LOG": "",
    }
    assert MinionSettings.from_env(empty) == MinionSettings()


def test_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        MinionSettings().lan_address = "10.0.0.1"


def test_the_minion_callback_loads_them_into_the_context() -> None:
    from minion.cli import app

    seen: list[MinionSettings] = []
    probe = typer.Typer()
    probe.registered_callback = app.registered_callback

    @probe.command("probe")
    def _probe(ctx: typer.Context) -> None:
        seen.append(MinionSettings.of(ctx))

    result = CliRunner().invoke(probe, ["probe"], env={"RIGBASE_STATE_DIR": "/tmp/from-env"})
    assert result.exit_code == 0, result.output
    assert seen == [MinionSettings(state_dir=Path("/tmp/from-env"))]
