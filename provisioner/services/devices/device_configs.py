"""Device configurations: the inference container a device runs (docs/devices.md, "Configurations").

A configuration is named per region (the name may be reused in another region) and kept as revisions:
`update` adds a revision with the fields it changes, so devices go on running the revision they were
deployed with until they are deployed again. The datastore must be in the configuration's region and the
path below its root is checked with the node's own rule (contracts.regional.requested_parts), so a path
can never climb above the root. Keys (third-party credentials, NAME=VALUE) are sealed at rest and never
returned: the API shows their names only."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts import images
from contracts.errors import Conflict, InvalidInput, RuleViolation
from contracts.regional import check_one_line, requested_parts
from provisioner.domain.states import DEVICE_CONFIG_TRANSITIONS, DatastoreState, DeviceConfigState, NodeState
from provisioner.services.common import audit, lifecycle, names
from provisioner.services.common.errors import flush
from provisioner.services.common.runtime import runtime_of
from provisioner.services.regions import regional_lookup
from provisioner.services.regions import regions as region_service
from provisioner.store.device_models import DeviceConfig, DeviceConfigRevision, DeviceDeployment
from provisioner.store.models import new_id
from provisioner.store.regional_models import Datastore

KIND = "device-config"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# the names the container gets from rigbase itself (contracts/device.py): a configuration may not set them
RESERVED_ENV = frozenset(
    {"TRAINML_OUTPUT_PATH", "RIGBASE_OUTPUT_PATH", "TRAINML_MODEL_PATH", "TRAINML_CHECKPOINT_PATH"}
)
MAX_ENV = 128
MAX_CHECKPOINTS = 32
MAX_COMMAND = 64 * 1024


@dataclass(frozen=True)
class Fields:
    """What `device-config add` and `update` take; None in an update keeps the revision's value."""

    image: str | None = None
    model: str | None = None
    command: str | None = None
    checkpoints: list[str] | None = None
    datastore: str | None = None
    datastore_path: str | None = None
    env: dict[str, str] | None = None
    keys: dict[str, str] | None = None


def transition(
    session: Session, config: DeviceConfig, to: DeviceConfigState, *, actor: str, reason: str | None = None
) -> None:
    lifecycle.apply(
        session,
        config,
        to,
        kind=KIND,
        name=config.name,
        table=DEVICE_CONFIG_TRANSITIONS,
        actor=actor,
        reason=reason,
    )


def _env(kind: str, values: dict[str, str]) -> dict[str, str]:
    if len(values) > MAX_ENV:
        raise InvalidInput(f"at most {MAX_ENV} {kind}s: put the rest in the image", code="too_many_env")
    for name, value in values.items():
        if not ENV_NAME.fullmatch(name):
            raise InvalidInput(
                f"{kind} name {name!r} is not a variable name: use letters, digits and _, not starting with "
                "a digit",
                code="invalid_env",
            )
        if name in RESERVED_ENV:
            raise InvalidInput(
                f"{kind} {name} is set by rigbase itself: choose another name", code="invalid_env"
            )
        if any(c in value for c in "\n\r\0"):
            raise InvalidInput(f"{kind} {name} contains a line break: use one line", code="invalid_env")
    return dict(values)


def _cache_name(kind: str, name: str) -> str:
    """A model or checkpoint is a directory of the region cache: one path segment, nothing above it."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", name):
        raise InvalidInput(
            f"{kind} {name!r} is not a name: use letters, digits, '.', '_' and '-' (a directory of the "
            "region cache)",
            code=f"invalid_{kind}",
        )
    return name


def _datastore(session: Session, region_id: str, region: str, name: str) -> Datastore:
    ds = regional_lookup.holder(session, Datastore, region_id, name=name)
    if ds is None or DatastoreState(ds.state) is not DatastoreState.ACTIVE:
        raise InvalidInput(
            f"datastore '{name}' does not exist in region '{region}': a configuration uses a datastore of "
            "its own region (`provision datastore list --region {region}`)".replace("{region}", region),
            code="datastore_not_in_region",
        )
    return ds


def _spec(session: Session, config_region_id: str, region: str, f: Fields) -> dict[str, Any]:
    """The checked spec of one revision (every field present)."""
    if not f.image or not images.is_registry_reference(f.image):
        raise InvalidInput(f"--image {images.REFUSAL}", code="invalid_image")
    if not f.command or not f.command.strip():
        raise InvalidInput("--command must say what the container runs", code="invalid_command")
    if len(f.command) > MAX_COMMAND or "\0" in f.command:
        raise InvalidInput(f"--command must be at most {MAX_COMMAND} characters", code="invalid_command")
    if not f.model:
        raise InvalidInput("--model must name the model to mount (a directory of the region cache)")
    checkpoints = list(f.checkpoints or [])
    if len(checkpoints) > MAX_CHECKPOINTS or len(set(checkpoints)) != len(checkpoints):
        raise InvalidInput(f"give each checkpoint once, at most {MAX_CHECKPOINTS}", code="invalid_checkpoint")
    if (f.datastore is None) != (f.datastore_path is None):
        raise InvalidInput(
            "--datastore and --datastore-path go together: the output is the path below the datastore's root",
            code="datastore_path_needs_datastore",
        )
    path = None
    if f.datastore is not None and f.datastore_path is not None:
        names.dns_label("datastore", f.datastore)
        _datastore(session, config_region_id, region, f.datastore)
        check_one_line("datastore path", f.datastore_path)
        path = "/" + "/".join(requested_parts(f.datastore_path))  # refuses '..' and NUL with how to write it
    return {
        "image": f.image,
        "model": _cache_name("model", f.model),
        "command": f.command,
        "checkpoints": [_cache_name("checkpoint", c) for c in checkpoints],
        "datastore": f.datastore,
        "datastore_path": path,
        "env": _env("environment variable", f.env or {}),
    }


def _sealed(session: Session, keys: dict[str, str]) -> str | None:
    _env("key", keys)
    return runtime_of(session).sealer.seal(json.dumps(keys).encode()) if keys else None


def keys_of(session: Session, revision: DeviceConfigRevision) -> dict[str, str]:
    """The revision's keys, unsealed (only for the desired state of a device that runs it)."""
    if revision.sealed_keys is None:
        return {}
    keys: dict[str, str] = json.loads(runtime_of(session).sealer.unseal(revision.sealed_keys))
    return keys


