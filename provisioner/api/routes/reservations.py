"""/v1/reservations: add, list, show (desired and actual, and the job serving it), remove, assign, unassign,
expose-wan, history."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel, Field

from provisioner.api.deps import Db, Operator
from provisioner.api.schemas import EventOut, Page
from provisioner.domain.states import ActualState, ReservationState
from provisioner.services.regions import reservations as service
from provisioner.store.regional_models import Reservation

router = APIRouter(prefix="/v1/reservations", tags=["reservations"])


class ReservationIn(BaseModel):
    name: str
    region: str
    hostname: str = Field(description="DNS label, published as HOSTNAME.local")
    port: int = Field(description="1-65535, unique in the region")
    protocol: str = "tcp"
    expose_wan: bool = Field(
        default=False, description="map the port on the router (UPnP, nodes with UPnP on); default LAN-only"
    )


class AssignIn(BaseModel):
    node: str


class ExposeWanIn(BaseModel):
    expose_wan: bool


class DesiredOut(BaseModel):
    state: str
    node: str | None = Field(description="the node an operator assigned it to")
    node_id: str | None
    job: str | None = Field(default=None, description="the live job holding it (it moves with the job)")
    job_id: str | None = None
    expose_wan: bool = False


class ActualOut(BaseModel):
    state: str | None = Field(
        description="pending until the node reports; then published, mapped, conflict or error"
    )
    reason: str | None
    address: str | None = Field(description="LAN address HOST.local resolves to")
    external_address: str | None = Field(description="IP:PORT reachable from outside when mapped over UPnP")
    mdns: str | None
    upnp: str | None
    reported_at: datetime | None


class ReservationOut(BaseModel):
    id: str
    name: str
    region: str
    region_id: str
    hostname: str
    fqdn: str
    port: int
    protocol: str
    expose_wan: bool = Field(description="the router maps the port (UPnP); false: LAN-only")
    state: str = Field(
        description="unassigned; for one a node serves (assigned, or a job's): the node's actual state"
    )
    node: str | None = Field(description="the node that publishes it: the assigned one, or the job's")
    job: str | None = Field(description="the live job holding it, if any")
    desired: DesiredOut
    actual: ActualOut
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, r: Reservation, serving: service.JobServing | None = None) -> ReservationOut:
        assigned = r.node.name if r.node is not None else None
        node = assigned or (serving.node.name if serving is not None and serving.node is not None else None)
        current = service.actual_is_current(r, serving)
        served = r.state == ReservationState.ASSIGNED or node is not None
        shown = ((r.actual_state if current else None) or ActualState.PENDING.value) if served else r.state
        return cls(
            id=r.id,
            name=r.name,
            region=r.region.name,
            region_id=r.region_id,
            hostname=r.hostname,
            fqdn=f"{r.hostname}.local",
            port=r.port,
            protocol=r.protocol,
            expose_wan=r.expose_wan,
            state=shown,
            node=node,
            job=serving.job.name if serving is not None else None,
            desired=DesiredOut(
                state=r.state,
                node=assigned,
                node_id=r.node_id,
                job=serving.job.name if serving is not None else None,
                job_id=serving.job.id if serving is not None else None,
                expose_wan=r.expose_wan,
            ),
            actual=ActualOut(
                state=r.actual_state if current else None,
                reason=r.actual_reason if current else None,
                address=r.address if current else None,
                external_address=r.external_address if current else None,
                mdns=r.mdns if current else None,
                upnp=r.upnp if current else None,
                reported_at=r.reported_at if current else None,
            ),
            created_at=r.created_at,
            updated_at=r.updated_at,
        )


@router.post("", status_code=201)
def add(body: ReservationIn, session: Db, actor: Operator) -> ReservationOut:
    return ReservationOut.of(
        service.add(
            session,
            body.name,
            region=body.region,
            hostname=body.hostname,
            port=body.port,
            protocol=body.protocol,
            expose_wan=body.expose_wan,
            actor=actor,
        )
    )


def _with_jobs(session: Db, rows: list[Reservation]) -> list[ReservationOut]:
    serving = service.serving_jobs(session, rows)
    return [ReservationOut.of(r, serving.get(r.id)) for r in rows]


@router.get("")
def list_reservations(session: Db, region: str | None = None) -> Page[ReservationOut]:
    return Page(items=_with_jobs(session, service.list_all(session, region)))


@router.get("/{ref}")
def show(ref: str, session: Db, region: str | None = None) -> ReservationOut:
    return _with_jobs(session, [service.get(session, ref, region)])[0]


@router.post("/{ref}/expose-wan")
def expose_wan(
    ref: str, body: ExposeWanIn, session: Db, actor: Operator, region: str | None = None
) -> ReservationOut:
    """Turn the router mapping on or off; the serving node applies it on its next heartbeat."""
    rsv = service.set_expose_wan(session, ref, expose_wan=body.expose_wan, region=region, actor=actor)
    return _with_jobs(session, [rsv])[0]


@router.delete("/{ref}")
def remove(ref: str, session: Db, actor: Operator, region: str | None = None) -> ReservationOut:
    return ReservationOut.of(service.remove(session, ref, region=region, actor=actor))


@router.post("/{ref}/assign")
def assign(
    ref: str, body: AssignIn, session: Db, actor: Operator, region: str | None = None
) -> ReservationOut:
    return ReservationOut.of(service.assign(session, ref, node=body.node, region=region, actor=actor))


@router.post("/{ref}/unassign")
def unassign(ref: str, session: Db, actor: Operator, region: str | None = None) -> ReservationOut:
    return ReservationOut.of(service.unassign(session, ref, region=region, actor=actor))


@router.get("/{ref}/history")
def history(ref: str, session: Db, region: str | None = None) -> Page[EventOut]:
    return Page(items=[EventOut.of(e) for e in service.history(session, ref, region)])
