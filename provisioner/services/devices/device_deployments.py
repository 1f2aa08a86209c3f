"""What each device runs: its configuration, the revision deployed, and what its minion reports of it.

`set-config` chooses a device's configuration (at its latest revision); `deploy` sends that revision to
the device, `deploy --latest` the configuration's newest one. Each deploy gets a new generation, so the
minion replaces the container (docs/devices.md, "Deploy"). The device learns it over the heartbeat
(the heartbeat key `device_config`: contracts.device.DeviceDesired) and reports its inference container
under the same key (contracts.device.DeviceActual); there is no inbound connection to a device. Only an
active device is sent its inference: one still provisioning runs nothing yet."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.data_objects import ObjectKind
from contracts.device import (
    CHECKPOINTS_PATH,
    MODEL_PATH,
    DeviceActual,
    DeviceDesired,
    DeviceInference,
    InferenceState,
)
from contracts.errors import InvalidInput, RuleViolation
from contracts.jobs import OUTPUT_PATH, DatastoreAccess, Mount, MountSource
from provisioner.domain.states import NodeState, ObjectState, Service
from provisioner.services.common import audit
from provisioner.services.common.errors import flush
from provisioner.services.devices import device_configs
from provisioner.services.fleet import nodes
from provisioner.services.jobs import job_assignments
from provisioner.store.data_models import DataObject
from provisioner.store.device_models import DeviceConfig, DeviceDeployment
from provisioner.store.models import Node

log = logging.getLogger("rigbase.devices")

# where the region cache keeps models and checkpoints on a device (docs/devices.md)
MODELS_DIR = "/models"
CHECKPOINTS_DIR = "/checkpoints"


def device(session: Session, ref: str, region: str | None = None) -> Node:
    """The live device named (or with the id) `ref`; a node of another service is refused."""
    node = nodes.get(session, ref, region)
    if Service(node.service) is not Service.DEVICE:
        raise InvalidInput(
            f"'{node.name}' in region '{node.region.name}' is a {node.service} node, not a device: device "
            "configurations run on devices only",
            code="not_a_device",
        )
    return node


def deployment_of(session: Session, node: Node) -> DeviceDeployment | None:
    return session.get(DeviceDeployment, node.id)


def _audit(session: Session, node: Node, actor: str, reason: str) -> None:
    """A line in the device's history (its state does not change)."""
    audit.record(
        session,
        kind="node",
        resource_id=node.id,
        name=node.name,
        actor=actor,
        from_state=node.state,
        to_state=node.state,
        reason=reason,
    )


def set_config(
    session: Session, ref: str, config_ref: str, *, region: str | None = None, actor: str
) -> DeviceDeployment:
    """Choose the device's configuration (its latest revision); the device runs it after `deploy`."""
    node = device(session, ref, region)
    config = device_configs.get(session, config_ref, node.region.name)
    dep = deployment_of(session, node)
    if dep is None:
        dep = DeviceDeployment(node_id=node.id, node=node, deploys=0)
        session.add(dep)
    dep.config_id, dep.config, dep.revision = config.id, config, config.latest_revision
    _audit(
        session,
        node,
        actor,
        f"configuration {config.name} revision {config.latest_revision} set: `provision device deploy "
        f"{node.name}` runs it",
    )
    flush(session, f"the configuration of device '{node.name}'")
    return dep


def _deploy(session: Session, node: Node, dep: DeviceDeployment, latest: bool, actor: str) -> None:
    config = dep.config
    if config is None or dep.config_id is None:
        raise InvalidInput(
            f"device '{node.name}' has no configuration: `provision device set-config {node.name} CONFIG` "
            "first",
            code="no_device_config",
        )
    device_configs.get(session, config.id)  # refused with its name when the configuration was removed
    if latest or dep.revision is None:
        dep.revision = config.latest_revision
    dep.deploys += 1
    dep.deployed_revision = dep.revision
    dep.generation = f"{config.id}.r{dep.revision}.d{dep.deploys}"
    dep.deployed_at = datetime.now(UTC)
    dep.inference_state = InferenceState.DEPLOYING.value
    dep.inference_message = dep.last_lines = dep.exit_code = dep.reported_generation = None
    _audit(session, node, actor, f"deployed configuration {config.name} revision {dep.revision}")