def key_names(session: Session, revision: DeviceConfigRevision) -> list[str]:
    return sorted(keys_of(session, revision))


def add(session: Session, name: str, *, region: str, fields: Fields, actor: str) -> DeviceConfig:
    names.dns_label("device configuration", name)
    reg = region_service.get(session, region)
    spec = _spec(session, reg.id, reg.name, fields)
    sealed = _sealed(session, fields.keys or {})
    if regional_lookup.holder(session, DeviceConfig, reg.id, name=name) is not None:
        raise Conflict(
            f"device configuration '{name}' already exists in region '{reg.name}': choose another name or "
            f"`provision device-config update {name}`",
            code="duplicate_name",
        )
    config = DeviceConfig(id=new_id("dcf"), name=name, region=reg, latest_revision=1)
    session.add(config)
    transition(session, config, DeviceConfigState.ACTIVE, actor=actor, reason="added by operator: revision 1")
    session.add(
        DeviceConfigRevision(config_id=config.id, revision=1, spec=spec, sealed_keys=sealed, created_by=actor)
    )
    flush(session, f"device configuration '{name}'")
    return config


def list_all(session: Session, region: str | None = None) -> list[DeviceConfig]:
    return regional_lookup.list_live(session, DeviceConfig, region)


def get(session: Session, ref: str, region: str | None = None) -> DeviceConfig:
    return regional_lookup.get_live(session, DeviceConfig, KIND, ref, region)


def revision_of(session: Session, config: DeviceConfig, revision: int | None = None) -> DeviceConfigRevision:
    number = config.latest_revision if revision is None else revision
    row = session.scalar(
        select(DeviceConfigRevision).where(
            DeviceConfigRevision.config_id == config.id, DeviceConfigRevision.revision == number
        )
    )
    if row is None:
        raise InvalidInput(
            f"device configuration '{config.name}' has revisions 1-{config.latest_revision}",
            code="no_such_revision",
        )
    return row


def update(session: Session, ref: str, *, region: str | None, fields: Fields, actor: str) -> DeviceConfig:
    """A new revision: the latest one's fields with those given replaced (keys: all or none replaced)."""
    config = get(session, ref, region)
    latest = revision_of(session, config)
    old = latest.spec
    merged = Fields(
        image=fields.image if fields.image is not None else old["image"],
        model=fields.model if fields.model is not None else old["model"],
        command=fields.command if fields.command is not None else old["command"],
        checkpoints=fields.checkpoints if fields.checkpoints is not None else old["checkpoints"],
        datastore=fields.datastore if fields.datastore is not None else old["datastore"],
        datastore_path=fields.datastore_path if fields.datastore_path is not None else old["datastore_path"],
        env=fields.env if fields.env is not None else old["env"],
    )
    spec = _spec(session, config.region_id, config.region.name, merged)
    sealed = _sealed(session, fields.keys) if fields.keys is not None else latest.sealed_keys
    if spec == old and sealed == latest.sealed_keys:
        raise InvalidInput(
            f"nothing to change in device configuration '{config.name}': give the fields to change",
            code="no_change",
        )
    config.latest_revision += 1
    session.add(
        DeviceConfigRevision(
            config_id=config.id,
            revision=config.latest_revision,
            spec=spec,
            sealed_keys=sealed,
            created_by=actor,
        )
    )
    audit.record(  # active → active: a history line per revision
        session,
        kind=KIND,
        resource_id=config.id,
        name=config.name,
        actor=actor,
        from_state=DeviceConfigState.ACTIVE.value,
        to_state=DeviceConfigState.ACTIVE.value,
        reason=f"updated by operator: revision {config.latest_revision}",
    )
    flush(session, f"device configuration '{config.name}'")
    return config


def remove(session: Session, ref: str, *, region: str | None = None, actor: str) -> DeviceConfig:
    config = get(session, ref, region)
    users = session.scalars(select(DeviceDeployment).where(DeviceDeployment.config_id == config.id)).all()
    live = sorted(d.node.name for d in users if NodeState(d.node.state) is not NodeState.REMOVED)
    if live:
        raise RuleViolation(
            f"device configuration '{config.name}' is set on device(s) {', '.join(live)}: set them to "
            "another configuration (`provision device set-config`) or remove them first",
            code="device_config_in_use",
        )
    transition(session, config, DeviceConfigState.REMOVED, actor=actor, reason="removed by operator")
    return config
