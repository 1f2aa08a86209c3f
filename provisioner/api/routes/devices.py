"""Device configurations and what devices run: /v1/device-configs (add, list, show, update, remove),
/v1/nodes/{ref}/device-config (set), /v1/nodes/{ref}/deploy, /v1/device-configs/{ref}/deploy (every device
set to it), /v1/nodes/{ref}/device-status and /v1/nodes/{ref}/device-logs. And the minion's log route,
POST /v1/nodes/{node_id}/device/logs (node credential). A configuration's keys go in, never out: answers
carry their names only."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from contracts.device import DEVICE_LOG_ROUTE
from contracts.jobs import INT32_END, INT64_END, LogAck, LogChunk
from provisioner.api.deps import Db, NodeCredential, Operator
from provisioner.api.errors import NODE_ERRORS, documented
from provisioner.api.schemas import Page
from provisioner.services.devices import device_configs as configs
from provisioner.services.devices import device_deployments as deployments
from provisioner.services.devices import device_logs
from provisioner.store.device_models import DeviceConfig

router = APIRouter(tags=["devices"])
node_router = APIRouter(tags=["devices"])  # node credential auth (the app's OPEN_ROUTERS)
MAX_VALUE = 32 * 1024  # one environment variable or key (contracts.jobs.MAX_ENV_VALUE)


Text = Annotated[str, Field(max_length=MAX_VALUE)]
Name = Annotated[str, Field(max_length=128)]


class ConfigFields(BaseModel):
    image: str | None = Field(None, max_length=512, description="container image the device runs")
    model: str | None = Field(
        None, max_length=128, description="model: a directory of the region cache, mounted read-only"
    )
    command: str | None = Field(
        None, max_length=64 * 1024, description="run with /bin/sh -c in the container"
    )
    checkpoints: list[Name] | None = Field(
        None, max_length=configs.MAX_CHECKPOINTS, description="checkpoints of the region cache, read-only"
    )
    datastore: str | None = Field(
        None, max_length=63, description="a datastore of the configuration's region"
    )
    datastore_path: str | None = Field(
        None, max_length=4096, description="below the datastore's root; mounted at the output"
    )
    env: dict[Name, Text] | None = Field(None, max_length=configs.MAX_ENV)
    keys: dict[Name, Text] | None = Field(
        None,
        max_length=configs.MAX_ENV,
        description="third-party credentials NAME=VALUE: sealed at rest, never returned",
    )

    def fields(self) -> configs.Fields:
        return configs.Fields(**self.model_dump(include=set(ConfigFields.model_fields)))


class ConfigIn(ConfigFields):
    name: str = Field(max_length=63)
    region: str = Field(max_length=63)


class ConfigOut(BaseModel):
    id: str
    name: str
    region: str
    state: str
    revision: int
    image: str
    model: str
    command: str
    checkpoints: list[str]
    datastore: str | None
    datastore_path: str | None
    env: dict[str, str]
    keys: list[str] = Field(description="the names of its keys; their values are never returned")
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, session: Session, c: DeviceConfig, revision: int | None = None) -> ConfigOut:
        rev = configs.revision_of(session, c, revision)
        return cls(
            id=c.id,
            name=c.name,
            region=c.region.name,
            state=c.state,
            revision=rev.revision,
            keys=configs.key_names(session, rev),
            created_at=c.created_at,
            updated_at=c.updated_at,
            **rev.spec,
        )


class SetConfigIn(BaseModel):
    config: str = Field(max_length=63)


class DeployIn(BaseModel):
    latest: bool = Field(False, description="deploy the configuration's latest revision")


class DeviceStatusOut(BaseModel):
    device: str
    device_id: str
    region: str
    config: str | None
    config_revision: int | None
    latest_revision: int | None
    deployed_revision: int | None
    deployed_at: datetime | None
    generation: str | None
    inference_status: str | None
    inference_message: str | None
    exit_code: int | None
    last_lines: str | None
    reported_at: datetime | None


class DeviceLogOut(BaseModel):
    device: str
    generation: str | None
    inference_status: str | None
    offset: int
    next_offset: int
    data: str
    complete: bool


@router.post("/v1/device-configs", status_code=201)
def add(body: ConfigIn, session: Db, actor: Operator) -> ConfigOut:
    return ConfigOut.of(
        session, configs.add(session, body.name, region=body.region, fields=body.fields(), actor=actor)
    )


@router.get("/v1/device-configs")
def list_configs(session: Db, region: str | None = None) -> Page[ConfigOut]:
    return Page(items=[ConfigOut.of(session, c) for c in configs.list_all(session, region)])


@router.get("/v1/device-configs/{ref}")
def show(
    ref: str, session: Db, region: str | None = None, revision: int | None = Query(None, ge=1, lt=INT32_END)
) -> ConfigOut:
    return ConfigOut.of(session, configs.get(session, ref, region), revision)


@router.patch("/v1/device-configs/{ref}")
def update(
    ref: str, body: ConfigFields, session: Db, actor: Operator, region: str | None = None
) -> ConfigOut:
    """A new revision with the fields given; devices keep the revision deployed until deployed again."""
    return ConfigOut.of(
        session, configs.update(session, ref, region=region, fields=body.fields(), actor=actor)
    )


@router.delete("/v1/device-configs/{ref}")
def remove(ref: str, session: Db, actor: Operator, region: str | None = None) -> ConfigOut:
    config = configs.get(session, ref, region)
    out = ConfigOut.of(session, config)
    configs.remove(session, config.id, actor=actor)
    return out.model_copy(update={"state": config.state})


@router.post("/v1/device-configs/{ref}/deploy")
def deploy_config(
    ref: str, body: DeployIn, session: Db, actor: Operator, region: str | None = None
) -> Page[DeviceStatusOut]:
    """Deploy every device set to this configuration."""
    deps = deployments.deploy_all(session, ref, region=region, latest=body.latest, actor=actor)
    return Page(items=[_status(session, d.node) for d in sorted(deps, key=lambda d: d.node.name)])


def _status(session: Session, node: Any) -> DeviceStatusOut:
    return DeviceStatusOut(**deployments.status(session, node))


@router.put("/v1/nodes/{ref}/device-config")
def set_config(
    ref: str, body: SetConfigIn, session: Db, actor: Operator, region: str | None = None
) -> DeviceStatusOut:
    dep = deployments.set_config(session, ref, body.config, region=region, actor=actor)
    return _status(session, dep.node)


@router.post("/v1/nodes/{ref}/deploy")
def deploy(
    ref: str, body: DeployIn, session: Db, actor: Operator, region: str | None = None
) -> DeviceStatusOut:
    dep = deployments.deploy(session, ref, region=region, latest=body.latest, actor=actor)
    return _status(session, dep.node)


@router.get("/v1/nodes/{ref}/device-status")
def device_status(ref: str, session: Db, region: str | None = None) -> DeviceStatusOut:
    """Configuration Status (revision, when deployed) and Inference Status (what the minion reports)."""
    return _status(session, deployments.device(session, ref, region))


@router.get("/v1/device-status")
def list_status(session: Db, region: str | None = None) -> Page[DeviceStatusOut]:
    """The status of every device that has a configuration."""
    return Page(items=[_status(session, d.node) for d in deployments.list_deployments(session, region)])


@router.get("/v1/nodes/{ref}/device-logs")
def logs(
    ref: str,
    session: Db,
    region: str | None = None,
    offset: int = Query(0, ge=0, lt=INT64_END),
    generation: str | None = Query(None, max_length=64),
) -> DeviceLogOut:
    """The inference container's output from `offset` (the newest container unless `generation`)."""
    page = device_logs.read(session, ref, region, offset, generation)
    return DeviceLogOut(**page.__dict__)


@node_router.post(DEVICE_LOG_ROUTE, responses={**NODE_ERRORS, **documented(404)})
def post_log(node_id: str, body: LogChunk, session: Db, credential: NodeCredential) -> LogAck:
    """The inference container's output from `offset` (idempotent by offset); the answer says how much is
    held."""
    return device_logs.append(session, node_id, credential, body)