def deploy(
    session: Session, ref: str, *, region: str | None = None, latest: bool = False, actor: str
) -> DeviceDeployment:
    node = device(session, ref, region)
    dep = deployment_of(session, node)
    if dep is None:
        raise InvalidInput(
            f"device '{node.name}' has no configuration: `provision device set-config {node.name} CONFIG` "
            "first",
            code="no_device_config",
        )
    _deploy(session, node, dep, latest, actor)
    flush(session, f"the deploy of device '{node.name}'")
    return dep


def deploy_all(
    session: Session, config_ref: str, *, region: str | None = None, latest: bool = False, actor: str
) -> list[DeviceDeployment]:
    """Deploy every live device set to this configuration."""
    config = device_configs.get(session, config_ref, region)
    deps = [
        d
        for d in session.scalars(select(DeviceDeployment).where(DeviceDeployment.config_id == config.id))
        if NodeState(d.node.state) is not NodeState.REMOVED
    ]
    if not deps:
        raise RuleViolation(
            f"no device is set to configuration '{config.name}': `provision device set-config DEVICE "
            f"{config.name}` first",
            code="no_device_with_config",
        )
    for dep in sorted(deps, key=lambda d: d.node.name):
        _deploy(session, dep.node, dep, latest, actor)
    flush(session, f"the deploys of configuration '{config.name}'")
    return deps


def list_deployments(session: Session, region: str | None = None) -> list[DeviceDeployment]:
    stmt = select(DeviceDeployment).join(Node, Node.id == DeviceDeployment.node_id)
    stmt = stmt.where(Node.state != NodeState.REMOVED)
    rows = list(session.scalars(stmt))
    if region:
        rows = [d for d in rows if d.node.region.name == region]
    return sorted(rows, key=lambda d: (d.node.region.name, d.node.name))


# ------------------------------------------------------------------ the heartbeat


def _public_object(session: Session, kind: ObjectKind, name: str) -> DataObject | None:
    """The newest ready public object of that kind and name: the fleet's own models and checkpoints,
    which the root account's admins make (docs/data.md)."""
    return session.scalar(
        select(DataObject)
        .where(
            DataObject.kind == kind.value,
            DataObject.name == name,
            DataObject.public.is_(True),
            DataObject.state == ObjectState.READY.value,
        )
        .order_by(DataObject.created_at.desc())
        .limit(1)
    )


def _object_mount(session: Session, kind: ObjectKind, name: str, target: str) -> Mount | None:
    """A configuration's model or checkpoint as the public object of its name, read from the region's
    cache; None when there is none (then it is a directory of the region cache, as placed by hand)."""
    obj = _public_object(session, kind, name)
    if obj is None or obj.digest is None:
        return None
    return Mount(
        source_kind=MountSource.OBJECT,
        object_id=obj.id,
        digest=obj.digest,
        name=obj.name,
        target=target,
        read_only=True,
    )


def objects_in_region(session: Session, region_id: str) -> list[DataObject]:
    """The public objects the configurations deployed to the region's devices mount: the region's
    storage node keeps them in its cache (services/objects/node_caches.py)."""
    deps = session.scalars(
        select(DeviceDeployment)
        .join(Node, Node.id == DeviceDeployment.node_id)
        .where(Node.region_id == region_id, Node.state != NodeState.REMOVED)
    )
    found: dict[str, DataObject] = {}
    for dep in deps:
        if dep.config is None or dep.deployed_revision is None:
            continue
        spec = device_configs.revision_of(session, dep.config, dep.deployed_revision).spec
        wanted = [(ObjectKind.MODEL, spec["model"])] + [
            (ObjectKind.CHECKPOINT, c) for c in spec["checkpoints"]
        ]
        for kind, name in wanted:
            obj = _public_object(session, kind, name)
            if obj is not None:
                found[obj.id] = obj
    return list(found.values())


