"""The `device` section of a minion's inventory: what an edge device (an NVIDIA Jetson) is.

A Jetson minion adds it to the inventory it reports at join (`Inventory.device`, minion/hardware/model.py;
absent or null on a compute node). The control plane reads it to check that a device added with
`provision device add` really is one and to show its model; the minion fills it from the device tree and
the catalogue regions/jetson.yaml (minion/hardware/jetson.py). docs/devices.md describes each field.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Final

from pydantic import BaseModel, ConfigDict, Field, field_validator

from contracts.catalogue import device_models
from contracts.device_states import InferenceState
from contracts.images import RegistryImage
from contracts.jobs import ByteCount, DatastoreAccess, ExitCode, Mount, WorkerRunState

# The catalogue keys of regions/jetson.yaml `models`, in catalogue order (a test keeps the two equal).

# "R35.4.1": Jetson Linux release R<major>.<revision> as /etc/nv_tegra_release spells it
L4T_RELEASE_PATTERN: Final[str] = r"R\d+\.\d+(\.\d+)?"


class DeviceTpm(StrEnum):
    """How the device can prove who it is at join (docs/join-protocol.md)."""

    FIRMWARE = "firmware"  # Orin's firmware TPM: the same attested join as a node
    NONE = "none"  # Xavier: a device key made at first boot, accepted only where the region opts in


class DeviceReport(BaseModel):
    """One Jetson, as its minion found it. Unknown fields are refused so a typo cannot pass silently."""

    # `model` and `model_name` are this contract's words, not pydantic's reserved `model_` namespace
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    model: str = Field(description="catalogue key: a model of regions/jetson.yaml")
    model_name: str = Field(description="product name from the catalogue, e.g. 'NVIDIA Jetson AGX Orin'")
    device_tree_model: str = Field(description="/proc/device-tree/model as the carrier board sets it")
    module: str | None = Field(
        description="module part number found in `compatible` (e.g. 'p3701-0005'); null when the tree "
        "names only the developer kit and the variant was chosen by memory"
    )
    compatible: list[str] = Field(description="/proc/device-tree/compatible, most specific first")
    chip_id: int = Field(ge=0, description="Tegra chip id: 0x19 (25) Xavier, 0x23 (35) Orin")
    memory_gib: int = Field(gt=0, description="module memory in GiB (the variant's, not MemTotal)")
    l4t_release: str | None = Field(description="Jetson Linux release, e.g. 'R35.4.1'; null when unknown")
    jetpack: str | None = Field(description="JetPack release of that L4T, e.g. '5.1.2'; null if unknown")
    gpu_cores: int = Field(gt=0, description="CUDA cores of the integrated GPU")
    dla_count: int = Field(ge=0, description="NVDLA engines (0 on Orin Nano)")
    tpm: DeviceTpm
    video_devices: list[str] = Field(default_factory=list, description="/dev/video* (cameras, codecs)")
    media_devices: list[str] = Field(default_factory=list, description="/dev/media* (media controllers)")

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value not in (models := device_models()):
            raise ValueError(f"unknown device model '{value}'; one of {', '.join(models)}")
        return value

    @field_validator("l4t_release")
    @classmethod
    def _l4t_release(cls, value: str | None) -> str | None:
        if value is not None and re.fullmatch(L4T_RELEASE_PATTERN, value) is None:
            raise ValueError(f"L4T release '{value}' is not like 'R35.4.1'")
        return value

    @field_validator("video_devices", "media_devices")
    @classmethod
    def _device_paths(cls, value: list[str]) -> list[str]:
        for path in value:
            if not path.startswith("/dev/") or "/.." in path:
                raise ValueError(f"'{path}' is not a device node under /dev")
        return value


# ------------------------------------------------------------------ device configurations (inference)
# The heartbeat carries a device's configuration under desired["device_config"] (a DeviceDesired) and
# the minion reports what its inference container does under actual["device_config"] (a DeviceActual):
# contracts/heartbeat.py.
DEVICE_LOG_ROUTE: Final = "/v1/nodes/{node_id}/device/logs"
# Inside the inference container (docs/devices.md "What the container gets"); the output path under both
# the product rules' name and rigbase's own.
MODEL_PATH: Final = "/opt/ml/model"
CHECKPOINTS_PATH: Final = "/opt/ml/checkpoints"
OUTPUT_PATH_ENV: Final[tuple[str, ...]] = ("TRAINML_OUTPUT_PATH", "RIGBASE_OUTPUT_PATH")
LAST_LINES: Final = 20  # of an exited container's output, in its status
LAST_LINES_MAX: Final = 4096  # bytes of those lines


class DeviceInference(BaseModel):
    """The configuration revision a device must run: one container, started again after a reboot of the
    device but not when its command exits. `generation` names one deploy; a new one replaces the
    container. `env` carries the configuration's variables and its keys (sealed at rest on the control
    plane, unsealed only into this message)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    config: str = Field(min_length=1, max_length=63)
    config_id: str = Field(pattern=r"^[A-Za-z0-9_]{1,32}$")
    revision: int = Field(ge=1)
    generation: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,48}$")
    image: RegistryImage
    command: str = Field(min_length=1, max_length=64 * 1024)
    env: dict[str, str] = Field(default_factory=dict, repr=False)
    mounts: list[Mount] = Field(default_factory=list, max_length=34)
    datastores: list[DatastoreAccess] = Field(default_factory=list, max_length=1)


class DeviceDesired(BaseModel):
    """desired["device_config"]: the inference to run, or None (no configuration deployed: run nothing)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    inference: DeviceInference | None = None


class InferenceReport(BaseModel):
    """What the minion observes of the inference container of one deploy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    generation: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,48}$")
    state: InferenceState
    exit_code: ExitCode | None = None
    message: str | None = Field(None, max_length=1000)
    last_lines: str | None = Field(None, max_length=LAST_LINES_MAX)
    log_acked: ByteCount = 0


class DeviceActual(BaseModel):
    """actual["device_config"] in a heartbeat."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    inference: InferenceReport | None = None
    message: str | None = Field(None, max_length=1000)  # e.g. "podman is not installed"


# What the minion reports for each state of the container it runs (minion/jobs/worker.py's states):
# `stopped` is a container the minion replaced or was told to drop, which no deploy waits for.
INFERENCE_OF_RUN_STATE: Final[dict[WorkerRunState, InferenceState]] = {
    WorkerRunState.STARTING: InferenceState.DEPLOYING,
    WorkerRunState.RUNNING: InferenceState.RUNNING,
    WorkerRunState.EXITED: InferenceState.EXITED,
    WorkerRunState.STOPPED: InferenceState.EXITED,
    WorkerRunState.FAILED_TO_START: InferenceState.FAILED,
}