def inference_of(
    session: Session, node: Node, dep: DeviceDeployment, config: DeviceConfig
) -> DeviceInference:
    assert dep.deployed_revision is not None and dep.generation is not None
    revision = device_configs.revision_of(session, config, dep.deployed_revision)
    spec = revision.spec
    mounts = [
        _object_mount(session, ObjectKind.MODEL, spec["model"], MODEL_PATH)
        or Mount(
            source_kind=MountSource.CACHE,
            path=f"{MODELS_DIR}/{spec['model']}",
            target=MODEL_PATH,
            read_only=True,
        )
    ]
    mounts += [
        _object_mount(session, ObjectKind.CHECKPOINT, c, f"{CHECKPOINTS_PATH}/{c}")
        or Mount(
            source_kind=MountSource.CACHE,
            path=f"{CHECKPOINTS_DIR}/{c}",
            target=f"{CHECKPOINTS_PATH}/{c}",
            read_only=True,
        )
        for c in spec["checkpoints"]
    ]
    datastores: list[DatastoreAccess] = []
    if spec.get("datastore"):
        mounts.append(
            Mount(
                source_kind=MountSource.DATASTORE,
                datastore=spec["datastore"],
                path=spec["datastore_path"],
                target=OUTPUT_PATH,
            )
        )
        datastores = job_assignments.datastore_access(session, config.region_id, {spec["datastore"]})
    return DeviceInference(
        config=config.name,
        config_id=config.id,
        revision=revision.revision,
        generation=dep.generation,
        image=spec["image"],
        command=spec["command"],
        env={**spec["env"], **device_configs.keys_of(session, revision)},
        mounts=mounts,
        datastores=datastores,
    )


def desired_for_node(session: Session, node: Node) -> dict[str, Any] | None:
    """A device's inference (None: run nothing); nothing at all for other nodes."""
    if Service(node.service) is not Service.DEVICE:
        return None
    dep = deployment_of(session, node)
    inference = None
    if (
        dep is not None
        and dep.config is not None
        and dep.deployed_revision is not None
        and NodeState(node.state) is NodeState.ACTIVE
    ):
        try:
            inference = inference_of(session, node, dep, dep.config)
        except ValidationError as exc:  # never take the heartbeat down: the device runs nothing, logged
            log.warning(  # without the inputs: they hold the keys
                "device %s: its configuration cannot be sent: %s",
                node.name,
                exc.errors(include_input=False)[:3],
            )
    return DeviceDesired(inference=inference).model_dump(mode="json")


def record_actual(session: Session, node: Node, reported: Any) -> None:
    """The inference report of the current deploy (a report of an older deploy is ignored)."""
    if Service(node.service) is not Service.DEVICE:
        return
    try:
        actual = DeviceActual.model_validate(reported)
    except ValidationError as exc:
        log.warning("device %s sent a report the contract refuses: %s", node.name, exc.errors()[:3])
        return
    dep = deployment_of(session, node)
    report = actual.inference
    if dep is None or dep.generation is None:
        return
    if report is None:
        if actual.message and dep.inference_message != actual.message:
            dep.inference_state, dep.inference_message = InferenceState.FAILED.value, actual.message
            flush(session, f"the status of device '{node.name}'")
        return
    if report.generation != dep.generation and not report.generation.startswith(dep.generation + "."):
        return
    now = (
        report.state.value,
        report.message or actual.message,
        report.exit_code,
        report.last_lines,
        report.generation,
    )
    held = (
        dep.inference_state,
        dep.inference_message,
        dep.exit_code,
        dep.last_lines,
        dep.reported_generation,
    )
    if now == held:
        return
    (
        dep.inference_state,
        dep.inference_message,
        dep.exit_code,
        dep.last_lines,
        dep.reported_generation,
    ) = now
    dep.reported_at = datetime.now(UTC)
    flush(session, f"the status of device '{node.name}'")


def status(session: Session, node: Node) -> dict[str, Any]:
    """Configuration Status and Inference Status, as `device show` and `device status` print them."""
    dep = deployment_of(session, node)
    config = dep.config if dep is not None else None
    return {
        "device": node.name,
        "device_id": node.id,
        "region": node.region.name,
        "config": config.name if config is not None else None,
        "config_revision": dep.revision if dep is not None else None,
        "latest_revision": config.latest_revision if config is not None else None,
        "deployed_revision": dep.deployed_revision if dep is not None else None,
        "deployed_at": dep.deployed_at if dep is not None else None,
        "generation": dep.generation if dep is not None else None,
        "inference_status": dep.inference_state if dep is not None else None,
        "inference_message": dep.inference_message if dep is not None else None,
        "exit_code": dep.exit_code if dep is not None else None,
        "last_lines": dep.last_lines if dep is not None else None,
        "reported_at": dep.reported_at if dep is not None else None,
    }
